"""How fast real mode's DDS moves bulk bytes from one writer to K readers on testbed machines.

    sudo python -m tools.dds_bulk [--readers K] [--share CPUS] [--mbps R] [--messages N] [--bytes B]
                                  [--sealed] [--repeat M]

Each node is a machine of ``real launch --machines netns`` (real.machines: a namespace behind a link
shaped to R Mbit/s both ways, a CPU share); the writer sends N messages of B bytes on the model's
topic (to its one reader, or to all as one broadcast) through ``DdsTransport`` with the ``lan``
profile, as a controller sends a model.  Printed, one JSON line a run:

- ``s``: from the first send to the last reader's last message; ``wire_s``: what the link needs for
  the bytes as they travel (emu.wire_model: frames, fragments, headers);
- ``sent_mb`` against ``needed_mb``: what the writer's link carried (its qdisc's counter) against
  what the messages take on the wire; the difference is sent twice (a reader's NACK).

It measures the testbed's transport, not a scenario: docs/notebook entry 34 has what it found.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

TOPIC = "train/model_blob"


def _reader(name: str, domain: int, peers: str, count: int, key: bytes | None) -> None:
    from dtemu.real.transport import DdsTransport

    with DdsTransport(name, profile="lan", peers=peers, domain_id=domain, subscribe=[TOPIC], key=key) as t:
        print("ready", flush=True)
        got = 0
        while got < count and t.recv([TOPIC], timeout_s=120) is not None:
            got += 1
        print(json.dumps({"got": got, "end": time.time()}), flush=True)


def _writer(domain: int, peers: str, readers: list[str], count: int, size: int, key: bytes | None) -> None:
    from dtemu.real.transport import DdsTransport

    with DdsTransport("writer", profile="lan", peers=peers, domain_id=domain, key=key) as t:
        if t.wait_matched({TOPIC: readers}, timeout_s=60):
            raise RuntimeError("the readers never matched")
        time.sleep(1.0)   # discovery's own traffic done
        payload = os.urandom(size)
        start = time.time()
        for _ in range(count):
            t.send(TOPIC, payload, to=readers[0] if len(readers) == 1 else None)
        t.flush(timeout_s=120)
        print(json.dumps({"start": start}), flush=True)
        time.sleep(2.0)   # the last acks


def _sent_bytes(ns: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


def run_once(readers: int, share: float, mbps: float, count: int, size: int, sealed: bool) -> dict:
    from dtemu.core.runtime.machine_plan import Plan
    from dtemu.core.runtime.network_spec import LinkSpec
    from dtemu.emu.wire_model import wire_bytes
    from dtemu.real.machines import Machines

    names = ["writer"] + [f"reader{i}" for i in range(1, readers + 1)]
    link = LinkSpec(up_mbps=mbps, down_mbps=mbps, latency_ms=0.0, loss=0.0)
    plan = Plan(machines=names, of_node={n: i for i, n in enumerate(names)}, links=[link] * len(names),
                cpus=[share] * len(names), scale=1.0)
    key = ["--key"] if sealed else []
    domain = 60 + os.getpid() % 30
    with Machines(plan) as m:
        env = {**os.environ, **m.env(), "OMP_WAIT_POLICY": "PASSIVE"}

        def start(node, *args):
            return subprocess.Popen(m.command(node, [sys.executable, "-m", "tools.dds_bulk", "--as", node, "--domain",
                                                     str(domain), "--peers", m.peers(node), "--messages", str(count),
                                                     "--bytes", str(size), *key, *args]),
                                    stdout=subprocess.PIPE, text=True, env=env, preexec_fn=m.preexec(node))

        rs = [start(n) for n in names[1:]]
        for r in rs:
            if r.stdout.readline().strip() != "ready":
                raise RuntimeError("a reader failed to start")
        before = _sent_bytes(m.net.names[0])
        w = start("writer", "--readers", ",".join(names[1:]))
        wrote = json.loads(w.communicate(timeout=600)[0].strip().splitlines()[-1])
        sent = _sent_bytes(m.net.names[0]) - before
        ends = [json.loads(r.communicate(timeout=120)[0].strip().splitlines()[-1]) for r in rs]
    needed = wire_bytes(size, 1500) * count * readers
    return {"readers": readers, "share": share, "mbps": mbps, "messages": count, "bytes": size, "sealed": sealed,
            "got": min(e["got"] for e in ends), "s": round(max(e["end"] for e in ends) - wrote["start"], 3),
            "wire_s": round(needed * 8 / (mbps * 1e6), 3), "sent_mb": round(sent / 1e6, 2),
            "needed_mb": round(needed / 1e6, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dds_bulk", description=__doc__.split("\n\n")[0])
    p.add_argument("--readers", default="4", help="how many readers (default 4; with --as writer: their names)")
    p.add_argument("--share", type=float, default=0.32, help="each machine's CPUs (default 0.32)")
    p.add_argument("--mbps", type=float, default=100.0)
    p.add_argument("--messages", type=int, default=4)
    p.add_argument("--bytes", type=int, default=4_800_000)
    p.add_argument("--sealed", action="store_true", help="seal every frame under a key")
    p.add_argument("--repeat", type=int, default=3)
    # (one end of a run: a process on a machine)
    p.add_argument("--as", dest="role", help=argparse.SUPPRESS)
    p.add_argument("--domain", type=int, help=argparse.SUPPRESS)
    p.add_argument("--peers", help=argparse.SUPPRESS)
    p.add_argument("--key", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role:
        key = b"k" * 32 if args.key else None
        if args.role == "writer":
            _writer(args.domain, args.peers, args.readers.split(","), args.messages, args.bytes, key)
        else:
            _reader(args.role, args.domain, args.peers, args.messages, key)
        return 0
    if os.geteuid() != 0:
        print("tools.dds_bulk: makes testbed machines: needs root", file=sys.stderr)
        return 2
    for _ in range(args.repeat):
        print(json.dumps(run_once(int(args.readers), args.share, args.mbps, args.messages, args.bytes, args.sealed)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
