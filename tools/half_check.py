"""Every float32 bit pattern through core.wire.half.to_half against numpy's conversion.

    python -m tools.half_check        # about 6 minutes on 2 cores (256 chunks of 2^24 values)

Prints how many finite values (and infinities) convert differently (0 expected) and how many
NaNs do (their payload bits may differ: no decoder accepts a NaN), then the same for every half
through from_half.  docs/notebook/2026-11-24-19-geomx-issue-11-part-7-the-shipped-scenarios-at-1200-rounds-f.md, "GeoMX (issue 11), part 7".
"""

from __future__ import annotations

import sys
import time

import numpy as np

from dtemu.core.wire.half import from_half, to_half


def main() -> int:
    t0 = time.perf_counter()
    finite_diffs = nan_diffs = 0
    for chunk in range(256):
        bits = (np.arange(1 << 24, dtype=np.uint64) + (chunk << 24)).astype(np.uint32)
        values = bits.view(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            want = values.astype("<f2").view(np.uint16)
        differ = to_half(values).view(np.uint16) != want
        nan = np.isnan(values[differ])
        finite_diffs += int((~nan).sum())
        nan_diffs += int(nan.sum())
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view("<f2")
    up = from_half(halves.tobytes()).view(np.uint32) != halves.astype(np.float32).view(np.uint32)
    print(f"float32 -> half: {finite_diffs} non-NaN values differ, {nan_diffs} NaNs differ "
          f"({time.perf_counter() - t0:.0f} s)")
    print(f"half -> float32: {int((up & ~np.isnan(halves)).sum())} non-NaN values differ, "
          f"{int((up & np.isnan(halves)).sum())} NaNs differ")
    return 0 if finite_diffs == 0 and not (up & ~np.isnan(halves)).any() else 1


if __name__ == "__main__":
    sys.exit(main())
