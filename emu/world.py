"""The SimPy world: every node's primitives, their membership, and the messages between them.

Each node is a SimPy process running ``core.runtime.driver.Driver`` over its
role; ``EmuNode`` supplies the driver's primitives in virtual time:

- send:      one flow per receiver through ``emu.network``; returns when all ended
             (with ``network.send_window_bytes``: when the writer would return).
- recv:      the node's inbox, with an exact virtual-time deadline; a message then
             costs ``compute.decode_s_per_mb`` of the node's time before the role has it,
             and ``compute.recv_s_per_message``, and what its bytes' arrival did not hide of
             ``recv_s_per_mb`` (the rest runs on its machine as they come in); a send costs
             ``send_s_per_message`` a receiver and ``send_s_per_mb``, before its flows start;
             in a sealed run, ``compute.seal_s_per_mb`` on both sides.
- computed:  the job already ran for real (the virtual clock did not move);
             advance the clock by its modelled duration (``ComputeTimer``), so
             timeouts do not depend on how fast this machine is.
- cores:     with ``compute.shared_cores`` N, the CPU work priced per MB (decoding,
             ``compute.cpu``'s ops) of every node queues for N shared cores (FIFO).
- machines:  with ``compute.machines: sites``, the jobs of a site's nodes share its one
             machine's CPU (emu.machines: processor sharing), as on the testbed's machines:
             their training, their CPU ops, and each message's CPU on either side.  A message
             between two nodes of one machine crosses its loopback (no link): its receive
             thread's reassembly, on the machine, is its transfer.
- wait_peers: until the peers are up (matched), or the deadline.
- die:       the node goes down (state, inbox and flows lost) and, if the
             crash says so, restarts later.

A crash from outside (``faults.offline``) interrupts the process the same way.
``restart`` starts the role again from scratch and hands it the latest message
of every durable topic, as DDS TRANSIENT_LOCAL would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import simpy

from dtemu.core import events as ev
from dtemu.core.runtime import faults as faultlib
from dtemu.core.runtime.compute import CPU_OPS, ComputeTimer
from dtemu.core.runtime.driver import CRASHED, Driver
from dtemu.core.runtime.requests import Message, joined
from dtemu.core.runtime.fault_spec import FaultSpec
from dtemu.core.wire.topics import DURABLE_TOPICS

from .links import same_machine
from .network import Network


@dataclass
class _Inbox:
    messages: list[Message] = field(default_factory=list)
    waiter: simpy.Event | None = None
    waiting_for: tuple[str, ...] = ()

    def take(self, topics: tuple[str, ...]) -> Message | None:
        for i, msg in enumerate(self.messages):
            if msg.topic in topics:
                return self.messages.pop(i)
        return None


class EmuNode:
    """One emulated node: the primitives its driver uses, and its life (start, crash)."""

    def __init__(self, world: "World", name: str, rank: int, subscribes: Iterable[str],
                 make_role: Callable[[Driver], Any], timer: ComputeTimer):
        self.world = world
        self.node = name
        self.rank = rank
        self.subscribes = frozenset(subscribes)
        self.make_role = make_role
        self.timer = timer
        self.inbox = _Inbox()
        # its transport's receive thread, where a message from its own machine is taken in (deliver)
        self.receive_thread = simpy.Resource(world.env, capacity=1)
        self.process: simpy.Process | None = None
        self.up = False
        self.starts = 0
        self.bytes_rejected = 0  # of messages its roles refused (the driver counts them here)
        self.result: Any = None
        # Succeeds when the role returns (not when a crash ends the process).
        self.finished = world.env.event()

    # --- primitives ----------------------------------------------------
    @property
    def incarnation(self) -> int:
        return self.starts

    @property
    def executor(self):
        """Where Compute jobs run (emu.executor; None: in this process, one after another)."""
        return self.world.executor

    def now(self) -> float:
        return self.world.env.now

    def log(self, event: dict) -> None:
        self.world.log(event)

    def save_checkpoint(self, data: bytes) -> str:
        return self.world.save_checkpoint(data)

    def send(self, topic: str, data: bytes, to: str | None):
        data = joined(data)
        targets = self.world.receivers(self.node, topic, to)
        if topic in DURABLE_TOPICS:
            self.world.durable[(self.node, topic)] = data
        # the seal's HMAC and the transport's framing and serializing per byte (once), and its write
        # (per receiver): the sender's CPU
        cost = (len(targets) * self.timer.send_s_per_message + self._sealing(data)
                + len(data) * self.timer.send_s_per_mb / 1e6)
        if cost and targets:
            yield from self._on_cpu(cost)
        if self.world.multicast and len(targets) > 1:
            flows = [self.world.transmit_many(self.node, targets, topic, data)]
        else:
            batch = object()  # one message: its flows share the uplink (network.send_window_bytes)
            inline = to is None and topic in DURABLE_TOPICS   # real mode keeps it in DDS (late joiners)
            flows = [self.world.transmit(self.node, dst, topic, data, batch, inline) for dst in targets]
        if flows:
            yield self.world.env.all_of(flows)
        return len(targets)

    def _on_cpu(self, seconds: float):
        """A message's CPU work on this node: on its machine where it shares one (it slows the jobs
        of the machine's other nodes, and they slow it), else on the shared cores or at once."""
        machine = self.world.machines.get(self.node)
        if machine is not None:
            yield from machine.run(seconds)
        else:
            yield from self.world.on_cpu(seconds)

    def _reassembly_s(self, msg: Message) -> float:
        """The receive thread's CPU for ``msg`` (``compute.recv_s_per_mb``)."""
        return len(msg.data) * self.timer.recv_s_per_mb / 1e6

    def _reassembled_meanwhile(self, msg: Message) -> float:
        """The receive thread's CPU per MB of ``msg`` done while its bytes were coming in: all of it, up
        to the time between its send and its last byte.  Over a 100 Mbit/s link a 4.8 MB model takes
        0.38 s and its reassembly 6 ms of a 0.5 share's: none of that is left when it lands.  From a
        node of its own machine it is all done before it lands (``_reassemble``: the loopback's
        transfer is that CPU, notebook entry 49)."""
        return min(self._reassembly_s(msg), max(0.0, msg.received_at - msg.sent_at))

    def _sealing(self, data) -> float:
        """The CPU seconds of sealing or opening ``data`` (a sealed run's HMAC; 0 without a key)."""
        return len(data) * self.timer.seal_s_per_mb / 1e6 if self.world.key is not None else 0.0

    def send_half(self, topic: str, data: bytes, to: str | None):
        data = joined(data)
        for dst in self.world.receivers(self.node, topic, to):
            self.world.transmit(self.node, dst, topic, data)
        # Half of the bytes at the uplink's full rate: the flows are still going (the crash cuts them).
        yield self.world.env.timeout(len(data) * 8 / self.world.network.links[self.node].up_bps / 2)

    def recv(self, topics: tuple[str, ...], deadline: float | None):
        env = self.world.env
        while True:
            msg = self.inbox.take(topics)
            if msg is not None:
                # the hand-off, the reassembly its bytes' arrival did not hide (deliver), opening the
                # seal and decoding: the receiver's CPU before its role has the message
                reassembly = self._reassembly_s(msg) - self._reassembled_meanwhile(msg)
                cost = (len(msg.data) * self.timer.decode_s_per_mb / 1e6 + max(0.0, reassembly)
                        + self.timer.recv_s_per_message + self._sealing(msg.data))
                if cost:
                    yield from self._on_cpu(cost)
                return msg
            if deadline is not None and deadline <= env.now:
                return None
            waiter = env.event()
            self.inbox.waiter, self.inbox.waiting_for = waiter, topics
            if deadline is None:
                yield waiter
            else:
                yield waiter | env.timeout(deadline - env.now)
                if not waiter.triggered:
                    self.inbox.waiter = None

    def computed(self, req, elapsed: float):
        seconds = self.timer.duration(req.samples, req.kind, now=self.world.env.now, nbytes=req.nbytes)
        machine = self.world.machines.get(self.node)
        if machine is not None and req.kind != "eval":   # (evaluation is the experimenter's, not the run's)
            yield from machine.run(seconds)
        elif req.kind in CPU_OPS:   # CPU work priced per MB: on the shared cores, if the scenario has them
            yield from self.world.on_cpu(seconds)
        else:
            yield self.world.env.timeout(seconds)

    def idle(self, seconds: float):
        yield self.world.env.timeout(seconds)

    def wait_peers(self, peers: tuple[str, ...], deadline: float | None):
        return (yield from self.world.wait_peers(peers, deadline))

    def die(self, crash: faultlib.Crash) -> None:
        self.world.crash(self.node, interrupt=False)
        restart = self.world.crash_plan.restart_after(self.node)
        if restart is not None:
            self.world.env.process(self.world.restart_after(self.node, restart))

    # --- life ----------------------------------------------------------
    def start(self) -> simpy.Process:
        self.up = True
        self.starts += 1
        self.inbox = _Inbox()
        faults = faultlib.NodeFaults(self.world.faults, self.world.seed, self.node, self.rank, self.world.crash_plan)
        driver = Driver(self, faults, self.world.key)
        self.process = self.world.env.process(self._life(driver, self.make_role(driver)))
        return self.process

    def _life(self, driver: Driver, role):
        try:
            result = yield from driver.run(role)
        except simpy.Interrupt:
            role.close()  # crashed from outside: the role's state is gone
            return None
        except Exception as err:
            if not self.finished.callbacks:
                raise
            self.finished.fail(err)  # whoever waits for the role gets its error as it was
            return None
        if result is CRASHED:
            return None
        self.result = result
        self.finished.succeed(result)
        return result

    def crash(self, interrupt: bool = True) -> None:
        self.up = False
        if interrupt and self.process is not None and self.process.is_alive:
            self.process.interrupt("crash")
        self.inbox = _Inbox()

    def deliver(self, msg: Message) -> None:
        if not self.up:
            return
        # The transport's receive thread reassembles a message while its bytes come in (real.receiving):
        # that much of its CPU per MB is spent meanwhile, on the node's machine beside its other jobs
        # where it shares one (charged as the message lands), and not after the last byte (recv).
        machine = self.world.machines.get(self.node)
        if machine is not None and same_machine(self.world.machines, msg.src, self.node):
            # From a node of its own machine, over loopback: no wire time hides the reassembly, which
            # is the transfer (the receive thread's work on the machine's CPU) before the role has it.
            self.world.env.process(self._reassemble(msg, machine, self.inbox))
            return
        meanwhile = self._reassembled_meanwhile(msg)
        if meanwhile > 0 and machine is not None:
            self.world.env.process(machine.run(meanwhile))
        self._land(msg, self.inbox)

    def _reassemble(self, msg: Message, machine, inbox: _Inbox):
        with self.receive_thread.request() as turn:   # one at a time, in order
            yield turn
            yield from machine.run(self._reassembly_s(msg))
        if self.up and inbox is self.inbox:   # (a crash meanwhile lost it with the inbox)
            self._land(Message(msg.topic, msg.src, msg.data, msg.sent_at, self.world.env.now), inbox)

    def _land(self, msg: Message, inbox: _Inbox) -> None:
        inbox.messages.append(msg)
        if inbox.waiter is not None and msg.topic in inbox.waiting_for:
            waiter, inbox.waiter = inbox.waiter, None
            waiter.succeed()


class World:
    """Every node, the network and the event log of one emulated run."""

    def __init__(self, env: simpy.Environment, network: Network,
                 log: Callable[[dict], None], save_checkpoint: Callable[[bytes], str],
                 faults: FaultSpec | None = None, seed: int = 0, shared_cores: int = 0, key: bytes | None = None,
                 machines: dict | None = None):
        self.env = env
        # compute.machines: sites: each node's shared machine (emu.machines); a node without one has its own.
        self.machines = machines or {}
        self.key = key  # the run's key: every node's driver seals with it (None: nothing is sealed)
        # compute.shared_cores: the cores every node's CPU work priced per MB queues for (None: no queue).
        self.cores = simpy.Resource(env, capacity=shared_cores) if shared_cores else None
        self.faults = faults or FaultSpec()
        self.seed = seed
        self.crash_plan = faultlib.CrashPlan(self.faults)
        self.last_checkpoint: bytes | None = None
        self.network = network
        self.nodes: dict[str, EmuNode] = {}
        self.durable: dict[tuple[str, str], bytes] = {}
        self.log = log
        self._save_checkpoint = save_checkpoint
        self.executor = None  # emu.executor's pool (emu run --jobs N > 1), or None
        self.multicast = False  # network.delivery: one flow per link for a message to many
        self._subscribers: dict[tuple[str, str], list[str]] = {}
        self._peers_changed = env.event()

    def on_cpu(self, seconds: float):
        """``seconds`` of CPU work: on one of the shared cores once it is free (FIFO), or at once."""
        if self.cores is None:
            yield self.env.timeout(seconds)
            return
        with self.cores.request() as turn:
            yield turn
            yield self.env.timeout(seconds)

    def add(self, node: EmuNode) -> EmuNode:
        self.nodes[node.node] = node
        self._subscribers.clear()
        return node

    def emit(self, node: str, kind: str, **fields: Any) -> None:
        self.log({"t": round(self.env.now, 9), "node": node, "kind": kind, **fields})

    def save_checkpoint(self, data: bytes) -> str:
        self.last_checkpoint = data  # a restarted controller resumes from it
        return self._save_checkpoint(data)

    # --- membership ----------------------------------------------------
    def start(self, name: str) -> simpy.Process:
        self.network.restore_node(name)
        proc = self.nodes[name].start()
        self.emit(name, ev.NODE_UP)
        self._membership_changed()
        return proc

    def crash(self, name: str, interrupt: bool = True) -> None:
        self.nodes[name].crash(interrupt)
        self.network.fail_node(name)
        self.emit(name, ev.NODE_DOWN)
        self._membership_changed()

    def restart_after(self, name: str, delay: float):
        yield self.env.timeout(delay)
        self.restart(name)

    def restart(self, name: str) -> None:
        if self.nodes[name].up:
            return  # up already (a crash's restart and an offline window's end can meet)
        self.start(name)
        node = self.nodes[name]
        # The latest message of each durable topic reaches the newcomer.
        for (src, topic), data in sorted(self.durable.items()):
            if topic in node.subscribes and src != name and self.nodes[src].up:
                self.transmit(src, name, topic, data)

    def _membership_changed(self) -> None:
        changed, self._peers_changed = self._peers_changed, self.env.event()
        changed.succeed()

    def wait_peers(self, peers: tuple[str, ...], deadline: float | None):
        while True:
            up = frozenset(p for p in peers if p in self.nodes and self.nodes[p].up)
            if len(up) == len(peers):
                return up
            if deadline is not None and deadline <= self.env.now:
                return up
            if deadline is None:
                yield self._peers_changed
            else:
                yield self._peers_changed | self.env.timeout(deadline - self.env.now)

    # --- messages ------------------------------------------------------
    def receivers(self, src: str, topic: str, to: str | tuple[str, ...] | None) -> list[str]:
        if isinstance(to, tuple):
            return [n for n in to if n in self.nodes]
        if to is not None:
            return [to] if to in self.nodes else []
        # Who subscribes to what never changes during a run (a node down still counts: its
        # flow is dropped), so a broadcast's list is made once per sender and topic.
        key = (src, topic)
        if key not in self._subscribers:
            self._subscribers[key] = [n for n, node in self.nodes.items() if n != src and topic in node.subscribes]
        return self._subscribers[key]

    def transmit(self, src: str, dst: str, topic: str, data: bytes, batch: object = None,
                 inline: bool = False) -> simpy.Event:
        sent_at = self.env.now

        def land() -> None:
            self.nodes[dst].deliver(Message(topic, src, data, sent_at=sent_at, received_at=self.env.now))

        return self.network.send(src, dst, len(data), land, batch=batch, inline=inline)

    def transmit_many(self, src: str, dsts: list[str], topic: str, data: bytes) -> simpy.Event:
        """One message to every node of ``dsts`` as one multicast flow (network.delivery: multicast)."""
        sent_at = self.env.now

        def land(dst: str) -> None:
            self.nodes[dst].deliver(Message(topic, src, data, sent_at=sent_at, received_at=self.env.now))

        return self.network.multicast(src, dsts, len(data), land)
