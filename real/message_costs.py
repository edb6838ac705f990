"""What a message costs in CPU over DDS on loopback, on each side, per message and per MB (``emu
calibrate`` sets ``compute.default.send_s_per_message``, ``recv_s_per_message``, ``send_s_per_mb`` and
``recv_s_per_mb`` from it; tools.bench_small_messages prints the first two for three ways of reading).

One writer (this process) sends messages to one reader process, one every ``gap_ms`` (so that each
travels alone): first messages of a few bytes, as a query or an answer is, then messages of a few MB,
as a model is.  The writer's cost is the CPU of ``DdsTransport.send`` (the framing, and CycloneDDS
serializing, queueing and sending the sample in the caller's thread); the reader's is the whole reader
process's CPU per message (its receive thread, the reassembly, the hand-off, the thread in ``recv``).
A message's cost is the small one's, whatever its size, plus its MB times the large one's excess per
MB.  The reader's per MB leaves out the copy that emu's decoding costs already hold (emu.costs: "one
copy as the transport's reassembly"), timed in the reader on what it received.  Loopback only: what a
message costs a machine's CPU, not the network.  CPU seconds: a caller under a CPU share divides them
by it (emu.calibrate), as its machine's other work is timed in wall seconds under the share.

Two paths, as real runs take them (``--path``): ``shm``, the loopback profile, whose large payloads go
beside DDS through shared memory (real.shm: one machine, unsealed); ``dds``, the lan profile to
127.0.0.1, every byte through CycloneDDS and the kernel's UDP path, as ranks on the testbed's machines
(real launch --machines) or on several hosts send.  A MB costs the reader 4x as much CPU on the second
(1.35 against 0.31 ms, notebook entry 39): a machine's messages priced on the first left a geo site's
PS a third of the CPU it spent.  ``stream``: the lan profile with its large payloads on the TCP stream
beside DDS (``DTEMU_DDS_STREAM=1``, real.stream); its writer's cost is its whole process's CPU, as zmq's
I/O thread writes the frames (a send's caller only queues them).

    python -m dtemu.real.message_costs --read thread|caller|bare --domain D --messages N [--path P]  (the reader)
    python -m dtemu.real.message_costs --measure [--path shm|dds]   (both sides; prints {"send": s,
        "recv": s, "send_per_mb": s, "recv_per_mb": s} as JSON)

It lives in real/ because it runs real's transport; ``emu calibrate`` runs it as a command and reads
its JSON, so that emu imports nothing of real.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from dtemu.core.wire.topics import TRAIN_CMD


def _rusage() -> tuple:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return (r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw)


# The transport's profile and peers for each path (``--path``)
PATHS = {"shm": {"profile": "loopback"}, "dds": {"profile": "lan", "peers": ["127.0.0.1"]},
         "stream": {"profile": "lan", "peers": ["127.0.0.1"]}}
# Paths whose large payloads leave the caller's thread: a send's CPU is its whole process's (zmq's I/O
# thread writes the stream's frames; on a DDP run it took 1.0 s of a rank's 8.2, notebook entry 43)
PROCESS_WIDE = ("stream",)


def _transport(node: str, domain: int, path: str, **kw):
    """A DdsTransport of ``path`` on 127.0.0.1 alone (the lan profile's interface set to it)."""
    from dtemu.real.transport import DdsTransport

    settings = {"DTEMU_DDS_INTERFACE": "127.0.0.1" if path != "shm" else None,   # nothing leaves this box
                "DTEMU_DDS_STREAM": "1" if path == "stream" else "0"}              # (read while it starts)
    before = {k: os.environ.get(k) for k in settings}
    for k, v in settings.items():
        if v is not None:
            os.environ[k] = v
    try:
        return DdsTransport(node, domain_id=domain, **PATHS[path], **kw)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read(domain: int, n: int, mode: str, path: str = "shm") -> None:
    kw = {"caller_takes": (TRAIN_CMD,)} if mode != "thread" else {}
    with _transport("rx", domain, path, subscribe=[TRAIN_CMD], **kw) as t:
        print("ready", flush=True)
        recv = _bare_recv(t) if mode == "bare" else (lambda: t.recv([TRAIN_CMD], timeout_s=10))
        if recv() is None:  # the first one starts the clocks
            raise RuntimeError("no message")
        cpu, ru, got, last = time.process_time(), _rusage(), 0, None
        while got < n - 1:
            msg = recv()
            if msg is None:
                break
            last, got = msg, got + 1
        cpu, ru = time.process_time() - cpu, [b - a for a, b in zip(ru, _rusage())]
    copy_us = 0.0
    if last is not None and hasattr(last, "data"):   # the copy emu's decoding costs hold (emu.costs)
        c = time.process_time()
        for _ in range(5):
            bytes(bytearray(last.data))
        copy_us = 1e6 * (time.process_time() - c) / 5
    print(json.dumps({"messages": got, "process_us": round(1e6 * cpu / got, 1), "copy_us": round(copy_us, 1),
                      "caller_user_us": round(1e6 * ru[0] / got, 1), "caller_sys_us": round(1e6 * ru[1] / got, 1),
                      "caller_switches": round((ru[2] + ru[3]) / got, 2)}), flush=True)


def _bare_recv(t):
    """Wait on the caller's WaitSet and take one sample: what is left without the transport's work."""
    from cyclonedds.util import duration

    from dtemu.real.receiving import _ANY_STATE, _ddspy_take

    refs, held = [r._ref for _, r in t._caller_readers], []

    def recv():
        while not held:
            if not t._caller_ws.wait(duration(seconds=10)):
                return None
            for ref in refs:
                held.extend(_ddspy_take(ref, _ANY_STATE, 4096))
        return held.pop()
    return recv


def write(domain: int, n: int, size: int, gap_s: float, path: str = "shm") -> dict:
    with _transport("tx", domain, path) as t:
        if t.wait_matched({TRAIN_CMD: ["rx"]}, timeout_s=60):
            raise RuntimeError("the reader never matched")
        write_cpu = [0.0]
        plain = t._write

        def timed_write(w, ser):  # dds_write alone
            c = time.thread_time()
            plain(w, ser)
            write_cpu[0] += time.thread_time() - c

        t._write = timed_write
        payload, send_cpu = os.urandom(size), 0.0
        # (the gap is inside the timing: a thread's clock stands still while it sleeps, and a process's
        # counts what its other threads send meanwhile)
        clock = time.process_time if path in PROCESS_WIDE else time.thread_time
        for _ in range(n):
            c = clock()
            t.send(TRAIN_CMD, payload, to="rx")
            time.sleep(gap_s)
            send_cpu += clock() - c
        t.flush(timeout_s=10)
    return {"send_us": round(1e6 * send_cpu / n, 1), "dds_write_us": round(1e6 * write_cpu[0] / n, 1)}


LARGE_BYTES = 4 << 20   # a model's size (mnist_cnn's fp32 is 4.8 MB): past the writer history (2 MiB)
LARGE_MESSAGES = 16
LARGE_GAP_MS = 60.0     # each one alone, past its acknowledgements


def message_costs(messages: int = 2000, gap_ms: float = 0.3, size: int = 48, path: str = "shm") -> dict[str, float]:
    """Seconds of CPU per message, whatever its size (``send``, ``recv``), and per MB (1e6 bytes) of one
    (``send_per_mb``, ``recv_per_mb``): the writer's ``send`` and the reader process (its receive
    thread, the reassembly, the hand-off, the thread in ``recv``), over ``path`` on loopback."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, got {path!r}")
    small_tx, small_rx = _exchange(messages, size, gap_ms, path)
    large_tx, large_rx = _exchange(LARGE_MESSAGES, LARGE_BYTES, LARGE_GAP_MS, path)
    mb = LARGE_BYTES / 1e6
    return {"send": small_tx["send_us"] * 1e-6, "recv": small_rx["process_us"] * 1e-6,
            "send_per_mb": max(0.0, large_tx["send_us"] - small_tx["send_us"]) / mb * 1e-6,
            "recv_per_mb": max(0.0, large_rx["process_us"] - small_rx["process_us"] - large_rx["copy_us"]) / mb * 1e-6}


def _exchange(messages: int, size: int, gap_ms: float, path: str = "shm") -> tuple[dict, dict]:
    """(the writer's, the reader's) figures for ``messages`` of ``size`` bytes, one every ``gap_ms``."""
    domain = 140 + os.getpid() % 30
    rx = subprocess.Popen([sys.executable, "-m", "dtemu.real.message_costs", "--read", "thread", "--domain",
                           str(domain), "--messages", str(messages), "--path", path],
                          stdout=subprocess.PIPE, text=True)
    try:
        if rx.stdout.readline().strip() != "ready":
            raise RuntimeError("the reader failed to start")
        wrote = write(domain, messages, size, gap_ms / 1000, path)
        read = json.loads(rx.communicate(timeout=120)[0].strip().splitlines()[-1])
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    return wrote, read


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m dtemu.real.message_costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--measure", action="store_true", help="measure both sides; print their seconds as JSON")
    p.add_argument("--read", choices=("thread", "caller", "bare"))
    p.add_argument("--domain", type=int)
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--path", choices=sorted(PATHS), default="shm",
                   help="shm: the loopback profile, large payloads beside DDS (one machine, unsealed); "
                        "dds: the lan profile, every byte through DDS (the testbed's machines, several hosts); "
                        "stream: the lan profile, large payloads on the TCP stream beside DDS (DTEMU_DDS_STREAM=1)")
    args = p.parse_args()
    if args.measure:
        print(json.dumps(message_costs(args.messages, path=args.path)), flush=True)
    elif args.read and args.domain is not None:
        read(args.domain, args.messages, args.read, args.path)
    else:
        p.error("give --measure, or --read and --domain")
    return 0


if __name__ == "__main__":
    sys.exit(main())
