"""``real rogue``: a hostile participant on a run's DDS domain (the attack: real/rogue_attack.py).

    real rogue --domain 7 --duration 60 [--key-file wrong.key] [--report out.json] [--flood RATE]

This module holds only the verb: real's CLI loads it at start, before the
transport's configuration is in place, so CycloneDDS must not load with it.
"""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    """The ``rogue`` subcommand of ``real``."""
    p = sub.add_parser("rogue", help="a hostile participant: joins a DDS domain and attacks the run on it",
                       description="A hostile participant on the run's DDS domain, for the time it runs: "
                                   "updates in each client's name sealed with a wrong key or none, replays of "
                                   "honest updates (in their round and the next), forged commands and models, "
                                   "and with --flood random well-formed frames on every topic. It prints (and "
                                   "with --report writes) what it published, to check none of it was accepted.")
    p.add_argument("--domain", type=int, required=True, help="the DDS domain of the run to attack")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to keep attacking (default: 60)")
    p.add_argument("--clients", type=int, default=2, help="how many clients to impersonate (client1..N; default: 2)")
    p.add_argument("--key-file", help="the (wrong) key to sign forgeries with; default: a random one")
    p.add_argument("--dim", type=int, default=None, help="model size (default: learnt from the first model)")
    p.add_argument("--report", help="write what was published here (JSON)")
    p.add_argument("--flood", type=float, default=0.0, metavar="RATE",
                   help="also send RATE random well-formed samples a second on every topic and presence")


def main(args) -> int:
    import numpy as np

    from dtemu.real.rogue_attack import run

    key = open(args.key_file, "rb").read().strip() if args.key_file else np.random.default_rng().bytes(32)
    published = run(args.domain, args.duration, [f"client{i}" for i in range(1, args.clients + 1)], key, args.dim,
                    flood_rate=args.flood)
    text = json.dumps(published, sort_keys=True)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    return 0
