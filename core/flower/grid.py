"""The Grid a ServerApp is handed under dtemu: Flower's Grid interface, each call carried out by the
server's role (core.flower.server) through the app's thread (core.flower.app_thread).

``get_node_ids`` lists every client, as Flower's simulation registers every node: the scenario's
faults and availability decide who answers, not who is listed (a SuperLink's list would change
with them, but a strategy that waits for a node to connect polls with a wall-clock sleep, which
the emulator's clock cannot serve)."""

from __future__ import annotations

from dtemu.core.flower.app import RUN_ID, Call


def make_grid(thread, node_ids: list[int]):
    """``thread``: the app's handle (FlowerApp.server_thread), whose ``ask`` carries a call out."""
    from flwr.app import Message
    from flwr.serverapp import Grid
    from flwr.supercore.run import Run

    class DtemuGrid(Grid):
        def __init__(self):
            self._run = Run.create_empty(RUN_ID)

        def set_run(self, run) -> None:
            self._run = run

        @property
        def run(self):
            return self._run

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self):
            return list(node_ids)

        def push_messages(self, messages):
            return thread.ask(Call("push_messages", (list(messages),)))

        def pull_messages(self, message_ids):
            return thread.ask(Call("pull_messages", (list(message_ids),)))

        def send_and_receive(self, messages, *, timeout=None):
            return thread.ask(Call("send_and_receive", (list(messages),), timeout))

    return DtemuGrid()
