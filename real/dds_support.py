"""What the transport needs of cyclonedds-python beyond its public API.

- one ``Domain`` (configuration) per domain id and process, shared by the
  transports of the process and deleted with the last;
- ``dds_write`` through ctypes, which releases the GIL while CycloneDDS blocks
  on flow control (the stock ``DataWriter.write`` holds it);
- ``wait_for_acks`` with its timeout read correctly (11.0.1 mis-reads it);
- the endpoints matched with a writer or a reader without 11.0.1's race (an
  endpoint matched while it asks raises IndexError).

``tests/test_dds_wire.py`` guards these against a change of cyclonedds.
"""

from __future__ import annotations

import ctypes as ct
import threading

from cyclonedds.core import DDSException
from cyclonedds.internal import dds_c_t
from cyclonedds.domain import Domain
from cyclonedds.pub import DataWriter
from cyclonedds.util import duration


# ---------------------------------------------------------------------------------------------
# Domains: one cyclonedds Domain (= configuration) per domain id and process

_domains_lock = threading.Lock()
_domains: dict[int, list] = {}  # domain_id -> [Domain, xml, refcount]


def _acquire_domain(domain_id: int, xml: str) -> None:
    with _domains_lock:
        ent = _domains.get(domain_id)
        if ent is not None:
            if ent[1] != xml:
                raise RuntimeError(f"DDS domain {domain_id} is already open in this process with another configuration")
            ent[2] += 1
            return
        try:
            dom = Domain(domain_id, xml)
        except DDSException as exc:
            raise RuntimeError(f"cannot create DDS domain {domain_id} (already created in this process "
                               f"without real.config, or a bad configuration?): {exc}") from exc
        _domains[domain_id] = [dom, xml, 1]


def _release_domain(domain_id: int) -> None:
    with _domains_lock:
        ent = _domains.get(domain_id)
        if ent is None:
            return
        ent[2] -= 1
        if ent[2] <= 0:
            del _domains[domain_id]
            _delete_entity(ent[0])


def _delete_entity(e) -> None:
    """dds_delete now (Entity.__del__ also unregisters it, so the later GC call is a no-op)."""
    if e is None:
        return
    try:
        e.__del__()
    except Exception:  # already gone
        pass


# ---------------------------------------------------------------------------------------------
# dds_write through ctypes (releases the GIL while CycloneDDS blocks)

class _SampleContainer(ct.Structure):  # cyclonedds-python's ddspy_sample_container_t
    _fields_ = [("usample", ct.c_void_p), ("usample_size", ct.c_size_t)]


def _load_dds_write():
    try:
        from cyclonedds.internal import DDS
        proto = ct.CFUNCTYPE(ct.c_int32, ct.c_int32, ct.POINTER(_SampleContainer))
        return proto(("dds_write", DDS._dll_handle))
    except Exception:  # pragma: no cover
        return None


_dds_write = _load_dds_write()


def _load_dds_write_ts():
    """``dds_write_ts``: a write whose source timestamp is given (a clock with an injected error)."""
    try:
        from cyclonedds.internal import DDS
        proto = ct.CFUNCTYPE(ct.c_int32, ct.c_int32, ct.POINTER(_SampleContainer), ct.c_int64)
        return proto(("dds_write_ts", DDS._dll_handle))
    except Exception:  # pragma: no cover
        return None


_dds_write_ts = _load_dds_write_ts()


def _wait_for_acks(writer: DataWriter, seconds: float) -> bool:
    """``DataWriter.wait_for_acks``, False on a timeout.

    cyclonedds-python 11.0.1 compares the C return code with a name that does
    not exist (``Exception.DDS_RETCODE_TIMEOUT``), so a timeout surfaces as an
    AttributeError; we call the C function and read its code ourselves.
    """
    ret = writer._wait_for_acks(writer._ref, duration(seconds=max(0.0, seconds)))
    if ret == 0:
        return True
    if ret == DDSException.DDS_RETCODE_TIMEOUT:
        return False
    raise DDSException(ret, f"while waiting for acks from {writer!r}")


def _matched_handles(entity) -> list[int]:
    """The instance handles of the endpoints matched with ``entity``: a writer's readers, a reader's
    writers.

    cyclonedds-python 11.0.1 sizes its buffer by one call and indexes it by the count a second
    call returns, so an endpoint matched in between (peers coming up) raises IndexError out of
    ``get_matched_subscriptions``.  The C function returns how many are matched, which may be more
    than the buffer holds: we grow the buffer and ask again.
    """
    get = entity._get_matched_subscriptions if isinstance(entity, DataWriter) else entity._get_matched_publications
    size = 16
    while True:
        buf = (dds_c_t.instance_handle * size)()
        ret = get(entity._ref, ct.cast(buf, ct.POINTER(dds_c_t.instance_handle)), size)
        if ret < 0:
            raise DDSException(ret, f"while listing the endpoints matched with {entity!r}")
        if ret <= size:
            return list(buf[:ret])
        size = ret
