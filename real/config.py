"""CycloneDDS configuration profiles for real mode (``real/config/*.xml``).

``config_xml(profile, peers=None)`` returns the XML text of a profile with its
``${...}`` fields filled in.  CycloneDDS 11.0.1 (Python) takes it through
``cyclonedds.domain.Domain(domain_id, config=xml)``, created before the first
``DomainParticipant(domain_id)`` of the process (``DomainParticipant`` itself has
no config argument in 11.0.1); the ``CYCLONEDDS_URI`` environment variable
would work too but is read once per process and is global, so the transport
does not use it.

Profiles:

``loopback``
    Every node on this machine; only 127.0.0.1, no multicast, unicast
    discovery to 127.0.0.1.  ``peers`` may only name loopback addresses.
``lan``
    Nodes on several hosts; multicast off, unicast discovery to ``peers`` or
    to ``DTEMU_DDS_PEERS`` (comma or space separated); interface from
    ``DTEMU_DDS_INTERFACE`` (default: CycloneDDS picks).  See the comment in
    ``real/config/lan.xml``.
a path to an ``.xml`` file
    Used as is, with the same ``${...}`` fields filled.

The XML files live in ``real/config/``, which must stay a plain directory (no
``__init__.py``): a package of that name would shadow this module.  Installs
that are not editable need them as package data (``real = ["config/*.xml"]``).

Environment (all optional): ``DTEMU_DDS_DELIVERY`` (lan: ``unicast``, the default, or
``multicast``: one copy per link to the readers on a segment), ``DTEMU_DDS_MAX_PARTICIPANTS`` (max participant
index, default 100), ``DTEMU_DDS_WHC_HIGH`` (writer history high-water mark;
default ``writer_history``'s per-mode choice), ``DTEMU_DDS_TRACE`` (trace file), ``DTEMU_DDS_TRACE_VERBOSITY``,
``DTEMU_DDS_SHM`` (``0``: no shared-memory pools beside DDS under ``loopback``, ``real.shm``),
``DTEMU_DDS_SHM_SLOTS`` (slots of 1 MiB per pool, default 4).
"""

import ipaddress
import os
import re
from pathlib import Path
from string import Template
from typing import Iterable, Optional
from xml.sax.saxutils import quoteattr

from dtemu.host.writer_history import _whc_high

CONFIG_DIR = Path(__file__).resolve().parent / "config"
PROFILES = ("loopback", "lan")
# Writer history high-water mark: 2 frames in flight per writer.  More did not speed up one
# sender and overflowed the receiver's socket buffer when several clients sent at once.
DEFAULT_MAX_PARTICIPANTS = 100  # ports: 7410 + 2*index must stay below the next domain's 7400 + 250

_HOST_RE = re.compile(r"^[A-Za-z0-9._\-:\[\]%]+$")


def split_peers(peers) -> list[str]:
    if peers is None:
        return []
    if isinstance(peers, str):
        peers = re.split(r"[,\s]+", peers)
    out = []
    for p in peers:
        p = str(p).strip()
        if not p:
            continue
        if not _HOST_RE.match(p):
            raise ValueError(f"not a host name or address: {p!r}")
        out.append(p)
    return out


def _is_loopback(host: str) -> bool:
    h = host
    if h.startswith("[") and "]" in h:  # [::1]:port
        h = h[1:h.index("]")]
    elif h.count(":") == 1:  # a.b.c.d:port
        h = h.split(":", 1)[0]
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _tracing() -> str:
    path = os.environ.get("DTEMU_DDS_TRACE", "").strip()
    if not path:
        return ""
    verbosity = os.environ.get("DTEMU_DDS_TRACE_VERBOSITY", "config").strip() or "config"
    if not re.match(r"^[a-z]+$", verbosity):
        raise ValueError(f"bad DTEMU_DDS_TRACE_VERBOSITY: {verbosity!r}")
    esc = path.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"<Tracing><Verbosity>{verbosity}</Verbosity><OutputFile>{esc}</OutputFile></Tracing>"


def _delivery() -> str:
    """lan: AllowMulticast from DTEMU_DDS_DELIVERY (unicast, the default, or multicast)."""
    delivery = os.environ.get("DTEMU_DDS_DELIVERY", "unicast").strip() or "unicast"
    if delivery not in ("unicast", "multicast"):
        raise ValueError(f"DTEMU_DDS_DELIVERY must be unicast or multicast, got {delivery!r}")
    return "true" if delivery == "multicast" else "false"


def config_xml(profile: str = "loopback", peers: Optional[Iterable[str] | str] = None, *,
               whc_high: Optional[str] = None, max_participants: Optional[int] = None) -> str:
    """The CycloneDDS XML configuration of ``profile`` ("loopback", "lan" or an .xml path)."""
    if profile in PROFILES:
        path = CONFIG_DIR / f"{profile}.xml"
    else:
        path = Path(profile)
        if path.suffix != ".xml" or not path.is_file():
            raise ValueError(f"unknown DDS profile {profile!r}: use one of {PROFILES} or an .xml file")
    text = path.read_text(encoding="utf-8")

    whc = _whc_high(whc_high)
    maxp = int(max_participants or os.environ.get("DTEMU_DDS_MAX_PARTICIPANTS") or DEFAULT_MAX_PARTICIPANTS)
    if not 0 < maxp <= 119:
        raise ValueError("max_participants must be in 1..119")

    peer_list = split_peers(peers)
    if profile == "loopback":
        bad = [p for p in peer_list if not _is_loopback(p)]
        if bad:
            raise ValueError(f"the loopback profile only talks to 127.0.0.1; not loopback: {bad}")
        peer_list = peer_list or ["127.0.0.1"]
    elif profile == "lan" and not peer_list:
        peer_list = split_peers(os.environ.get("DTEMU_DDS_PEERS", ""))
        if not peer_list:
            raise ValueError("the lan profile needs peers: pass peers=[...] or set DTEMU_DDS_PEERS")

    iface = os.environ.get("DTEMU_DDS_INTERFACE", "").strip()
    if not iface:
        iface_xml = '<NetworkInterface autodetermine="true"/>'
    else:
        try:
            ipaddress.ip_address(iface)
            iface_xml = f"<NetworkInterface address={quoteattr(iface)}/>"
        except ValueError:
            if not _HOST_RE.match(iface):
                raise ValueError(f"bad DTEMU_DDS_INTERFACE {iface!r}") from None
            iface_xml = f"<NetworkInterface name={quoteattr(iface)}/>"

    fields = {
        "peers": "\n        ".join(f"<Peer address={quoteattr(p)}/>" for p in peer_list),
        "interface": iface_xml,
        "whc_high": whc,
        "max_participant_index": str(maxp),
        "tracing": _tracing(),
        "allow_multicast": _delivery(),
    }
    xml = Template(text).safe_substitute(fields)
    if xml.startswith("<?xml"):  # keep only the document element
        xml = xml[xml.index("?>") + 2:].lstrip()
    xml.encode("ascii")  # cyclonedds passes the string as ASCII: fail here, not in C
    return xml
