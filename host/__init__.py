# Before anything of dtemu loads torch: its CPU kernels capped at AVX2, so a seed gives one
# model on any x86-64 host (host.cpu_arith says why and how to opt out).
from dtemu.host.cpu_arith import fix as _fix_cpu_arith

_fix_cpu_arith()
