"""Geo training for real across network namespaces, one per site, against emu (issue 11).

    sudo .venv/bin/python -m tools.netns_geo [--scenario scenarios/geo_hips.yaml]
        [--rounds 30] [--workers-per-site 2] [--mbps 20] [--set KEY=VALUE ...]
        [--out DIR] [--md FILE.md] [--keep] [--reuse-real DIR] [--late-site SITE --late-at S]
        [--calibrate-from DIR]

Needs root (``ip netns``, ``tc``) unless ``--reuse-real``.  The testbed is
tools/netns_fl.py's, with a namespace per *site* instead of per node::

    ns <tag>-central (master, global-ps)   eth0 10.231.0.1/24 ─┐
    ns <tag>-a       (a-ps, a-w0, a-w1)    eth0 10.231.0.2/24 ─┼─ p0,p1,p2 ── br0 (ns <tag>-sw)
    ns <tag>-b       (b-ps, b-w0, b-w1)    eth0 10.231.0.3/24 ─┘

* a site's veth is its WAN attachment: ``tbf`` at the site's ``wan.up_mbps`` on
  the site side (its uplink) and at ``wan.down_mbps`` on the switch side (its
  downlink), the 16 MB queue of netns_fl and a bucket of two frames (small
  messages would otherwise leave partly at line rate); ``--mbps M`` sets every
  site's WAN to M both ways (in the scenario too, so that real and emu are given
  one network);
* a site's LAN is what it really is: the ranks of a site share its namespace
  and reach each other at its own address, i.e. over the kernel's loopback
  route, unshaped.  Emu is given what was measured there before the run: LAN
  ``bandwidth_mbps`` = UDP throughput of 64000-byte datagrams (DDS's fragment
  size) between two processes of the namespace, ``latency_ms`` = a quarter of
  the UDP round trip inside it (a message in a site crosses two access links);
  the WAN ``latency_ms`` is the rest of the round trip between two sites'
  namespaces (this kernel has no netem: no delay is added);
* isolation (no route out, the switch without address) and teardown (``finally``,
  SIGTERM/SIGHUP) as in netns_fl.  Rank N runs under ``ip netns exec <its site>``
  with ``--profile lan --peers <every site's address> DTEMU_DDS_INTERFACE=eth0``,
  ``real run``'s time scale 1 (training takes what it takes here; emu is given
  those times below), ``DTEMU_DDS_MAX_PARTICIPANTS`` = the most ranks in a
  namespace + 2 (unicast discovery goes to every participant index's port);
* the ranks meet at real mode's start line (as under ``real launch``), written
  ``START_LINE_S`` after the last one is ready: geo's roles send at once, so
  DDS discovery across the shaped WAN must be done by then.

Evaluation only after the last round (``geo.eval_every`` > rounds).  Then emu:

1. replay (the test of the model): every worker's measured ``compute_s`` of every
   round (``geo_step``) given back to emu's compute model, gradients computed for
   real, with the model of real mode's transport (``network.framing: rtps``,
   ``network.send_window_bytes``, every node's ``decode_s_per_mb`` as measured here
   for a geo payload of this model) and the roles' CPU outside the gradient
   (``compute.default.cpu``: every op's rate measured here by dtemu.emu.costs (`emu calibrate`),
   one thread) and a message's own CPU (``send_s_per_message``, ``recv_s_per_message``:
   measured over DDS on loopback, on the lan profile's path, dtemu.real.message_costs; `emu calibrate
   --cpu-share` does the same), on
   ``compute.shared_cores`` = this machine's cores, which every rank shares for real;
2. the same replay, that CPU on cores of each node's own (no sharing);
3. the same replay with the CPU ops but not the messages' own CPU;
4. the same replay without either (transport only: the prediction before them);
5. the same replay with emu's defaults (payload bytes only, no decoding, no CPU ops);
6. ``emu run`` with everything of 1 and each worker's mean measured
   ``train_s_per_sample``.

``--late-site SITE``: that site's local PS and workers are held until ``--late-at`` seconds
after the start line (``faults.offline`` from 0, as ``real launch`` does) and join the running
run (``geo.joining``, ``geo.start_wait_s`` 2 s); emu is then replayed (1. only) with the site up
within the round it was let in at for real (tests/test_geo_join_real.py's method on loopback).

``--calibrate-from DIR``: every CPU cost of the prediction (the roles' ops, a message's own
CPU, decoding) is multiplied by the in-situ factor of an earlier run in DIR (``in_situ``: what
the steps of a round outside the gradient and the WAN took there for real, against what its
replay charged for them).  The per-op rates are measured one op at a time on an idle
process; in a run of 8-12 ranks on 2 cores each step costs 2.4-4.3 times as much.

Round time = the root PS's (global or flat) ``geo_round`` close to the next one,
rounds 2.. (round 1 also carries the initial model down the tree); comm = round
time minus the slowest worker's ``compute_s`` of that round.  The local PSs'
``wan_s`` (push to the global PS until its answer arrives) is reported too.  Every
run must end with the same ``model_sha256`` (FSA is deterministic).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dtemu.host.rundir import read_events_partial
from dtemu.core.runtime.network_spec import LinkSpec
from tools.netns_fl import (ROOT, NetnsError, Testbed, mean_cells, run_comparison, run_emu, run_testbed,
                            testbed_parser)

ROOT_PS = ("global-ps", "ps")
START_LINE_S = 3.0   # after every rank is ready: DDS discovery over the shaped WAN settles (run_real)


class SiteTestbed(Testbed):
    """One namespace per site behind its WAN (real.machine_net: up on its side, down on the switch's)."""

    def __init__(self, sites: list[str], wan_mbps: list[tuple[float, float]], delay_ms: float = 0.0,
                 tag: str | None = None):
        super().__init__(tag=tag or f"dtgeo{os.getpid() % 100000}", delay_ms=delay_ms,
                         links=[LinkSpec(up, down, delay_ms) for up, down in wan_mbps])
        self.sites = list(sites)
        self.wan_mbps = list(wan_mbps)
        self.lan: dict[str, float] = {}

    def up(self) -> None:
        super().up()
        # What the LAN inside a site is (the loopback route of its namespace), for emu.
        self.lan = {"rtt_ms": self.rtt_ms(0, 0), "mbps": self.lan_mbps(0)}
        # The blast above overflows its sink's buffer on purpose: the run's drops are counted from here.
        self.drops_before = self.drop_counters()

    def lan_mbps(self, i: int, seconds: float = 1.0) -> float:
        """UDP throughput (Mbit/s) of 64000-byte datagrams between two processes of namespace i,
        counted at the receiver (what the kernel's loopback route carries here)."""
        port = 48000 + os.getpid() % 1000
        recv = subprocess.Popen(self.exec_prefix(i) + [sys.executable, "-c", _SINK, self.addresses[i], str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            recv.stdout.readline()  # "ready"
            subprocess.run(self.exec_prefix(i) + [sys.executable, "-c", _BLAST, self.addresses[i], str(port),
                                                  str(seconds)], capture_output=True, timeout=30)
            out, _ = recv.communicate(timeout=30)
            return float(out.strip())
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()


# The receiver counts what arrives until 0.5 s of silence; the sender sends for N seconds with
# the socket's buffer full (blocking sends), so the rate is the loopback's, not the sender's pace.
_SINK = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20); s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(10)
print("ready", flush=True)
n = 0; first = last = None
while True:
    try:
        d = s.recv(65536)
    except OSError:
        break
    last = time.perf_counter(); first = first or last; n += len(d); s.settimeout(0.5)
print(n * 8 / 1e6 / (last - first) if first and last > first else float("nan"))
"""
_BLAST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
d = b"x" * 64000; end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    for _ in range(64):
        s.sendto(d, (sys.argv[1], int(sys.argv[2])))
"""


# ---------------------------------------------------------------------------------------------
# what the runs' events say


def round_times(events: list[dict]) -> dict[int, float]:
    """round -> the root PS's geo_round close minus the previous one (rounds 2..)."""
    close = _closes(events)
    return {r: close[r] - close[r - 1] for r in sorted(close) if r - 1 in close}


def compute_times(events: list[dict]) -> dict[str, dict[int, float]]:
    """worker -> round -> compute_s (its gradient)."""
    out: dict = {}
    for e in events:
        if e["kind"] == "geo_step":
            out.setdefault(e["node"], {})[e["round"]] = e["compute_s"]
    return out


def wan_waits(events: list[dict]) -> dict[int, float]:
    """round -> the local PSs' mean wan_s (their push to the global PS until its answer arrived)."""
    per: dict = {}
    for e in events:
        if e["kind"] == "geo_round" and e.get("role") == "local_ps":
            per.setdefault(e["round"], []).append(e["wan_s"])
    return {r: statistics.fmean(v) for r, v in per.items()}


def compare(real_events: list[dict], emu_events: list[dict]) -> dict:
    real_rt, emu_rt = round_times(real_events), round_times(emu_events)
    real_ct, emu_ct = compute_times(real_events), compute_times(emu_events)
    real_wan, emu_wan = wan_waits(real_events), wan_waits(emu_events)
    rows = []
    for r in sorted(set(real_rt) & set(emu_rt)):
        real_train = max((c[r] for c in real_ct.values() if r in c), default=0.0)
        emu_train = max((c[r] for c in emu_ct.values() if r in c), default=0.0)
        real_comm, emu_comm = real_rt[r] - real_train, emu_rt[r] - emu_train
        rows.append({"round": r, "real_s": real_rt[r], "emu_s": emu_rt[r],
                     "error_pct": 100 * (emu_rt[r] - real_rt[r]) / real_rt[r],
                     "real_train_s": real_train, "emu_train_s": emu_train,
                     "real_comm_s": real_comm, "emu_comm_s": emu_comm,
                     "comm_error_pct": 100 * (emu_comm - real_comm) / real_comm if real_comm > 0 else float("nan"),
                     "real_wan_s": real_wan.get(r, float("nan")), "emu_wan_s": emu_wan.get(r, float("nan"))})
    mean = {}
    if rows:
        mean = {k: statistics.fmean(row[k] for row in rows) for k in
                ("real_s", "emu_s", "error_pct", "real_comm_s", "emu_comm_s", "comm_error_pct",
                 "real_wan_s", "emu_wan_s")}
        mean["abs_error_pct"] = statistics.fmean(abs(row["error_pct"]) for row in rows)
        mean["abs_comm_error_pct"] = statistics.fmean(abs(row["comm_error_pct"]) for row in rows)
        mean["mean_time_error_pct"] = 100 * (mean["emu_s"] - mean["real_s"]) / mean["real_s"]
    return {"rounds": rows, "mean": mean}


def calibrate(real_events: list[dict], batch: int) -> dict[str, float]:
    """worker -> mean seconds per sample of its measured gradient computations."""
    return {node: statistics.fmean(per.values()) / batch for node, per in compute_times(real_events).items()}


def wan_overhead(qdisc: dict[str, str], events: list[dict], site_of: dict[str, str], sites: list[str],
                 namespaces: list[str]) -> dict:
    """Each site's WAN uplink: bytes its tbf sent (headers, discovery, acknowledgements, all) against
    the payload its ranks sent across the WAN: their geo_end ``wan_sent`` and, from the central site,
    the initial model (fp32) to every node across the WAN that the root PS hands it to."""
    import re

    import numpy as np

    from dtemu.core.geo.payload import encode_dense

    payload = {s: 0 for s in sites}
    starts = {e["node"]: e for e in events if e["kind"] == "geo_start"}
    for e in events:
        if e["kind"] == "geo_end":
            payload[site_of[e["node"]]] += e.get("wan_sent", 0)
    root = next((n for n in ROOT_PS if n in starts), None)
    if root is not None:
        first_hop = "local_ps" if starts[root]["architecture"] == "hips" else "worker"
        model = len(encode_dense(0, np.zeros(starts[root]["dim"], np.float32)))
        payload[site_of[root]] += model * sum(1 for e in starts.values() if e["role"] == first_hop)
    out = {}
    for site, ns in zip(sites, namespaces):
        m = re.search(r"Sent (\d+) bytes (\d+) pkt", qdisc.get(f"{ns}:eth0", ""))
        if m and payload[site]:
            sent = int(m.group(1))
            out[site] = {"qdisc_bytes": sent, "packets": int(m.group(2)), "payload_bytes": payload[site],
                         "overhead_pct": 100 * (sent - payload[site]) / payload[site]}
    return out


def run_emu_replay(scenario_path: str, sets: list[str], out: Path, per_node: dict[str, dict[int, float]]) -> dict:
    """emu in this process, every worker's gradient taking what it took for real in that round
    (the gradients are still computed: the model must end as the real one did)."""
    import dtemu.emu.run as er
    from dtemu.host.scenario_file import load_scenario

    scenario = load_scenario(scenario_path, sets)
    names = scenario.node_names
    base = er.ComputeTimer

    class ReplayTimer(base):
        def __init__(self, spec, reference, seed, **timing):   # (timing: the batch its warm-up steps by)
            super().__init__(spec, reference or 1e-3, seed, **timing)
            steps = per_node.get(names[seed[1]], {})
            self.queue = [steps[r] for r in sorted(steps)]

        def duration(self, samples, kind="train", now=0.0, nbytes=0):
            if kind == "train" and samples > 0 and self.queue:
                return self.queue.pop(0)
            return super().duration(samples, kind, now=now, nbytes=nbytes)

    er.ComputeTimer = ReplayTimer
    try:
        return er.run_emulation(scenario, out)
    finally:
        er.ComputeTimer = base


LATE_START_WAIT_S = 2.0   # --late-site: how long the global PS waits for the sites at the start


def _load_events(folder: Path) -> list[dict]:
    return read_events_partial(folder)[0]


def step_times(events: list[dict]) -> dict[str, float]:
    """Medians (s) of the steps of a HiPS round outside the gradient and the WAN, from the events:
    at a local PS, its last worker's push delivered -> its push to the global PS sent (``sum``:
    decode, sum, sparsify, encode), the global PS's pull delivered -> the round closed (``pull``),
    round closed -> next round begins (``down``: densify, the workers' pulls sent); at a worker,
    its pull delivered -> step done (``apply``), step done -> next gradient (``batch``), gradient
    done -> its push delivered at its PS (``push``)."""
    events = list(events)
    steps: dict[str, list[float]] = {k: [] for k in ("sum", "pull", "down", "apply", "batch", "push")}
    deliver: dict[tuple[str, str], list[float]] = {}
    for e in events:
        if e["kind"] == "deliver":
            deliver.setdefault((e["node"], e.get("topic", "")), []).append(e["t"])
    for key in deliver:
        deliver[key].sort()

    def last_before(times, t, after=float("-inf")):
        hits = [x for x in times if after - 1e-9 <= x <= t + 1e-9]
        return max(hits) if hits else None

    closes: dict[str, list[dict]] = {}
    worker_steps: dict[str, list[dict]] = {}
    for e in events:
        if e["kind"] == "geo_round" and e.get("role") == "local_ps":
            closes.setdefault(e["node"], []).append(e)
        elif e["kind"] == "geo_step":
            worker_steps.setdefault(e["node"], []).append(e)
    for ps, rounds in closes.items():
        rounds.sort(key=lambda e: e["round"])
        for a, b in zip([None] + rounds, rounds):
            t2 = b["t"]
            t1 = t2 - b["wan_s"]
            t0 = t1 - b["wait_s"]
            if (x := last_before(deliver.get((ps, "geo/push"), []), t1, t0)) is not None:
                steps["sum"].append(t1 - x)
            if (x := last_before(deliver.get((ps, "geo/pull"), []), t2, t1)) is not None:
                steps["pull"].append(t2 - x)
            if a is not None:
                steps["down"].append(t0 - a["t"])
    for w, rows in worker_steps.items():
        rows.sort(key=lambda e: e["round"])
        ps = next((n for n in closes if n.split("-")[0] == w.split("-")[0]), None)
        for a, b in zip(rows, rows[1:] + [None]):
            t1 = a["t"] - a["comm_s"]
            if (x := last_before(deliver.get((w, "geo/pull"), []), a["t"], t1)) is not None:
                steps["apply"].append(a["t"] - x)
            if b is not None and b["round"] == a["round"] + 1:
                steps["batch"].append(b["t"] - b["comm_s"] - b["compute_s"] - a["t"])
            pushes = [x for x in deliver.get((ps, "geo/push"), []) if x >= t1 - 1e-9] if ps else []
            if pushes:
                steps["push"].append(min(pushes) - t1)
    return {k: statistics.median(v) for k, v in steps.items() if v}


def in_situ(folder: Path) -> dict:
    """The in-situ factor of an earlier netns_geo run (its ``real`` and ``emu-replay`` folders): the
    sum of ``step_times`` for real over the same sum in emu's replay.  Emu charges each of these
    steps at rates measured one op at a time on an idle process; in a run each costs more (a
    process just woken, the ranks' working sets on the cores).  ``--calibrate-from`` multiplies
    every CPU cost of a prediction (the roles' ops, a message's own CPU, decoding) by it."""
    real, emu = step_times(_load_events(Path(folder) / "real")), step_times(_load_events(Path(folder) / "emu-replay"))
    keys = sorted(set(real) & set(emu))
    if not keys or sum(emu[k] for k in keys) <= 0:
        raise NetnsError(f"{folder}: no steps to calibrate from")
    return {"factor": sum(real[k] for k in keys) / sum(emu[k] for k in keys), "real": real, "emu": emu}


def _offline_set(nodes: list[str], end_s: float | None) -> str:
    windows = ", ".join(f"{{node: {n}, start_s: 0" + (f", end_s: {end_s:g}}}" if end_s is not None else "}")
                        for n in nodes)
    return f"faults.offline=[{windows}]"


def _closes(events: list[dict]) -> dict[int, float]:
    return {e["round"]: e["t"] for e in events if e["kind"] == "geo_round" and e.get("node") in ROOT_PS}


def late_replay(scenario_path: str, sets: list[str], out: Path, real_events: list[dict], late_nodes: list[str],
                late_at_s: float) -> dict:
    """The replay of a run that a site joined late.  Which round it joined at (k) depends on when
    its JOIN reached the global PS for real; emu is given the site up within that same round: a
    first replay without the site says when round k - 1 closed, the second has the site up just
    after it (as tests/test_geo_join_real.py does on loopback)."""
    joins = [e for e in real_events if e["kind"] == "geo_join"]
    if not joins:
        raise NetnsError(f"the late site ({', '.join(late_nodes)}, up at {late_at_s:g} s) did not join for real")
    k = joins[0]["round"]
    alone = run_emu_replay(scenario_path, sets + [_offline_set(late_nodes, None)], out / "emu-replay-alone",
                           compute_times(real_events))
    before = LATE_START_WAIT_S if k == 1 else _closes(read_events_partial(out / "emu-replay-alone")[0])[k - 1]
    summary = run_emu_replay(scenario_path, sets + [_offline_set(late_nodes, before + 0.001)], out / "emu-replay",
                             compute_times(real_events))
    emu_joins = [e["round"] for e in read_events_partial(out / "emu-replay")[0] if e["kind"] == "geo_join"]
    up = next((e["t"] for e in real_events if e["kind"] == "node_up" and e["node"] == late_nodes[0]), None)
    return {"real_join_round": k, "real_join_t": joins[0]["t"], "real_up_t": up, "emu_join_rounds": emu_joins,
            "emu_up_s": before + 0.001, "alone_model": alone.get("model_sha256"), "emu_summary": summary}


# ---------------------------------------------------------------------------------------------
# report


def _table(cmp: dict) -> list[str]:
    lines = ["| round | real s | emu s | error % | real comm s | emu comm s | comm error % | real WAN wait s | "
             "emu WAN wait s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in cmp["rounds"]:
        lines.append(f"| {r['round']} | {r['real_s']:.4f} | {r['emu_s']:.4f} | {r['error_pct']:+.1f} | "
                     f"{r['real_comm_s']:.4f} | {r['emu_comm_s']:.4f} | {r['comm_error_pct']:+.1f} | "
                     f"{r['real_wan_s']:.4f} | {r['emu_wan_s']:.4f} |")
    m = cmp["mean"]
    if m:
        lines.append("| mean | " + mean_cells(m) + f" {m['real_wan_s']:.4f} | {m['emu_wan_s']:.4f} |")
    return lines


def markdown(result: dict) -> str:
    cfg = result["config"]
    wan = ", ".join(f"{s} {u:g}/{d:g}" for s, (u, d) in zip(cfg["sites"], cfg["wan_mbps"]))
    lines = [f"Geo over network namespaces vs emu: {cfg['scenario']} ({cfg['model']}, {cfg['architecture']}, "
             f"{cfg['sync']}, {cfg['compression']}), sites {', '.join(cfg['sites'])} (central "
             f"{cfg['central']}), {cfg['workers_per_site']} workers a site, {cfg['ranks']} ranks, {cfg['rounds']} "
             f"rounds; WAN up/down Mbit/s per site: {wan} (tbf; netem "
             f"{'yes' if cfg['netem'] else 'not in this kernel'}).  Measured: UDP RTT between sites "
             f"{cfg['rtt_ms']:.3f} ms, inside a site {cfg['lan_rtt_ms']:.3f} ms, a site's loopback "
             f"{cfg['lan_mbps']:.0f} Mbit/s.  Emu: LAN {{bandwidth_mbps: {cfg['emu_lan_mbps']:.0f}, latency_ms: "
             f"{cfg['emu_lan_latency_ms']:.4f}}}, WAN latency_ms {cfg['emu_wan_latency_ms']:.4f}; decoding "
             f"{cfg['decode_s_per_mb'] * 1e3:.3f} ms/MB (a dense geo payload of the model, measured here)"
             + (("; the roles' CPU outside the gradient, ms per MB of the fp32 model (measured here, one thread): "
                 + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in cfg["cpu_s_per_mb"].items())
                 + (f"; a message's own CPU: send {cfg['s_per_message']['send'] * 1e6:.0f} us, receive "
                    f"{cfg['s_per_message']['recv'] * 1e6:.0f} us" if cfg.get("s_per_message") else "")
                 + f"; on {cfg['shared_cores']} shared cores") if cfg.get("cpu_s_per_mb") else "") + ".",
             "", "model_sha256: " + ", ".join(f"{k} `{(v or '')[:12]}`" for k, v in result["sha256"].items())
             + (" (all equal)" if len(set(result["sha256"].values())) == 1 else " (**differ**)"),
             "", "WAN bytes (payload, both directions): " + ", ".join(f"{k} {v}" for k, v in result["wan_bytes"].items())
             + "; datagrams the namespaces' kernels dropped during the run: "
             + (", ".join(f"{ns} {c}" for ns, c in result.get("drops", {}).items() if any(c.values())) or "none")
             + "."]
    if result.get("late"):
        late = result["late"]
        up = f"{late['real_up_t']:.3f}" if late.get("real_up_t") is not None else "?"
        lines += ["", f"A late site (geo.joining): its ranks held until {result['config']['args']['late_at_s']:g} s "
                  f"after the start line; for real up at {up} s and let in when round {late['real_join_round']} "
                  f"closed ({late['real_join_t']:.3f} s).  Emu replayed with the site up at {late['emu_up_s']:.3f} s "
                  f"(just after round {late['real_join_round'] - 1} closed in a replay without it): let in at "
                  f"round(s) {late['emu_join_rounds']}."]
    if result.get("wan_overhead"):
        lines += ["", "Bytes on each site's shaped WAN uplink (tc), the whole run, against the WAN payload its ranks "
                  "sent (the initial model included): "
                  + ", ".join(f"{k} {v['qdisc_bytes'] / 1e6:.3f} MB for {v['payload_bytes'] / 1e6:.3f} MB "
                              f"(+{v['overhead_pct']:.1f}%)" for k, v in result["wan_overhead"].items()) + "."]
    for key, title in (("compare_replay", "emu with the transport model, the roles' CPU and the messages' own CPU "
                                          "on the shared cores, every worker's measured compute_s replayed round "
                                          "by round:"),
                       ("compare_replay_own_cores", "the same replay, the roles' CPU on cores of each node's own:"),
                       ("compare_replay_ops", "the same replay with the roles' CPU ops (shared cores) but not the "
                                              "messages' own CPU:"),
                       ("compare_replay_transport", "the same replay without the roles' CPU (the transport model "
                                                    "alone):"),
                       ("compare_replay_payload", "the same replay with emu's defaults (payload bytes only, "
                                                  "no decoding time, no CPU ops):"),
                       ("compare", "emu run with the transport model, the roles' CPU on the shared cores and "
                                   "each worker's mean train_s_per_sample:")):
        if key in result:
            m = result[key]["mean"]
            lines += ["", title, ""] + _table(result[key])
            if m:
                lines += ["", f"mean round: real {m['real_s']:.4f} s, emu {m['emu_s']:.4f} s "
                              f"({m['mean_time_error_pct']:+.1f}%); mean absolute error per round "
                              f"{m['abs_error_pct']:.1f}%, comm {m['abs_comm_error_pct']:.1f}%."]
    lines += ["", "round time = the root PS's geo_round close to the next (rounds 2..); comm = round time minus "
              "the slowest worker's compute_s; WAN wait = a local PS's push until the global PS's answer "
              "(mean over the sites)."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the comparison


def base_sets(rounds: int, workers_per_site: int, model: str, test_samples: int) -> list[str]:
    """What the testbed's run sets of a geo scenario, before its WAN: one thread per rank, no
    evaluation before the end."""
    return [f"model={model}", "threads=1", f"geo.rounds={rounds}", f"geo.eval_every={rounds + 1000}",
            f"geo.workers_per_site={workers_per_site}", f"data.test_samples={test_samples}"]


def run(scenario_path: str = "scenarios/geo_hips.yaml", *, rounds: int = 30, workers_per_site: int = 2,
        mbps: float | None = 20.0, model: str = "small_cnn", extra_sets: list[str] = (), out: Path | None = None,
        keep: bool = False, timeout_s: float = 600.0, test_samples: int = 500, delay_ms: float = 0.0,
        reuse: Path | None = None, late_site: str | None = None, late_at_s: float = 3.0,
        calibrate_from: Path | None = None, profile: Path | None = None, apriori_sets: list[str] = ()) -> dict:
    """The real run over namespaced sites, then emu: replays of its compute and an ``emu run``
    calibrated from it; or, with ``profile`` (``emu calibrate``'s, made before), only the a-priori
    ``emu run`` under that profile and ``apriori_sets`` (``compare_apriori``; tools/fidelity.py)."""
    from dtemu.core.geo.spec import central_site
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params
    from dtemu.host.scenario_file import load_scenario
    from dtemu.emu.costs import cpu_sets, geo_cpu_costs, geo_decode_cost, transport_sets
    from dtemu.real.message_costs import message_costs

    out = Path(out or ROOT / "runs" / f"netns-geo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    args = {"scenario_path": scenario_path, "rounds": rounds, "workers_per_site": workers_per_site, "mbps": mbps,
            "model": model, "extra_sets": list(extra_sets), "test_samples": test_samples, "late_site": late_site,
            "late_at_s": late_at_s}
    if reuse is not None:   # emu again on that run's own settings, whatever this command line says
        old_args = json.loads((Path(reuse) / "netns_geo.json").read_text())["config"].get("args")
        if old_args:
            args = old_args
            scenario_path, rounds, workers_per_site, mbps, model, extra_sets, test_samples = (
                args[k] for k in ("scenario_path", "rounds", "workers_per_site", "mbps", "model", "extra_sets",
                                  "test_samples"))
            late_site, late_at_s = args.get("late_site"), args.get("late_at_s", late_at_s)
    sets = base_sets(rounds, workers_per_site, model, test_samples)
    sites = list(load_scenario(scenario_path, sets + list(extra_sets)).network.sites)
    if mbps is not None:
        sets += [f"network.sites.{s}.wan.{d}_mbps={mbps:g}" for s in sites for d in ("up", "down")]
    sets += list(extra_sets)
    late_nodes = []
    if late_site is not None:   # the site comes up late_at_s after the start line and joins the run
        first = load_scenario(scenario_path, sets)
        if late_site not in first.network.sites or late_site == central_site(first.network.sites,
                                                                             first.network.central):
            raise NetnsError(f"--late-site {late_site}: not a site with workers of {scenario_path}")
        late_nodes = [n for n in first.node_names if first.site_of[n] == late_site]
        sets += ["geo.joining=true", f"geo.start_wait_s={LATE_START_WAIT_S:g}"]
    real_sets = sets + ([_offline_set(late_nodes, late_at_s)] if late_nodes else [])
    scen = load_scenario(scenario_path, real_sets)
    if not scen.kind.places_nodes_in_sites(scen) or not scen.network.sites:
        raise NetnsError(f"{scenario_path} is not a geo scenario with sites")
    wan = [(scen.network.sites[s].wan.up_mbps, scen.network.sites[s].wan.down_mbps) for s in sites]
    placement = [sites.index(scen.site_of[n]) for n in scen.node_names]
    # DDS discovery is unicast to every port a participant index up to this may use, per peer
    # address: the default (100) sends ~100 discovery messages per peer and participant across the
    # shaped WAN; the most ranks in one namespace, and a spare, is enough.
    os.environ.setdefault("DTEMU_DDS_MAX_PARTICIPANTS", str(max(placement.count(i) for i in set(placement)) + 2))
    if reuse is not None:
        old = json.loads((Path(reuse) / "netns_geo.json").read_text())
        bed_info = {k: old[k] for k in ("real_summary", "qdisc", "drops", "namespaces", "addresses") if k in old}
        cfg_old = old["config"]
        rtt, lan = cfg_old["rtt_ms"], {"rtt_ms": cfg_old["lan_rtt_ms"], "mbps": cfg_old["lan_mbps"]}
        netem, applied = cfg_old["netem"], cfg_old["applied_delay_ms"]
        if Path(reuse).resolve() != out:
            import shutil

            shutil.copytree(Path(reuse) / "real", out / "real", dirs_exist_ok=True)
    else:
        bed = SiteTestbed(sites, wan, delay_ms=delay_ms)
        bed_info = run_testbed(scenario_path, real_sets, out, mbps=max(max(w) for w in wan), delay_ms=delay_ms,
                               keep=keep, timeout_s=timeout_s, bed=bed, placement=placement,
                               start_line_s=START_LINE_S)
        rtt, lan, netem, applied = bed_info["rtt_ms"], bed.lan, bed.netem, bed.applied_delay_ms
        bed_info["drops"] = {ns: {k: v - bed.drops_before.get(ns, {}).get(k, 0) for k, v in counts.items()}
                             for ns, counts in bed_info.get("drops", {}).items()}
        print(f"netns: sites {dict(zip(sites, bed_info['namespaces']))}, LAN {lan}", file=sys.stderr, flush=True)
    real_events = read_events_partial(out / "real")[0]

    # emu's network: the LAN a site's namespace has, the WAN the run had (latency: the rest of the RTT).
    lan_latency = lan["rtt_ms"] / 4
    wan_latency = applied + max(0.0, rtt / 4 - lan_latency)
    lan_mbps = lan["mbps"] if lan["mbps"] == lan["mbps"] else 10000.0
    net = [f"network.sites.{s}.lan={{bandwidth_mbps: {lan_mbps:.0f}, latency_ms: {lan_latency:.4f}}}" for s in sites]
    net += [f"network.sites.{s}.wan.latency_ms={wan_latency:.4f}" for s in sites]
    # --calibrate-from: every CPU cost below times the in-situ factor of another run (in_situ_factor)
    scale = in_situ(calibrate_from)["factor"] if calibrate_from is not None else 1.0
    cores = os.cpu_count() or 1
    decode, transport, cpu, messages, full = None, [], {}, {}, []
    if profile is None or late_nodes:  # (a profile has these costs: not measured again)
        decode = scale * geo_decode_cost(num_params(build_model(scen.model_spec, scen.seed)), scen.geo.fp16)
        transport = transport_sets({n: decode for n in scen.node_names})
        # The roles' CPU outside the gradient, measured here now (one thread), and the cores every
        # rank shares for real (the ranks are processes of this one machine).
        cpu, messages = geo_cpu_costs(scen), message_costs(path="dds")   # (the ranks' lan profile)
        cpu = {k: v * scale for k, v in cpu.items()}
        messages = {k: v * scale for k, v in messages.items()}
        full = transport + cpu_sets(cpu, cores, messages)
    result = {"config": {"scenario": scen.name, "model": scen.model, "architecture": scen.geo.architecture,
                         "sync": scen.geo.sync, "compression": scen.geo.compression, "sites": sites,
                         "central": central_site(scen.network.sites, scen.network.central),
                         "workers_per_site": scen.geo.workers_per_site, "ranks": len(scen.node_names),
                         "rounds": rounds, "wan_mbps": wan, "netem": netem, "applied_delay_ms": applied,
                         "rtt_ms": rtt, "lan_rtt_ms": lan["rtt_ms"], "lan_mbps": lan["mbps"],
                         "emu_lan_mbps": lan_mbps, "emu_lan_latency_ms": lan_latency,
                         "emu_wan_latency_ms": wan_latency, "decode_s_per_mb": decode, "transport_sets": transport,
                         "cpu_s_per_mb": cpu, "s_per_message": messages, "shared_cores": cores,
                         "sets": sets, "args": args, "placement": dict(zip(scen.node_names, [sites[i] for i in placement])),
                         "cpu_scale": scale, "calibrated_from": str(calibrate_from) if calibrate_from else None,
                         "profile": str(profile) if profile is not None else None},
              **bed_info}
    result["wan_overhead"] = wan_overhead(result.get("qdisc", {}), real_events, scen.site_of, sites,
                                          result.get("namespaces") or result["config"].get("namespaces", []))
    sha = {"real": result["real_summary"].get("model_sha256")}
    if late_nodes:   # emu with the site up within the round real let it in at (it depends on the timing)
        result["late"] = late_replay(scenario_path, sets + net + full, out, real_events, late_nodes, late_at_s)
        result["compare_replay"] = compare(real_events, read_events_partial(out / "emu-replay")[0])
        sha["emu-replay"] = result["late"]["emu_summary"].get("model_sha256")
        result["sha256"] = sha
        result["wan_bytes"] = {"real": result["real_summary"].get("wan_bytes"),
                               "emu": result["late"]["emu_summary"].get("wan_bytes")}
        (out / "netns_geo.json").write_text(json.dumps(result, indent=2, default=str))
        (out / "netns_geo.md").write_text(markdown(result))
        return result
    if profile is not None:  # a priori: this machine's profile and the testbed's links
        t0 = time.monotonic()
        summary = run_emu(scenario_path, sets + net + list(apriori_sets), out / "emu-apriori", profile=profile)
        print(f"netns: emu run a priori {time.monotonic() - t0:.1f} s -> {out / 'emu-apriori'}", file=sys.stderr,
              flush=True)
        result["compare_apriori"] = compare(real_events, read_events_partial(out / "emu-apriori")[0])
        result["emu_summary"] = summary
        result["sha256"] = {**sha, "emu-apriori": summary.get("model_sha256")}
        (out / "netns_geo.json").write_text(json.dumps(result, indent=2, default=str))
        return result
    for key, folder, extra in (("compare_replay", "emu-replay", full),
                               ("compare_replay_own_cores", "emu-replay-own-cores",
                                transport + cpu_sets(cpu, 0, messages)),
                               ("compare_replay_ops", "emu-replay-ops", transport + cpu_sets(cpu, cores)),
                               ("compare_replay_transport", "emu-replay-transport", transport),
                               ("compare_replay_payload", "emu-replay-payload", [])):
        t0 = time.monotonic()
        summary = run_emu_replay(scenario_path, sets + net + extra, out / folder, compute_times(real_events))
        print(f"netns: emu replay {time.monotonic() - t0:.1f} s -> {out / folder}", file=sys.stderr, flush=True)
        result[key] = compare(real_events, read_events_partial(out / folder)[0])
        sha[folder] = summary.get("model_sha256")
    cal = calibrate(real_events, scen.geo.batch_size)
    emu_sets = sets + net + full + [f"compute.nodes.{n}.train_s_per_sample={v:.6g}" for n, v in sorted(cal.items())]
    t0 = time.monotonic()
    summary = run_emu(scenario_path, emu_sets, out / "emu")
    print(f"netns: emu run {time.monotonic() - t0:.1f} s -> {out / 'emu'}", file=sys.stderr, flush=True)
    result["compare"] = compare(real_events, read_events_partial(out / "emu")[0])
    result["emu_summary"] = summary
    result["config"]["train_s_per_sample"] = cal
    sha["emu"] = summary.get("model_sha256")
    result["sha256"] = sha
    result["wan_bytes"] = {"real": result["real_summary"].get("wan_bytes"), "emu": summary.get("wan_bytes")}
    (out / "netns_geo.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "netns_geo.md").write_text(markdown(result))
    return result


def main(argv=None) -> int:
    p = testbed_parser("netns_geo", __doc__, "scenarios/geo_hips.yaml")
    p.set_defaults(mbps=20.0, delay_ms=0.0)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--workers-per-site", type=int, default=2)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--test-samples", type=int, default=500)
    p.add_argument("--late-site", default=None, metavar="SITE",
                   help="this site's ranks come up --late-at seconds after the start line and join the run "
                        "(geo.joining); emu is replayed with the site up in the round it joined at for real")
    p.add_argument("--late-at", type=float, default=3.0, metavar="S")
    p.add_argument("--calibrate-from", default=None, metavar="DIR",
                   help="scale every CPU cost of emu's prediction by the in-situ factor of that earlier "
                        "netns_geo run (its real steps against its replay's; see in_situ)")
    args = p.parse_args(argv)
    return run_comparison("netns_geo", args, lambda: run(
        args.scenario, rounds=args.rounds, workers_per_site=args.workers_per_site, mbps=args.mbps,
        model=args.model, extra_sets=args.sets, out=args.out, keep=args.keep, timeout_s=args.timeout,
        test_samples=args.test_samples, delay_ms=args.delay_ms, reuse=args.reuse_real, late_site=args.late_site,
        late_at_s=args.late_at, calibrate_from=args.calibrate_from), markdown)


if __name__ == "__main__":
    sys.exit(main())
