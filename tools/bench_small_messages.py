"""What one small message costs in CPU over DDS on loopback, on each side: the floor under the
state server's round trip (docs/notebook/2026-11-23-09-esync-issue-10.md, "The state server's answer time").

    python -m tools.bench_small_messages [--messages 10000] [--gap-ms 0.3] [--bytes 48] [--domain D]

One writer (this process) sends ``--messages`` messages of ``--bytes`` bytes to one reader
process, one every ``--gap-ms`` (so that each travels alone, as a query or an answer does),
three times: the reader's receive thread taking them and handing them to the thread in
``recv`` (as every topic but ``CALLER_TAKES``); that thread taking them itself
(``caller_takes``); and, the floor of any Python reader of this binding, a loop that only
waits on the reader's WaitSet and takes the samples (no decoding, checks or queues).
Prints, per message:

- writer: CPU of ``DdsTransport.send`` and of its ``dds_write`` alone (the thread's time,
  user + system: CycloneDDS serializes, queues and ``sendmsg``s the sample in the caller's thread);
- reader: the whole process's CPU, and of it the thread in ``recv`` (user, system, context
  switches); the rest is CycloneDDS's receive thread and, in the first mode, ours.

Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from dtemu.real.message_costs import write

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=10000)
    p.add_argument("--bytes", type=int, default=48)
    p.add_argument("--gap-ms", type=float, default=0.3)
    p.add_argument("--domain", type=int, default=170 + os.getpid() % 30)
    args = p.parse_args()
    rows = {}
    labels = {"thread": "receive thread", "caller": "caller takes", "bare": "bare wait+take"}
    for mode in labels:
        rx = subprocess.Popen([sys.executable, "-m", "dtemu.real.message_costs", "--read", mode, "--domain",
                               str(args.domain), "--messages", str(args.messages)], stdout=subprocess.PIPE, text=True)
        try:
            if rx.stdout.readline().strip() != "ready":
                raise RuntimeError("the reader failed to start")
            wrote = write(args.domain, args.messages, args.bytes, args.gap_ms / 1000)
            rows[mode] = {**wrote, **json.loads(rx.communicate(timeout=120)[0].strip().splitlines()[-1])}
        finally:
            if rx.poll() is None:
                rx.kill()
        r = rows[mode]
        print(f"{labels[mode]:15s} writer: send {r['send_us']} us "
              f"(dds_write {r['dds_write_us']}); reader: process {r['process_us']} us, of which the thread in "
              f"recv {r['caller_user_us']} user + {r['caller_sys_us']} system, {r['caller_switches']} context "
              f"switches ({r['messages']} messages of {args.bytes} B, {args.gap_ms} ms apart)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
