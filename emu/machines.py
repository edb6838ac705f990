"""Machines whose nodes share one CPU: processor sharing, as the testbed's machines do.

``compute.machines: sites`` says that the nodes of one site run on one machine (real launch
--machines puts a site in one namespace under one CPU share: a geo site's PS beside its workers).
Each job's modelled duration (``ComputeTimer``: the step as ``emu calibrate --cpu-share`` timed it
alone on that share) is its work; while n of the machine's jobs run, each advances at 1/n of its
rate, as a CPU quota shared by n busy processes gives each of them.  With ``nodes`` (the default)
every node is a machine of its own and a job takes its duration, as before.  The nodes of one machine
reach each other over its loopback, not the site's LAN (emu.network's ``machine_of``): the testbed
shapes no loopback, and such a message's time is its CPU at both ends (emu.world).

The state is each running job's work left; it is brought up to date whenever a job starts or
ends, and every job then waits for its own end or the next change, whichever is first.
"""

from __future__ import annotations

import simpy

DONE = 1e-12  # work left below this (seconds of the machine alone) is done: float residue of the shares


class SharedMachine:
    def __init__(self, env: simpy.Environment):
        self.env = env
        self.left: dict[object, float] = {}
        self.since = env.now
        self.changed = env.event()

    def _advance(self) -> None:
        if self.left:
            share = (self.env.now - self.since) / len(self.left)
            for job in self.left:
                self.left[job] -= share
        self.since = self.env.now

    def _change(self) -> None:
        changed, self.changed = self.changed, self.env.event()
        changed.succeed()

    def run(self, seconds: float):
        """A job of ``seconds`` of this machine's CPU; returns when it is done (a crash interrupts it)."""
        self._advance()
        job = object()
        self.left[job] = seconds
        self._change()
        try:
            while self.left[job] > DONE:
                yield self.env.timeout(self.left[job] * len(self.left)) | self.changed
                self._advance()
        finally:
            self._advance()
            del self.left[job]
            self._change()


def machines_of(site_of: dict[str, str], nodes: list[str], env: simpy.Environment) -> dict[str, SharedMachine]:
    """Each node's machine: one per site, shared by its nodes; a node outside the sites gets none
    (its jobs take their own time)."""
    by_site = {site: SharedMachine(env) for site in dict.fromkeys(site_of.values())}
    return {node: by_site[site_of[node]] for node in nodes if node in site_of}
