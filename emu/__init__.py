# dtemu.host first: it fixes torch's CPU arithmetic before torch loads (host.cpu_arith).
import dtemu.host  # noqa: F401
