"""What sealing costs: bytes per message and time to seal + open, by message size.

    python -m tools.bench_auth

Sizes: a TrainCmd, a small_cnn fp32 update, a mnist_cnn sq8 update, a mnist_cnn
fp32 update (the ModelBlob is the same size).
"""

from __future__ import annotations

import statistics
import time

from dtemu.core.wire.auth import Sealer

SIZES = {"TrainCmd (34 B)": 34, "small_cnn fp32 update": 73_600, "mnist_cnn sq8 update": 600_000,
         "mnist_cnn fp32 update": 4_799_600}


def main() -> None:
    key = bytes(range(32))
    print(f"{'message':24} {'bytes':>10} {'+bytes':>7} {'seal ms':>8} {'open ms':>8}")
    for name, n in SIZES.items():
        data = bytes(n)
        tx, seal_t, open_t = Sealer(key, "client1", 1), [], []
        for _ in range(20):
            rx = Sealer(key, "controller")
            t0 = time.perf_counter()
            sealed = tx.seal("train/client_update", 3, data)
            t1 = time.perf_counter()
            rx.open("train/client_update", "client1", sealed)
            t2 = time.perf_counter()
            seal_t.append(t1 - t0)
            open_t.append(t2 - t1)
        print(f"{name:24} {n:>10} {len(sealed) - n:>7} {statistics.median(seal_t) * 1e3:>8.2f} "
              f"{statistics.median(open_t) * 1e3:>8.2f}")


if __name__ == "__main__":
    main()
