"""Does DDS's reliability protocol cost the state server's small messages their CPU?  Reliable
against best-effort, the CPU of one 48-byte message with a bare cyclonedds-python writer and
reader (no transport of ours), one message every 0.3 ms so that each travels alone, on loopback:

    python -m tools.bench_best_effort [--messages 5000]

Prints, per QoS and twice each: the writer thread's CPU per ``write`` and the reader process's
CPU per message taken (docs/notebook/2026-11-23-09-esync-issue-10.md, "The state server's answer time").  Loopback only.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from cyclonedds.core import InstanceState, Policy, Qos, ReadCondition, SampleState, ViewState, WaitSet
from cyclonedds.domain import Domain, DomainParticipant
from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import sequence, uint8
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from dtemu.real.config import config_xml

QOS = ("reliable", "best_effort")


@dataclass
class Blob(IdlStruct, typename="Blob"):
    data: sequence[uint8]


def qos(kind: str) -> Qos:
    reliability = Policy.Reliability.Reliable(duration(seconds=1)) if kind == "reliable" \
        else Policy.Reliability.BestEffort
    return Qos(reliability, Policy.History.KeepLast(64))


def side(kind: str, role: str, n: int, domain_id: int) -> None:
    domain = Domain(domain_id, config_xml("loopback"))  # noqa: F841 (kept open for the participant)
    dp = DomainParticipant(domain_id)
    topic = Topic(dp, "bench_best_effort", Blob)
    if role == "rx":
        reader = DataReader(dp, topic, qos=qos(kind))
        ws = WaitSet(dp)
        ws.attach(ReadCondition(reader, SampleState.Any | ViewState.Any | InstanceState.Any))
        print("ready", flush=True)
        got, first, cpu0 = 0, 0, None
        while got < n and ws.wait(duration(seconds=5)):
            samples = reader.take(N=64)
            if cpu0 is None:   # the first take starts the clock
                cpu0, first = time.process_time(), len(samples)
            got += len(samples)
        cpu = time.process_time() - cpu0
        print(json.dumps({"taken": got, "reader_us": round(1e6 * cpu / max(1, got - first), 1)}), flush=True)
        return
    writer = DataWriter(dp, topic, qos=qos(kind))
    time.sleep(1.5)   # discovery
    blob, cpu = Blob(list(os.urandom(48))), 0.0
    for _ in range(n):
        c = time.thread_time()
        writer.write(blob)
        cpu += time.thread_time() - c
        time.sleep(0.0003)
    print(json.dumps({"writer_us": round(1e6 * cpu / n, 1)}), flush=True)
    time.sleep(1)   # let a reliable reader have the last ones


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--side", nargs=3, help=argparse.SUPPRESS)   # QOS rx|tx DOMAIN
    args = p.parse_args()
    if args.side:
        side(args.side[0], args.side[1], args.messages, int(args.side[2]))
        return 0
    domain = str(150 + os.getpid() % 20)
    for kind in QOS * 2:
        cmd = [sys.executable, "-m", "tools.bench_best_effort", "--messages", str(args.messages), "--side", kind]
        rx = subprocess.Popen([*cmd, "rx", domain], stdout=subprocess.PIPE, text=True)
        try:
            if rx.stdout.readline().strip() != "ready":
                raise RuntimeError("the reader failed to start")
            tx = subprocess.run([*cmd, "tx", domain], capture_output=True, text=True, timeout=120, check=True)
            print(f"{kind:12s} {tx.stdout.strip()} {rx.communicate(timeout=60)[0].strip()}", flush=True)
        finally:
            if rx.poll() is None:
                rx.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
