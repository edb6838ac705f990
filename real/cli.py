"""``real run SCENARIO --rank N``: real mode over CycloneDDS (not there yet)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("real: real mode over CycloneDDS is not implemented yet; use `emu run` meanwhile.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
