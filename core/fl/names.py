"""FL's node names and the protocol points its nodes can crash at (faults.crashes), apart from
the roles so that the scenario and the mode (core.modes.fl) name them without importing a role."""

CONTROLLER = "controller"
# The node a rule with a state server brings (esync), after the clients (core.fl.esync).
STATE_SERVER_NODE = "ss"
CLIENT_CRASH_POINTS = ("before_train", "during_train", "mid_upload", "after_upload")
CONTROLLER_CRASH_POINTS = ("mid_round", "before_checkpoint", "after_checkpoint")
