"""CycloneDDS transport benchmark: two processes on loopback.

    python -m tools.bench_dds [--size 4800000] [--repeat 10] [--pings 200] [--domain N]
                              [--sizes 65536,1048576,16777216] [--no-serializer] [--stock]

Starts an echo process (``--role echo``) and, from this one:

* throughput: sends one message of ``--size`` bytes (default 4.8 MB, the
  1.2M-parameter float32 model) ``--repeat`` times on ``coll/frames``; the echo
  answers each with a small ack carrying the moment it had the whole message.
  Both processes read the same CLOCK_MONOTONIC (same machine), so "one-way" is
  echo's completion time minus our send start; "with ack" also includes the
  small reply.  MB/s = size / one-way time.
* latency: ``--pings`` round trips of a 64-byte message (train/train_cmd ->
  train/client_update).
* the frame serializer: fast path vs the stock cyclonedds serializer
  (``--stock`` also times the stock one on 16 MiB: ~seconds and ~1 GB of RAM).

Everything stays on 127.0.0.1 (profile "loopback").  Prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import subprocess
import sys
import time

from dtemu.core.wire.topics import CLIENT_UPDATE, COLL_FRAMES, TRAIN_CMD
from dtemu.real.transport import DdsTransport
from dtemu.real.wire import Frame, decode_frame, encode_frame

WARMUP = 3
ACK = struct.Struct("<dQ")  # echo's received_at (monotonic), bytes received


def _echo(domain: int, lifetime_s: float) -> int:
    end = time.monotonic() + lifetime_s
    with DdsTransport("bench-echo", domain_id=domain, subscribe=[TRAIN_CMD, COLL_FRAMES]) as t:
        while time.monotonic() < end:
            m = t.recv(timeout_s=1.0)
            if m is None:
                continue
            if m.topic == TRAIN_CMD:
                if m.data == b"stop":
                    break
                t.send(CLIENT_UPDATE, m.data, to=m.src)
            else:
                t.send(CLIENT_UPDATE, ACK.pack(m.received_at, len(m.data)), to=m.src)
    return 0


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def _serializer_rows(stock: bool):
    rows = []
    for size in (1 << 20, 16 << 20):
        payload = os.urandom(size)
        f = Frame(src="bench", dst="", topic=COLL_FRAMES, msg_id=1, part=0, parts=1, total=size, payload=payload)
        t0 = time.perf_counter(); ser = encode_frame(f); t_ser = time.perf_counter() - t0
        t0 = time.perf_counter(); decode_frame(ser, copy=True); t_de = time.perf_counter() - t0
        t0 = time.perf_counter(); decode_frame(ser, copy=False); t_de0 = time.perf_counter() - t0
        rows.append((f"fast serialize {size >> 20} MiB", t_ser))
        rows.append((f"fast deserialize {size >> 20} MiB (copy)", t_de))
        rows.append((f"fast deserialize {size >> 20} MiB (zero-copy)", t_de0))
        if size == 1 << 20 or stock:
            t0 = time.perf_counter(); sser = Frame.__idl__.serialize(f); t_sser = time.perf_counter() - t0
            t0 = time.perf_counter(); Frame.__idl__.deserialize(sser); t_sde = time.perf_counter() - t0
            assert sser == ser, "fast path and stock serializer disagree"
            rows.append((f"stock serialize {size >> 20} MiB", t_sser))
            rows.append((f"stock deserialize {size >> 20} MiB", t_sde))
        del payload, ser
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["main", "echo"], default="main")
    ap.add_argument("--domain", type=int, default=None)
    ap.add_argument("--size", type=int, default=4_800_000)
    ap.add_argument("--sizes", default="65536,1048576,16777216", help="more message sizes for the throughput table")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--pings", type=int, default=200)
    ap.add_argument("--lifetime", type=float, default=300.0, help="echo process gives up after this many seconds")
    ap.add_argument("--no-serializer", action="store_true")
    ap.add_argument("--stock", action="store_true", help="also time the stock serializer on 16 MiB")
    a = ap.parse_args(argv)
    domain = a.domain if a.domain is not None else 1 + os.getpid() % 200
    if a.role == "echo":
        return _echo(domain, a.lifetime)

    child = subprocess.Popen([sys.executable, "-m", "tools.bench_dds", "--role", "echo", "--domain", str(domain),
                              "--lifetime", str(a.lifetime)])
    try:
        with DdsTransport("bench-main", domain_id=domain, subscribe=[CLIENT_UPDATE]) as t:
            t0 = time.monotonic()
            missing = t.wait_matched({TRAIN_CMD: ["bench-echo"], COLL_FRAMES: ["bench-echo"]}, timeout_s=30)
            missing = missing or t.wait_matched({CLIENT_UPDATE: ["bench-echo"]}, timeout_s=30, role="writers")
            if missing:
                print(f"echo process not matched: {missing}", file=sys.stderr)
                return 1
            discovery = time.monotonic() - t0

            def ping(payload: bytes) -> float:
                s = time.monotonic()
                t.send(TRAIN_CMD, payload, to="bench-echo")
                m = t.recv([CLIENT_UPDATE], timeout_s=10)
                if m is None or m.data != payload:
                    raise RuntimeError("ping lost")
                return time.monotonic() - s

            for _ in range(10):  # warm up
                ping(b"w" * 64)
            rtts = [ping(os.urandom(64)) for _ in range(a.pings)]

            rows = []
            sizes = [a.size] + [int(x) for x in a.sizes.split(",") if x.strip()]
            for size in sizes:
                data = os.urandom(size)
                one_way, with_ack, send_call = [], [], []
                for i in range(a.repeat + WARMUP):
                    s = time.monotonic()
                    t.send(COLL_FRAMES, data, to="bench-echo")
                    sc = time.monotonic() - s
                    m = t.recv([CLIENT_UPDATE], timeout_s=30)
                    e = time.monotonic()
                    if m is None:
                        raise RuntimeError(f"no ack for a {size}-byte message")
                    got_at, nbytes = ACK.unpack(m.data)
                    if nbytes != size:
                        raise RuntimeError(f"echo got {nbytes} bytes, sent {size}")
                    if i < WARMUP:
                        continue  # warm-up (allocations, socket buffers, first acks)
                    one_way.append(got_at - s)
                    with_ack.append(e - s)
                    send_call.append(sc)
                rows.append((size, one_way, with_ack, send_call))
            t.send(TRAIN_CMD, b"stop", to="bench-echo")
            stats = dict(t.stats)
    finally:
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    print(f"\nCycloneDDS loopback, two processes, domain {domain}; discovery+matching {discovery * 1e3:.0f} ms\n")
    print(f"{'message':>12} | {'one-way med':>11} | {'MB/s med':>8} | {'MB/s best':>9} | {'+ack med':>9} | {'send() med':>10}")
    print("-" * 74)
    for size, ow, wa, sc in rows:
        med = statistics.median(ow)
        print(f"{size:>12,} | {med * 1e3:>8.2f} ms | {size / med / 1e6:>8.0f} | {size / min(ow) / 1e6:>9.0f} | "
              f"{statistics.median(wa) * 1e3:>6.2f} ms | {statistics.median(sc) * 1e3:>7.2f} ms")
    print(f"\nround trip, 64 B ({len(rtts)} pings): median {statistics.median(rtts) * 1e6:.0f} us, "
          f"p90 {_pct(rtts, 0.9) * 1e6:.0f} us, min {min(rtts) * 1e6:.0f} us")
    print(f"transport stats (main): malformed={stats['malformed']} errors={stats['errors']} "
          f"incomplete_dropped={stats['incomplete_dropped']}")
    if not a.no_serializer:
        print(f"\n{'frame serializer':<40} | time")
        print("-" * 56)
        for name, sec in _serializer_rows(a.stock):
            print(f"{name:<40} | {sec * 1e3:9.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
