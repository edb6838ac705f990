"""Every topic a role sends on, named once (the transport and the emulated network use these).

The FL names are the original system's; a topic's traffic is described by the
messages on it (``core.wire.messages``, ``core.ddp.collectives``).
"""

TRAIN_CMD = "train/train_cmd"  # controller -> clients: TrainCmd, Stop
CLIENT_UPDATE = "train/client_update"  # clients -> controller: ClientUpdate
MODEL_BLOB = "train/model_blob"  # controller -> clients: ModelBlob; the latest one is durable
COLL_FRAMES = "coll/frames"  # data-parallel workers: collective frames
GEO_PUSH = "geo/push"  # geo: toward the root (worker -> PS, local PS -> global PS, master's initial model)
GEO_PULL = "geo/pull"  # geo: away from the root (PS -> local PS, worker, master)

# fl.algorithm esync: its state server (core/esync; the names are mode ps's, which it was part of)
SS_STATE = "ps/state"  # clients and the controller -> state server: REPORT, QUERY, RESET, LEAVE, STOP
SS_REPLY = "ps/state_reply"  # state server -> one client: RESPONSE

# mode flower (core/flower): a Flower app's Messages, framed by core.flower.wire
FLOWER_INS = "flower/instruction"  # server -> one client: an instruction Message; Stop to all
FLOWER_RES = "flower/reply"  # clients -> server: reply Messages

ALL = (TRAIN_CMD, CLIENT_UPDATE, MODEL_BLOB, COLL_FRAMES, GEO_PUSH, GEO_PULL, SS_STATE, SS_REPLY, FLOWER_INS, FLOWER_RES)

# A late joiner gets the latest message of these topics (DDS TRANSIENT_LOCAL).
DURABLE_TOPICS = frozenset({MODEL_BLOB})
