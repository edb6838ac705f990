"""ESync's state server: the node fl.algorithm esync brings (core.fl.esync is the clients' and the
controller's side of it)."""
