"""Points of the protocols a role passes (``yield Point(name, round)``).

A crash of the scenario (``faults.crashes``) is planned relative to one of
them (``core.runtime.faults.CRASH_POINTS``), so renaming an event never moves
a crash: the roles name these points where they are.
"""

ROUND = "round"  # controller: a round is open, its command about to go out
AGGREGATED = "aggregated"  # controller: the round's model is made, not yet saved
CHECKPOINTED = "checkpointed"  # controller: the round is saved
TRAIN = "train"  # client: about to train for a round
UPLOAD = "upload"  # client: about to send its update
UPLOADED = "uploaded"  # client: its update has been sent

ALL = (ROUND, AGGREGATED, CHECKPOINTED, TRAIN, UPLOAD, UPLOADED)
