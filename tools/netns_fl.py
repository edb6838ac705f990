"""Three "machines" on one box: an FL scenario for real across network namespaces, against emu.

    sudo .venv/bin/python -m tools.netns_fl [--scenario scenarios/fl_codecs.yaml]
        [--rounds 4] [--subset 1000] [--mbps 100] [--delay-ms 2] [--set KEY=VALUE ...]
        [--out DIR] [--md FILE.md] [--keep]

Needs root.  The testbed is real.machine_net's (what ``real launch --machines netns``
makes; docs/netns.md): a namespace per node on 10.231.0.0/16 behind one veth to a bridge,
no route out, each link shaped both ways with tbf at ``--mbps`` (netem delay in front where
the kernel has it; this box's has none, and emu is then given the measured base latency),
torn down at the end (``finally`` + SIGTERM/SIGINT handlers; ``--keep`` leaves it up).
This tool keeps what the product does not: runs of its own, its replays and comparisons.

* rank N runs ``python -m dtemu.real.cli run SCEN --rank N --profile lan --peers
  <the other nodes' addresses> --domain D --no-tui`` under ``ip netns exec``
  with ``DTEMU_DDS_INTERFACE=eth0``.

Then emu runs the same scenario with ``network.default = {up_mbps, down_mbps:
<mbps>, latency_ms: <per-link one-way>}`` and each client's
``compute.nodes.<client>.train_s_per_sample`` calibrated from the real run:
the mean over rounds of (upload_start - train_start) / samples of that client
(training plus computing and encoding the delta), so that the comparison is
about the network.  Evaluation only after the last round
(``fl.eval_every`` > rounds): real evaluation takes wall time between rounds,
emu's is free, and the model download would overlap it in one world only.

Reported per round: real and emu round time (controller's round_start ->
round_close), the error (emu - real) / real, and the same for the
communication part (round time minus the slowest client's training time).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dtemu.core.runtime.network_spec import LinkSpec
from dtemu.host.rundir import read_events_partial
from dtemu.host.testbed_check import unavailable
from dtemu.real.machine_net import PREFIX, SUBNET, MachineNet, NetError

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = 7
DEFAULT_SETS = ()


NetnsError = NetError   # (the tools' name for it)


def netns_available() -> tuple[bool, str]:
    """(True, "") if this process may make the testbed's namespaces, veths, tc and groups, else (False, why)."""
    why = unavailable()
    return why is None, why or ""


