"""A real run's processes on the stand-in GPU (tests/fake_cuda.py): with this folder on PYTHONPATH and
DTEMU_FAKE_CUDA=1, every Python process installs it as it starts (tests/test_fake_gpu.py)."""

import os
import sys

if os.environ.get("DTEMU_FAKE_CUDA") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from dtemu.host import cpu_arith

    cpu_arith.fix()   # (before torch loads, as dtemu's own import does: the run keeps the CPU's arithmetic)
    from fake_cuda import install

    install()
