"""``real run SCENARIO`` without ``--rank`` or ``--peers``: the rank, the world and the peers from the
launcher a cluster already has.

- **torchrun** sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.  Every rank then
  meets at torch's own key-value store on ``MASTER_ADDR:MASTER_PORT`` (rank 0 serves it, as
  ``torch.distributed``'s env:// start does), writes the address it reaches the master from, and
  reads everyone's: those are its DDS peers.
- **SLURM** (``srun``) sets ``SLURM_PROCID``, ``SLURM_NTASKS`` and ``SLURM_NODELIST`` (a compressed
  host list, ``node[01-03,07],gpu5``): the peers are the list's hosts, resolved.

The rank's interface is the one its address belongs to (``DTEMU_DDS_INTERFACE``), the profile is
``lan``.  A world that is not the scenario's number of ranks is refused before anything starts.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

STORE_TIMEOUT_S = 120.0   # every rank has this long to reach the master's store and write its address
KEY = "dtemu/addr/{}"


class ClusterEnvError(ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    rank: int
    world: int
    peers: list[str]         # every rank's address (its own included: DDS discovers the others there)
    address: str | None      # this rank's own, for its interface (None: let CycloneDDS choose)
    launcher: str            # "torchrun" or "slurm"


def launcher_of(environ=os.environ) -> str | None:
    if all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        return "torchrun"
    if all(k in environ for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODELIST")):
        return "slurm"
    return None


def placement(environ=os.environ, store=None) -> Placement | None:
    """This process's place from its launcher's environment, or None where no launcher set one.
    ``store``: torch's TCPStore, or a stand-in with set and get (tests)."""
    which = launcher_of(environ)
    if which == "torchrun":
        rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
        master, port = environ["MASTER_ADDR"], _int(environ, "MASTER_PORT", 29500)
        own = address_towards(master, port)
        # Under torchrun's agent its store is already served there (the workers are its clients, as
        # torch.distributed's env:// start knows from TORCHELASTIC_USE_AGENT_STORE); else rank 0 serves it.
        serves = rank == 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
        store = store or _tcp_store(master, port, world, serves)
        store.set(KEY.format(rank), own)
        peers = []
        for r in range(world):
            value = store.get(KEY.format(r))   # (waits until rank r has written it)
            peers.append(value.decode() if isinstance(value, bytes) else str(value))
        return Placement(rank, world, peers, own, which)
    if which == "slurm":
        rank, world = _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_NTASKS")
        hosts = expand_hostlist(environ["SLURM_NODELIST"])
        peers = [_resolve(h) for h in hosts]
        own_host = environ.get("SLURMD_NODENAME")
        own = _resolve(own_host) if own_host else None
        return Placement(rank, world, peers, own, which)
    return None


def _int(environ, key: str, default: int | None = None) -> int:
    value = environ.get(key)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ClusterEnvError(f"{key}={value!r} is not a whole number") from None


def address_towards(host: str, port: int) -> str:
    """The local address this machine reaches ``host`` from (no packet is sent: a UDP connect only
    picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))
            return s.getsockname()[0]
        except OSError as err:
            raise ClusterEnvError(f"no route to MASTER_ADDR {host}: {err}") from None


def _tcp_store(master: str, port: int, world: int, is_master: bool):
    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        return TCPStore(master, port, world, is_master, timeout=timedelta(seconds=STORE_TIMEOUT_S))
    except Exception as err:  # (torch raises RuntimeError, DistStoreError, TimeoutError)
        raise ClusterEnvError(f"cannot meet at the master's store {master}:{port}: {err}") from None


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as err:
        raise ClusterEnvError(f"cannot resolve the host {host!r}: {err}") from None


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list as host names: ``a[01-03,7],b`` is a01, a02, a03, a7, b."""
    hosts: list[str] = []
    for part in _split_top(text.strip()):
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\](.*)", part)
        if not m:
            if part:
                hosts.append(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            mr = _RANGE.match(r.strip())
            if not mr:
                raise ClusterEnvError(f"SLURM_NODELIST {text!r}: bad range {r!r}")
            lo, hi = mr.group(1), mr.group(2) or mr.group(1)
            if int(hi) < int(lo) or int(hi) - int(lo) > 100_000:
                raise ClusterEnvError(f"SLURM_NODELIST {text!r}: bad range {r!r}")
            hosts += [f"{head}{n:0{len(lo)}d}{t}" for n in range(int(lo), int(hi) + 1) for t in expand_hostlist(tail) or [""]]
    return hosts


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts
