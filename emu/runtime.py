"""The SimPy runtime: drives role generators in virtual time over the emulated network.

Each node is a SimPy process that runs its role generator and turns each
request (core.runtime) into simulated time:

- Send:     one flow per receiver through ``emu.network``; returns when all ended.
- Recv:     the node's inbox, with an exact virtual-time deadline.
- Compute:  runs the real PyTorch work now, then advances the clock by the
            modelled duration (``emu.compute``), so timeouts do not depend on
            how fast this machine is.
- WaitPeers: waits until the peers are up (matched), or the deadline.

A crash (``crash``) interrupts the process: the role's state, its inbox and
its flows are lost.  ``restart`` starts the role again from scratch and hands
it the latest sample of every durable topic, as DDS TRANSIENT_LOCAL would.

Faults at protocol points (``core.faults.CrashPlan``) are checked on every
event a role emits: a crash that lands ``NOW`` makes the node dead at once
(it logs and saves nothing more, its next request never runs); the others
land inside the next Compute or Send, which the driver cuts short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import simpy

from dtemu.core.runtime import faults as faultlib
from dtemu.core.runtime.requests import CLIENT_UPDATE, DURABLE_TOPICS, Compute, Message, Recv, Send, Sleep, WaitPeers

from dtemu.core.scenario import FaultSpec

from dtemu.core.runtime.compute import ComputeTimer
from dtemu.emu.network import Network


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
    """One emulated node; also the ``Context`` its role sees."""

    def __init__(self, world: "World", name: str, subscribes: Iterable[str],
                 make_role: Callable[["EmuNode"], Any], timer: ComputeTimer):
        self.world = world
        self.node = name
        self.subscribes = frozenset(subscribes)
        self.make_role = make_role
        self.timer = timer
        self.inbox = _Inbox()
        self.process: simpy.Process | None = None
        self.up = False
        self.dead = False  # crashed at a protocol point; the driver has not noticed yet
        self.armed: faultlib.Crash | None = None
        self.starts = 0
        self.result: Any = None
        # Succeeds when the role returns (not when a crash ends the process).
        self.finished = world.env.event()

    # --- Context -------------------------------------------------------
    def now(self) -> float:
        return self.world.env.now

    @property
    def incarnation(self) -> int:
        return self.starts

    def emit(self, kind: str, **fields: Any) -> None:
        if self.dead:
            return
        self.world.emit(self.node, kind, **fields)
        crash = self.world.crash_plan.trigger(self.node, kind, fields)
        if crash is not None:
            self.world.emit(self.node, "fault", fault="crash", at=crash.spec.at, round=crash.spec.round)
            if crash.landing == faultlib.NOW:
                self.dead = True
            else:
                self.armed = crash

    def save_checkpoint(self, data: bytes) -> str:
        if self.dead:
            return ""  # it died before it could save
        return self.world.save_checkpoint(data)

    # --- lifecycle -----------------------------------------------------
    def start(self) -> simpy.Process:
        self.up, self.dead, self.armed = True, False, None
        self.starts += 1
        self.inbox = _Inbox()
        self.process = self.world.env.process(self._drive(self.make_role(self)))
        return self.process

    def crash(self, interrupt: bool = True) -> None:
        self.up = False
        if interrupt and self.process is not None and self.process.is_alive:
            self.process.interrupt("crash")
        self.inbox = _Inbox()

    # --- delivery ------------------------------------------------------
    def deliver(self, msg: Message) -> None:
        if not self.up:
            return
        inbox = self.inbox
        inbox.messages.append(msg)
        if inbox.waiter is not None and msg.topic in inbox.waiting_for:
            waiter, inbox.waiter = inbox.waiter, None
            waiter.succeed()

    # --- the driver ----------------------------------------------------
    def _drive(self, role):
        value, error = None, None
        try:
            while True:
                try:
                    request = role.throw(error) if error is not None else role.send(value)
                except StopIteration as stop:
                    self.result = stop.value
                    self.finished.succeed(stop.value)
                    return stop.value
                except Exception as err:
                    if not self.finished.callbacks:
                        raise
                    self.finished.fail(err)  # whoever waits for the role gets its error as it was
                    return None
                value, error = None, None
                if self.dead:
                    break
                if self.armed is not None and isinstance(request, (Send, Compute)):
                    yield from self._land(self.armed, request)
                    break
                if isinstance(request, Send):
                    value = yield from self._send(request)
                elif isinstance(request, Recv):
                    value = yield from self._recv(request)
                elif isinstance(request, Compute):
                    try:
                        value = request.fn()
                    except Exception as err:  # the role decides what a failed job means
                        error = err
                        continue
                    yield self.world.env.timeout(self.timer.duration(request.samples, request.kind))
                elif isinstance(request, Sleep):
                    yield self.world.env.timeout(max(0.0, request.seconds))
                elif isinstance(request, WaitPeers):
                    value = yield from self.world.wait_peers(request)
                else:
                    error = TypeError(f"{self.node}: unknown request {request!r}")
        except simpy.Interrupt:
            role.close()  # the crash: the role's state is gone
            return None
        # A crash at a protocol point, from inside this process.
        role.close()
        self.world.crash(self.node, interrupt=False)
        restart = self.world.crash_plan.restart_after(self.node)
        if restart is not None:
            self.world.env.process(self.world.restart_after(self.node, restart))

    def _land(self, crash: faultlib.Crash, request):
        """Carry out ``request`` as far as ``crash`` lets it get."""
        env = self.world.env
        if crash.landing == faultlib.IN_COMPUTE and isinstance(request, Compute):
            # Halfway through the job; the work is lost, so it is not even run.
            yield env.timeout(self.timer.duration(request.samples, request.kind) / 2)
        elif crash.landing == faultlib.IN_SEND and isinstance(request, Send):
            targets = self.world.receivers(self.node, request.topic, request.to)
            for dst in targets:
                self.world.transmit(self.node, dst, request.topic, request.data)
            # Half of the bytes at the uplink's full rate: the flows are still going.
            yield env.timeout(len(request.data) * 8 / self.world.network.links[self.node].up_bps / 2)
        elif crash.landing == faultlib.AFTER_SEND and isinstance(request, Send):
            yield from self._send(request)

    def _send(self, req: Send):
        if req.topic == CLIENT_UPDATE:
            req = Send(req.topic, self.world.corrupt(self.node, req.data), req.to)
        targets = self.world.receivers(self.node, req.topic, req.to)
        if req.topic in DURABLE_TOPICS:
            self.world.durable[(self.node, req.topic)] = req.data
        flows = [self.world.transmit(self.node, dst, req.topic, req.data) for dst in targets]
        if flows:
            yield self.world.env.all_of(flows)
        return len(targets)

    def _recv(self, req: Recv):
        env = self.world.env
        while True:
            msg = self.inbox.take(req.topics)
            if msg is not None:
                return msg
            if req.deadline is not None and req.deadline <= env.now:
                return None
            waiter = env.event()
            self.inbox.waiter, self.inbox.waiting_for = waiter, req.topics
            if req.deadline is None:
                yield waiter
            else:
                yield waiter | env.timeout(req.deadline - env.now)
                if not waiter.triggered:
                    self.inbox.waiter = None


class World:
    """Every node, the network and the event log of one emulated run."""

    def __init__(self, env: simpy.Environment, network: Network,
                 emit: Callable[[dict], None], save_checkpoint: Callable[[bytes], str],
                 faults: FaultSpec | None = None, seed: int = 0):
        self.env = env
        self.faults = faults or FaultSpec()
        self.seed = seed
        self.crash_plan = faultlib.CrashPlan(self.faults)
        self.delivery = faultlib.DeliveryFaults(self.faults, seed) if self.faults.perturbs_delivery else None
        self.last_checkpoint: bytes | None = None
        self.network = network
        self.nodes: dict[str, EmuNode] = {}
        self.durable: dict[tuple[str, str], bytes] = {}
        self._emit = emit
        self._save_checkpoint = save_checkpoint
        # A hook that may swallow a delivery (the per-round dropout fault).
        self.delivery_filter: Callable[[Message, str], bool] | None = None
        self._peers_changed = env.event()

    def add(self, node: EmuNode) -> EmuNode:
        self.nodes[node.node] = node
        return node

    def emit(self, node: str, kind: str, **fields: Any) -> None:
        self._emit({"t": round(self.env.now, 9), "node": node, "kind": kind, **fields})

    def save_checkpoint(self, data: bytes) -> str:
        self.last_checkpoint = data  # a restarted controller resumes from it
        return self._save_checkpoint(data)

    def corrupt(self, node: str, data: bytes) -> bytes:
        """An update as ``faults.corrupt`` damages it (unchanged for honest clients)."""
        damaged, spec, round_ = faultlib.damage(self.faults, node, data, self.seed)
        if spec is not None:
            self.emit(node, "fault", fault="corrupt", corruption=spec.kind, round=round_)
        return damaged

    # --- membership ----------------------------------------------------
    def start(self, name: str) -> simpy.Process:
        self.network.restore_node(name)
        proc = self.nodes[name].start()
        self.emit(name, "node_up")
        self._membership_changed()
        return proc

    def crash(self, name: str, interrupt: bool = True) -> None:
        self.nodes[name].crash(interrupt)
        self.network.fail_node(name)
        self.emit(name, "node_down")
        self._membership_changed()

    def restart_after(self, name: str, delay: float):
        yield self.env.timeout(delay)
        self.restart(name)

    def restart(self, name: str) -> None:
        if self.nodes[name].up:
            return  # up already (a crash's restart and an offline window's end can meet)
        self.start(name)
        node = self.nodes[name]
        # The latest sample of each durable topic reaches the newcomer.
        for (src, topic), data in sorted(self.durable.items()):
            if topic in node.subscribes and src != name and self.nodes[src].up:
                self.transmit(src, name, topic, data)

    def _membership_changed(self) -> None:
        changed, self._peers_changed = self._peers_changed, self.env.event()
        changed.succeed()

    def wait_peers(self, req: WaitPeers):
        while True:
            up = frozenset(p for p in req.peers if p in self.nodes and self.nodes[p].up)
            if len(up) == len(req.peers):
                return up
            if req.deadline is not None and req.deadline <= self.env.now:
                return up
            if req.deadline is None:
                yield self._peers_changed
            else:
                yield self._peers_changed | self.env.timeout(req.deadline - self.env.now)

    # --- messages ------------------------------------------------------
    def receivers(self, src: str, topic: str, to: str | None) -> list[str]:
        if to is not None:
            return [to] if to in self.nodes else []
        return [n for n, node in self.nodes.items() if n != src and topic in node.subscribes]

    def transmit(self, src: str, dst: str, topic: str, data: bytes) -> simpy.Event:
        sent_at = self.env.now

        def land() -> None:
            node = self.nodes[dst]
            msg = Message(topic, src, data, sent_at=sent_at, received_at=self.env.now)
            if not node.up:
                return
            if self.delivery_filter is not None and not self.delivery_filter(msg, dst):
                return
            self.emit(dst, "deliver", src=src, topic=topic, bytes=len(data), sent_at=round(sent_at, 9),
                      comm_s=round(self.env.now - sent_at, 9))
            node.deliver(msg)

        def arrive() -> None:
            if self.delivery is None:
                return land()
            copies = self.delivery.copies(src, dst, self.env.now)
            if not copies:
                why = "partition" if self.delivery.partitioned(src, dst, self.env.now) else "message_lost"
                self.emit(dst, "fault", fault=why, src=src, topic=topic, bytes=len(data))
            elif len(copies) > 1:
                self.emit(dst, "fault", fault="duplicate", src=src, topic=topic)
            for delay in copies:
                if delay > 0:
                    self.env.process(self._later(delay, land))
                else:
                    land()

        return self.network.send(src, dst, len(data), arrive)

    def _later(self, delay: float, fn: Callable[[], None]):
        yield self.env.timeout(delay)
        fn()