class Testbed(MachineNet):
    """real.machine_net's namespaces, veths, bridge and shaping (what real launch --machines makes), with
    every node's link at ``mbps`` both ways (or ``links``, one per node), as a context manager that always
    cleans up; and the measurements the tools take of it (round trips, counters)."""

    def __init__(self, nodes: int = 3, mbps: float = 100.0, delay_ms: float = 2.0, tag: str | None = None,
                 mtu: int = 1500, links: list[LinkSpec] | None = None):
        links = links or [LinkSpec(mbps, mbps, delay_ms)] * nodes
        super().__init__(tag or f"dtfl{os.getpid() % 100000}", links, mtu)
        self.nodes, self.mbps, self.delay_ms = len(links), mbps, delay_ms

    @property
    def applied_delay_ms(self) -> float:
        return self.delay_ms if self.netem else 0.0

    def qdisc_stats(self) -> dict[str, str]:
        out = {}
        for ns, dev in [(n, "eth0") for n in self.names] + [(self.switch, f"p{i}") for i in range(self.nodes)]:
            p = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev],
                               capture_output=True, text=True)
            out[f"{ns}:{dev}"] = p.stdout.strip()
        return out

    def drop_counters(self) -> dict[str, dict[str, int]]:
        """Each node's kernel counters of datagrams it lost (receive buffer full, IP reassembly
        failed): a lost fragment costs real DDS a NACK round, which emu does not model."""
        keys = ("UdpRcvbufErrors", "UdpSndbufErrors", "UdpInErrors", "IpReasmFails", "IpReasmTimeout")
        out = {}
        for ns in self.names:
            p = subprocess.run(["ip", "netns", "exec", ns, "nstat", "-az"], capture_output=True, text=True)
            counts = {}
            for line in p.stdout.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] in keys:
                    counts[parts[0]] = int(parts[1])
            out[ns] = counts
        return out

    def rtt_ms(self, a: int = 1, b: int = 0, count: int = 20) -> float:
        """Median UDP round trip (64 B) from node a to node b, in ms (python echo, bounded)."""
        port = 47000 + os.getpid() % 1000
        echo = subprocess.Popen(self.exec_prefix(b) + [sys.executable, "-c", _ECHO, self.addresses[b], str(port),
                                                       str(count + 5)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            echo.stdout.readline()  # "ready"
            p = subprocess.run(self.exec_prefix(a) + [sys.executable, "-c", _PING, self.addresses[b], str(port),
                                                      str(count)], capture_output=True, text=True, timeout=30)
            return float(p.stdout.strip())
        finally:
            echo.kill()
            echo.wait()


_ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(10)
print("ready", flush=True)
for _ in range(int(sys.argv[3])):
    try:
        d, a = s.recvfrom(2048)
    except OSError:
        break
    s.sendto(d, a)
"""
_PING = """
import socket, statistics, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.0)
rtts = []
for i in range(int(sys.argv[3])):
    t = time.perf_counter(); s.sendto(b"x" * 64, (sys.argv[1], int(sys.argv[2])))
    try:
        s.recvfrom(2048); rtts.append(time.perf_counter() - t)
    except OSError:
        pass
    time.sleep(0.01)
print(statistics.median(rtts) * 1e3 if rtts else float("nan"))
"""


# ---------------------------------------------------------------------------------------------
# runs


def round_times(events: list[dict]) -> dict[int, float]:
    """round -> round_close - round_start (the controller's events; a retried round: its last try)."""
    start, out = {}, {}
    for e in events:
        if e.get("node") != "controller":
            continue
        if e["kind"] == "round_start":
            start[e["round"]] = e["t"]
        elif e["kind"] == "round_close" and e["round"] in start:
            out[e["round"]] = e["t"] - start[e["round"]]
    return out


def train_times(events: list[dict]) -> dict[str, dict[int, tuple[float, int]]]:
    """client -> round -> (upload_start - train_start, samples)."""
    start: dict = {}
    out: dict = {}
    for e in events:
        if e["kind"] == "train_start":
            start[(e["node"], e["round"])] = (e["t"], e["samples"])
        elif e["kind"] == "upload_start" and (e["node"], e["round"]) in start:
            t0, n = start[(e["node"], e["round"])]
            out.setdefault(e["node"], {})[e["round"]] = (e["t"] - t0, n)
    return out


def run_real(bed: Testbed, scenario_path: str, sets: list[str], out: Path, timeout_s: float,
             threads: int = 1, placement: list[int] | None = None, start_line_s: float | None = None) -> dict:
    """Every rank in its namespace; returns the merged summary (real.launch.gather).

    ``placement``: the namespace of each rank (default rank i in namespace i); ranks that share
    a namespace (tools/netns_geo.py: one per site) also list its own address as a peer, so that
    they discover each other (over its loopback route).  ``start_line_s``: the ranks meet at real
    mode's start line (real.start_line) as under ``real launch``, and it is given this many
    seconds after the last rank is ready, for DDS discovery over the shaped links to settle
    before any role sends (geo's roles send without waiting for their peers).

    A rank down from the start (a ``faults.offline`` window from 0 to ``end_s``: a geo site that
    joins late) is started with the others and held until ``end_s`` after the start line, as
    ``real launch`` does (real.start_line); other offline windows need ``real launch``'s kills and
    are refused here."""
    from dtemu.host.scenario_file import load_scenario
    from dtemu.real.launch import gather

    scenario = load_scenario(scenario_path, sets)
    ranks = len(scenario.node_names)
    held = {}
    for w in scenario.faults.offline:
        if w.start_s != 0 or w.end_s is None or start_line_s is None:
            raise NetnsError(f"faults.offline {w.node} [{w.start_s}, {w.end_s}]: the netns testbed holds a rank "
                             "down from 0 to end_s (with a start line); kills are real launch's")
        held[scenario.node_names.index(w.node)] = w.end_s
    ns_of = list(placement) if placement is not None else list(range(ranks))
    if len(ns_of) != ranks or (placement is None and ranks != bed.nodes) or max(ns_of) >= bed.nodes:
        raise NetnsError(f"{scenario.name} has {ranks} ranks, the testbed {bed.nodes} nodes")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DTEMU_DDS_INTERFACE="eth0", OMP_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DTEMU_DDS_PEERS", None)
    start_file = out / "start.json"
    if start_line_s is not None:
        from dtemu.real.start_line import HOLD, START_FILE, is_ready, write_start

        start_file.unlink(missing_ok=True)
        env[START_FILE] = str(start_file.resolve())
    procs = []
    started = time.monotonic()
    try:
        for rank in range(ranks):
            own = ns_of[rank]
            peers = ",".join(a for j, a in enumerate(bed.addresses) if j != own or ns_of.count(own) > 1)
            cmd = bed.exec_prefix(own) + [
                sys.executable, "-m", "dtemu.real.cli", "run", scenario_path, "--rank", str(rank),
                "--profile", "lan", "--peers", peers, "--domain", str(DOMAIN), "--out", str(out / f"rank{rank}"),
                "--no-tui", "--threads", str(threads)]
            for s in sets:
                cmd += ["--set", s]
            log = open(out / f"rank{rank}.log", "wb")
            rank_env = env if rank not in held else {**env, HOLD: repr(held[rank])}
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=rank_env, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        deadline = started + timeout_s
        while procs[0].poll() is None:
            if start_line_s is not None and not start_file.exists() and all(
                    p.poll() is not None or r in held or is_ready(out / f"rank{r}") for r, p in enumerate(procs)):
                time.sleep(start_line_s)
                write_start(start_file, time.time())
            if time.monotonic() > deadline:
                raise NetnsError(f"the controller did not finish in {timeout_s:g}s; logs in {out}")
            time.sleep(0.2)
        grace = time.monotonic() + 20
        for p in procs[1:]:
            try:
                p.wait(timeout=max(0.1, grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    summary = gather(out, scenario, time.monotonic() - started, codes=dict(enumerate(codes)))
    summary["exit_codes"] = codes
    if codes[0] != 0:
        tail = (out / "rank0.log").read_text(errors="replace")[-2000:]
        raise NetnsError(f"the controller exited with {codes[0]}:\n{tail}")
    return summary


def run_emu(scenario_path: str, sets: list[str], out: Path, profile: Path | None = None) -> dict:
    """``emu run`` (the CLI) of the scenario with ``sets`` (and a calibration ``profile`` under them)."""
    cmd = [sys.executable, "-m", "dtemu.emu.cli", "run", scenario_path, "--out", str(out), "--no-tui"]
    if profile is not None:
        cmd += ["--profile", str(profile)]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise NetnsError(f"emu failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def run_emu_replay(scenario_path: str, sets: list[str], out: Path, per_round: dict[str, dict[int, tuple]]) -> dict:
    """emu in this process, each client's training taking exactly the time it took for real in that round.

    ``emu.run.ComputeTimer`` is swapped for a timer that replays the measured
    (upload_start - train_start) of each client, round by round, and the
    training itself is skipped (a stand-in workload returns the base weights
    plus a tiny delta: an fp32 update has the same size whatever its values),
    so only emu's network and runtime decide the rest of the round.
    """
    import numpy as np

    import dtemu.emu.run as er
    from dtemu.host.scenario_file import load_scenario
    from dtemu.core.ml.train import TrainResult
    from dtemu.core.ml.workload import Workload
    from dtemu.host.datasets import load_for

    scenario = load_scenario(scenario_path, sets)
    names = scenario.node_names
    base = er.ComputeTimer

    class ReplayTimer(base):
        def __init__(self, spec, reference, seed, **timing):   # (timing: the batch its warm-up steps by)
            super().__init__(spec, reference or 1e-3, seed, **timing)
            node = names[seed[1]]
            self.queue = [per_round[node][r][0] for r in sorted(per_round.get(node, {}))]

        def duration(self, samples, kind="train", now=0.0, nbytes=0):
            if kind == "train" and samples > 0 and self.queue:
                return self.queue.pop(0)
            return super().duration(samples, kind, now=now, nbytes=nbytes)

    class TimingOnly(Workload):
        def train(self, weights, cmd, client):
            n = cmd.epochs * self.subset_size(client, cmd.subset)
            steps = -(-n // scenario.fl.batch_size)
            return weights + np.float32(1e-6), TrainResult(steps=steps, samples=n, mean_loss=0.0)

        def evaluate(self, weights):
            return 0.0

    er.ComputeTimer = ReplayTimer
    try:
        return er.run_emulation(scenario, out, work=TimingOnly(scenario, load_for(scenario)))
    finally:
        er.ComputeTimer = base


def compare(real_events: list[dict], emu_events: list[dict]) -> dict:
    real_rt, emu_rt = round_times(real_events), round_times(emu_events)
    real_tt, emu_tt = train_times(real_events), train_times(emu_events)
    rows = []
    for r in sorted(set(real_rt) & set(emu_rt)):
        real_train = max((tt[r][0] for tt in real_tt.values() if r in tt), default=0.0)
        emu_train = max((tt[r][0] for tt in emu_tt.values() if r in tt), default=0.0)
        real_comm, emu_comm = real_rt[r] - real_train, emu_rt[r] - emu_train
        rows.append({"round": r, "real_s": real_rt[r], "emu_s": emu_rt[r],
                     "error_pct": 100 * (emu_rt[r] - real_rt[r]) / real_rt[r],
                     "real_train_s": real_train, "emu_train_s": emu_train,
                     "real_comm_s": real_comm, "emu_comm_s": emu_comm,
                     "comm_error_pct": 100 * (emu_comm - real_comm) / real_comm if real_comm > 0 else float("nan")})
    mean = {k: statistics.fmean(r[k] for r in rows) for k in
            ("real_s", "emu_s", "error_pct", "real_comm_s", "emu_comm_s", "comm_error_pct")} if rows else {}
    if rows:
        mean["abs_error_pct"] = statistics.fmean(abs(r["error_pct"]) for r in rows)
        mean["abs_comm_error_pct"] = statistics.fmean(abs(r["comm_error_pct"]) for r in rows)
    return {"rounds": rows, "mean": mean}


def calibrate(real_events: list[dict]) -> dict[str, float]:
    """client -> mean seconds per sample of (upload_start - train_start)."""
    out = {}
    for node, per_round in train_times(real_events).items():
        out[node] = statistics.fmean(dt / n for dt, n in per_round.values() if n > 0)
    return out


def _table(cmp: dict) -> list[str]:
    lines = ["| round | real s | emu s | error % | real comm s | emu comm s | comm error % |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in cmp["rounds"]:
        lines.append(f"| {r['round']} | {r['real_s']:.3f} | {r['emu_s']:.3f} | {r['error_pct']:+.1f} | "
                     f"{r['real_comm_s']:.3f} | {r['emu_comm_s']:.3f} | {r['comm_error_pct']:+.1f} |")
    m = cmp["mean"]
    if m:
        lines.append("| mean | " + mean_cells(m))
    return lines


def mean_cells(m: dict) -> str:
    """A table's mean row after its label: times, errors and their absolute means (netns_fl, netns_ddp)."""
    return (f"{m['real_s']:.3f} | {m['emu_s']:.3f} | {m['error_pct']:+.1f} (abs {m['abs_error_pct']:.1f}) | "
            f"{m['real_comm_s']:.3f} | {m['emu_comm_s']:.3f} | "
            f"{m['comm_error_pct']:+.1f} (abs {m['abs_comm_error_pct']:.1f}) |")


def markdown(result: dict) -> str:
    cfg = result["config"]
    lines = [f"FL over network namespaces vs emu: {cfg['scenario']} ({cfg['model']}, {cfg['model_bytes'] / 1e6:.2f} MB "
             f"model), {cfg['rounds']} rounds, subset {cfg['subset']}, links {cfg['mbps']:g} Mbit/s each way, "
             f"delay per link and direction {cfg['applied_delay_ms']:g} ms (asked {cfg['delay_ms']:g} ms; netem "
             f"{'yes' if cfg['netem'] else 'not in this kernel'}), measured UDP RTT {cfg['rtt_ms']:.3f} ms; "
             f"emu latency_ms per link {cfg['emu_latency_ms']:.4f}; emu train_s_per_sample "
             + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in cfg["train_s_per_sample"].items()) + ".",
             "", "Emu's model of real mode's transport (`" + "`, `".join(cfg.get("transport_sets", [])) + "`); "
             "decoding measured on this machine (dtemu.emu.costs, `emu calibrate`): "
             + ", ".join(f"{k} {v * 1e3:.3f} ms/MB" for k, v in cfg.get("decode_s_per_mb", {}).items()) + "."]
    if result.get("wire_overhead"):
        lines += ["", "Bytes on the shaped links (tc) against the payload the node sent: "
                  + ", ".join(f"{k} {v['qdisc_bytes'] / 1e6:.2f} MB for {v['payload_bytes'] / 1e6:.2f} MB "
                              f"(+{v['overhead_pct']:.2f}%)" for k, v in result["wire_overhead"].items())
                  + f"; emu's rtps framing adds {result.get('model_overhead_pct', 0):.2f}% to the model."]
    for key, title in (("compare", "emu run with the transport model and the calibrated train_s_per_sample "
                                   "(per client, mean over rounds):"),
                       ("compare_replay", "emu with the transport model, each client's measured training time "
                                          "replayed round by round (only the network and the runtime modelled):"),
                       ("compare_replay_payload", "the same replay with emu's defaults (payload bytes only, a send "
                                                  "returns when its flows end, no decoding time):")):
        if key in result:
            lines += ["", title, ""] + _table(result[key])
    lines += ["", "comm = round time minus the slowest client's train_start -> upload_start "
              "(what is left: command, model tail, uploads, decoding)."]
    return "\n".join(lines) + "\n"


def wire_overhead(qdisc: dict[str, str], real: Path, names: list[str], tag_names: list[str]) -> dict:
    """Each node's uplink: bytes its tbf sent (headers and all) against the payload the node sent
    (its rank's record in ``real``/rank<i>/summary.json)."""
    import re

    out = {}
    for rank, (name, ns) in enumerate(zip(names, tag_names)):
        text = qdisc.get(f"{ns}:eth0", "")
        m = re.search(r"Sent (\d+) bytes (\d+) pkt", text)
        try:
            payload = json.loads((real / f"rank{rank}" / "summary.json").read_text()).get("bytes_sent")
        except (OSError, ValueError):
            payload = None
        if m and payload:
            sent = int(m.group(1))
            out[name] = {"qdisc_bytes": sent, "packets": int(m.group(2)), "payload_bytes": payload,
                         "overhead_pct": 100 * (sent - payload) / payload}
    return out


def run_testbed(scenario_path: str, sets: list[str], out: Path, *, mbps: float, delay_ms: float, keep: bool,
                timeout_s: float, nodes: int = 3, bed: Testbed | None = None,
                placement: list[int] | None = None, start_line_s: float | None = None) -> dict:
    """The real run over the namespaces: its summary, RTT, shaping and the qdiscs' counters
    (``bed``: a testbed built elsewhere, not yet up; ``placement``, ``start_line_s``: see run_real)."""
    bed = bed or Testbed(nodes=nodes, mbps=mbps, delay_ms=delay_ms)
    result: dict = {}

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        bed.up()
        rtt = bed.rtt_ms(1, 0)
        print(f"netns: {bed.names} on {SUBNET}.0.0/{PREFIX}, {mbps:g} Mbit/s, delay "
              f"{bed.applied_delay_ms:g} ms/link/direction (netem: {bed.netem}), UDP RTT {rtt:.3f} ms",
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        result["real_summary"] = run_real(bed, scenario_path, sets, out / "real", timeout_s, placement=placement,
                                          start_line_s=start_line_s)
        print(f"netns: real run {time.monotonic() - t0:.1f} s -> {out / 'real'}", file=sys.stderr, flush=True)
        result["qdisc"] = bed.qdisc_stats()
        result["drops"] = bed.drop_counters()
    finally:
        if keep:
            print(f"netns: kept {bed.created}; remove with: " + "; ".join(f"ip netns del {n}" for n in bed.created),
                  file=sys.stderr)
        else:
            bed.down()
        for s, h in old.items():
            signal.signal(s, h)
    if any(v for counts in result.get("drops", {}).values() for v in counts.values()):
        print(f"netns: datagrams lost in the kernel: {result['drops']}", file=sys.stderr, flush=True)
    result.update({"rtt_ms": rtt, "netem": bed.netem, "applied_delay_ms": bed.applied_delay_ms,
                   "namespaces": bed.names, "addresses": bed.addresses})
    return result


def reuse_testbed(folder: Path) -> dict:
    """A real run made before (``--reuse-real``): what run_testbed returned then, from its JSON."""
    for name in ("netns_fl.json", "netns_ddp.json"):
        if (folder / name).exists():
            old = json.loads((folder / name).read_text())
            cfg = old["config"]
            return {"real_summary": old["real_summary"], "qdisc": old.get("qdisc", {}), "rtt_ms": cfg["rtt_ms"],
                    "netem": cfg["netem"], "applied_delay_ms": cfg["applied_delay_ms"],
                    "namespaces": cfg["namespaces"], "addresses": cfg["addresses"]}
    raise NetnsError(f"no netns_fl.json or netns_ddp.json in {folder}")


def run(scenario_path: str = "scenarios/fl_codecs.yaml", *, rounds: int = 4, subset: int = 1000,
        mbps: float = 100.0, delay_ms: float = 2.0, extra_sets: list[str] = (), out: Path | None = None,
        keep: bool = False, timeout_s: float = 600.0, test_samples: int = 2000, reuse: Path | None = None) -> dict:
    from dtemu.host.scenario_file import load_scenario
    from dtemu.emu.costs import transport_sets
    from dtemu.emu.federation_costs import fl_decode_costs

    out = Path(out or ROOT / "runs" / f"netns-fl-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    sets = [f"fl.rounds={rounds}", f"fl.subset={subset}", f"fl.eval_every={rounds + 1000}",
            f"data.test_samples={test_samples}", "fl.min_clients=2", *extra_sets]
    if reuse is not None:
        bed = reuse_testbed(Path(reuse))
        if Path(reuse).resolve() != out:
            import shutil

            shutil.copytree(Path(reuse) / "real", out / "real", dirs_exist_ok=True)
    else:
        nodes = len(load_scenario(scenario_path, sets).node_names)   # a machine per rank
        bed = run_testbed(scenario_path, sets, out, mbps=mbps, delay_ms=delay_ms, keep=keep, timeout_s=timeout_s,
                          nodes=nodes)
    real_summary, rtt = bed["real_summary"], bed["rtt_ms"]
    real_events = read_events_partial(out / "real")[0]
    scen = load_scenario(scenario_path, sets)
    cal = calibrate(real_events)
    # Real mode's transport in emu: headers, the writer's history, and the receivers' decoding,
    # measured here on messages of this model (not fitted to the run).
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params

    costs = fl_decode_costs(num_params(build_model(scen.model_spec, scen.seed)))
    decode = {name: costs["client"] for name in scen.client_names}
    decode[scen.node_names[0]] = costs["controller"]
    transport = transport_sets(decode)
    # One-way latency per link: the delay netem adds plus this box's base (a quarter of the RTT:
    # four link crossings per round trip).
    latency_ms = bed["applied_delay_ms"] + rtt / 4
    network = f"network.default={{up_mbps: {mbps:g}, down_mbps: {mbps:g}, latency_ms: {latency_ms:.4f}}}"
    emu_sets = sets + [network, f"compute.default.train_s_per_sample={statistics.fmean(cal.values()):.6g}"]
    emu_sets += [f"compute.nodes.{node}.train_s_per_sample={v:.6g}" for node, v in sorted(cal.items())]
    t0 = time.monotonic()
    emu_summary = run_emu(scenario_path, emu_sets + transport, out / "emu")
    print(f"netns: emu run {time.monotonic() - t0:.1f} s -> {out / 'emu'}", file=sys.stderr, flush=True)
    emu_events = read_events_partial(out / "emu")[0]
    compares = {}
    for key, folder, extra in (("compare_replay", "emu-replay", transport), ("compare_replay_payload",
                                                                             "emu-replay-payload", [])):
        t0 = time.monotonic()
        run_emu_replay(scenario_path, sets + [network] + extra, out / folder, train_times(real_events))
        print(f"netns: emu replay run {time.monotonic() - t0:.1f} s -> {out / folder}", file=sys.stderr, flush=True)
        compares[key] = compare(real_events, read_events_partial(out / folder)[0])
    from dtemu.emu.wire_model import wire_bytes

    model_bytes = next((e["bytes"] for e in real_events if e["kind"] == "upload_start"), 0)
    result = {
        "config": {"scenario": scen.name, "model": scen.model, "model_bytes": model_bytes, "rounds": rounds,
                   "subset": subset, "mbps": mbps, "delay_ms": delay_ms, "applied_delay_ms": bed["applied_delay_ms"],
                   "netem": bed["netem"], "rtt_ms": rtt, "emu_latency_ms": latency_ms, "train_s_per_sample": cal,
                   "decode_s_per_mb": decode, "transport_sets": transport, "sets": sets, "emu_sets": emu_sets,
                   "namespaces": bed["namespaces"], "addresses": bed["addresses"]},
        "real_summary": real_summary, "emu_summary": emu_summary, "qdisc": bed["qdisc"], "drops": bed.get("drops", {}),
        "wire_overhead": wire_overhead(bed["qdisc"], out / "real", scen.node_names, bed["namespaces"]),
        "model_overhead_pct": 100 * (wire_bytes(model_bytes, scen.network.mtu) - model_bytes) / max(1, model_bytes),
        "compare": compare(real_events, emu_events),
        **compares,
    }
    (out / "netns_fl.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "netns_fl.md").write_text(markdown(result))
    return result


def testbed_parser(prog: str, doc: str, scenario: str) -> argparse.ArgumentParser:
    """The options every netns comparison takes (netns_fl, netns_ddp)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--scenario", default=scenario)
    p.add_argument("--mbps", type=float, default=100.0)
    p.add_argument("--delay-ms", type=float, default=2.0, help="per link and direction (needs sch_netem)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None)
    p.add_argument("--md", default=None, help="also write the Markdown tables here")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--keep", action="store_true", help="leave the namespaces up (then remove them yourself)")
    p.add_argument("--reuse-real", default=None, metavar="DIR",
                   help="compare with the real run of an earlier --out DIR instead of running one (no root needed)")
    return p


def run_comparison(prog: str, args, compare, markdown) -> int:
    """``compare()`` (a real run over the namespaces unless --reuse-real, then emu), its tables
    printed (and written to --md); exit 2 without namespaces, 3 on a testbed error."""
    if args.reuse_real is None:
        ok, why = netns_available()
        if not ok:
            print(f"{prog}: {why}", file=sys.stderr)
            return 2
    try:
        result = compare()
    except NetnsError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (namespaces removed)", file=sys.stderr)
        return 130
    md = markdown(result)
    print(md)
    if args.md:
        Path(args.md).write_text(md)
    return 0


def main(argv=None) -> int:
    p = testbed_parser("netns_fl", __doc__, "scenarios/fl_codecs.yaml")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--subset", type=int, default=1000, help="samples per client per round")
    args = p.parse_args(argv)
    return run_comparison("netns_fl", args, lambda: run(
        args.scenario, rounds=args.rounds, subset=args.subset, mbps=args.mbps, delay_ms=args.delay_ms,
        extra_sets=args.sets, out=args.out, keep=args.keep, timeout_s=args.timeout, reuse=args.reuse_real),
        markdown)


if __name__ == "__main__":
    sys.exit(main())
