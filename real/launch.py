"""``real launch``: every rank of a scenario as its own process on this machine.

Ranks talk over the loopback profile on a domain of their own; the launcher
follows their ``events.jsonl`` files to drive one dashboard, stops stragglers
once the run is over (FL: when the controller exits), and gathers the ranks'
folders into one run folder that reads like emu's: ``events.jsonl`` (every
rank's events, by time), ``summary.json`` and ``rank<N>/``.

It also carries out the scenario's crashes: a rank that crashed at a protocol
point (exit code 100+i, see real/runtime.py) is restarted after the fault's
``restart_after_s`` (the controller with ``fl.init_path`` = its checkpoint), and
``faults.offline`` windows are enforced by SIGKILL at ``start_s`` and a restart
at ``end_s``; a rank down from the start (a window from 0) is started with the
others and held until ``end_s`` (real.start_line).  A restarted rank appends to
its events.jsonl.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from dtemu.host import cores, cpu_arith, heap
from dtemu.host.rundir import CHECKPOINT, read_events, write_json
from dtemu.core.scenario import CONTROLLER, Scenario, stretched

from dtemu.core import events as ev
from dtemu.core.runtime.summary import run_summary
from dtemu.real.primitives import CRASH_EXIT
from dtemu.real.start_line import HOLD, START_FILE, is_ready, write_start

GRACE_S = 15.0  # how long clients may take to exit after the controller did


class _Follower:
    """Reads the new complete lines of a growing events.jsonl."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


# A domain's ports are 7400 + 250 d (+ 10 + 2 i for participant i: CycloneDDS's defaults).  Above d = 100
# they fall in Linux's ephemeral range (32768-60999), where any socket's local port may already hold
# one, and the domain then fails to start ("cannot create DDS domain"; seen once in 65 slow tests).
MAX_DOMAIN = 100


def _domain_id() -> int:
    # A domain of our own, so that two launches on one machine do not meet.
    return 1 + os.getpid() % MAX_DOMAIN


def launch(args, scenario: Scenario) -> int:
    if getattr(args, "machines", None):   # the ranks on machines of their own (real.on_machines)
        from .on_machines import launch_on_machines

        return launch_on_machines(args, scenario, _launch)
    return _launch(args, scenario)


def _launch(args, scenario: Scenario, machines=None) -> int:
    from dtemu.host.dashboard import Dashboard

    out = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-real-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    ranks = len(scenario.node_names)
    domain = args.domain if args.domain is not None else _domain_id()
    # The scenario's thread count, as emu uses it: float reductions follow the thread count, so
    # another count would train another model.  Oversubscribing the cores only costs time.
    threads = args.threads or scenario.threads
    # Ranks whose threads outnumber the cores wait passively (host.cores): spinning ones starve the others.
    # (On the testbed's machines too: a rank that spins through its CPU share's quota is throttled.)
    policy = cores.wait_policy(ranks, threads)
    if policy:
        print(f"real launch: note: {ranks} ranks x {threads} torch threads on {cores.available()} cores: "
              f"OpenMP threads wait passively ({cores.WAIT}=PASSIVE)", file=sys.stderr)
    scale = args.time_scale
    if scale is None:
        from .calibrate import time_scale

        with cores.spawn_env(policy):  # measured as the ranks will train
            scale, how = time_scale(scenario)
        print(f"real launch: time scale {scale:g} ({how}); every scenario duration is stretched by it "
              f"(--time-scale 1 turns this off)", file=sys.stderr)
    scenario = stretched(scenario, scale)  # the launcher's own schedule (offline windows, restarts) too
    # One time origin for all ranks: the instant every rank is up (real.start_line), as emu's time 0.
    start_file = out / "start.json"
    start_file.unlink(missing_ok=True)
    env = {**os.environ, **policy, START_FILE: str(start_file.resolve()), "DTEMU_LAUNCHED": "1",
           heap.PRETOUCH: str(heap.pretouch_mb(processes=ranks))}   # this box's memory shared by its ranks
    if getattr(args, "key_file", None):
        env["DTEMU_KEY_FILE"] = str(Path(args.key_file).resolve())
    fired: dict[int, list[int]] = {r: [] for r in range(ranks)}
    gpus = [g.strip() for g in (getattr(args, "gpus", None) or "").split(",") if g.strip()]

    def start(rank: int, restart: bool = False, hold: float | None = None) -> subprocess.Popen:
        node = scenario.node_names[rank]
        cmd = [sys.executable, "-m", "dtemu.real.cli", "run", args.scenario, "--rank", str(rank),
               "--out", str(out / f"rank{rank}"), "--no-tui", "--domain", str(domain),
               "--threads", str(threads), "--time-scale", repr(scale)]
        if machines is not None:  # the testbed's links are the network: no pacing on top
            cmd += ["--profile", "lan", "--peers", machines.peers(node), "--links", machines.links_flag]
        else:
            cmd += ["--profile", args.profile] + (["--links", args.links] if args.links is not None else [])
        if args.no_code:
            cmd += ["--no-code"]
        for o in args.overrides:
            cmd += ["--set", o]
        if restart:
            cmd += ["--append", "--fired", ",".join(map(str, fired[rank]))]
            ckpt = out / f"rank{rank}" / CHECKPOINT
            if scenario.node_names[rank] == CONTROLLER and ckpt.exists():
                cmd += ["--set", f"fl.init_path={ckpt}"]
        log = open(out / f"rank{rank}.log", "ab" if restart else "wb")
        own = dict(env)
        if hold is not None:
            own[HOLD] = repr(hold)
        if gpus:   # one GPU a rank, round robin over the list (its process sees that one alone, as cuda:0)
            own["CUDA_VISIBLE_DEVICES"] = gpus[rank % len(gpus)]
        if machines is not None:
            own.update(machines.env())
            return subprocess.Popen(machines.command(node, cmd), stdout=log, stderr=subprocess.STDOUT, env=own,
                                    preexec_fn=machines.preexec(node))
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=own)

    schedule = _Schedule(scenario)
    # (started in the try below: an interrupt while they start stops the ones already up)
    procs: list[subprocess.Popen | None] = [None] * ranks
    epoch: float | None = None  # set when every rank is ready (and, on machines, discovery has settled)
    ready_at: float | None = None
    # Across shaped links DDS discovery takes a while after the ranks are up; roles that send at once
    # (geo's) would otherwise lose their first messages to it.
    settle = machines.settle_s if machines is not None else 0.0
    watch = None
    if machines is not None:
        from .on_machines import LiveVerdict, testbed_summary

        watch = LiveVerdict()
    followers = [_Follower(out / f"rank{r}" / "events.jsonl") for r in range(ranks)]
    dashboard = Dashboard(scenario, title=f"real launch · {scenario.name}",
                          enabled=not args.no_tui and sys.stdout.isatty())
    codes: dict[int, int] = {}
    try:
        for r in range(ranks):
            if not schedule.down_at_start(r):
                procs[r] = start(r, hold=schedule.held.get(r))
        started = time.monotonic()   # (from the ranks' start)
        with dashboard:
            leader_done_at = None
            for rank, p in enumerate(procs):
                if p is not None and rank not in schedule.held:
                    dashboard.observe({"t": 0.0, "node": scenario.node_names[rank], "kind": ev.NODE_STARTING})
            while len(codes) < ranks:
                for f in followers:
                    for event in f.poll():
                        dashboard.observe(event)
                if ready_at is None and all(p is None or r in schedule.held or p.poll() is not None
                                            or is_ready(out / f"rank{r}") for r, p in enumerate(procs)):
                    ready_at = time.monotonic()
                if epoch is None and ready_at is not None and time.monotonic() >= ready_at + settle:
                    epoch = time.time()
                    if machines is not None:
                        machines.start_monitor()
                    write_start(start_file, epoch)
                    schedule.begin(epoch, lead=time.monotonic() - started)
                for rank, p in enumerate(procs):
                    if rank in codes or p is None or p.poll() is None:
                        continue
                    index = p.returncode - CRASH_EXIT
                    if 0 <= index < len(scenario.faults.crashes):
                        fired[rank].append(index)
                        after = scenario.faults.crashes[index].restart_after_s
                        if after is not None:
                            schedule.restart_at(rank, time.time() + after)
                            procs[rank] = None
                            continue
                    if schedule.killed(rank):
                        procs[rank] = None  # an offline window: it comes back at its end
                        continue
                    codes[rank] = p.returncode
                for rank in schedule.due_kills(time.time()):
                    if procs[rank] is not None and procs[rank].poll() is None:
                        procs[rank].kill()
                        procs[rank].wait()
                        _log_kill(out / f"rank{rank}", scenario.node_names[rank], time.time() - (epoch or 0.0))
                for rank, up_at in schedule.due_starts(time.time(), idle=lambda r: procs[r] is None):
                    if rank not in codes:
                        procs[rank] = start(rank, restart=True, hold=up_at - epoch)
                for rank in range(ranks):
                    if procs[rank] is None and rank not in codes and not schedule.pending(rank):
                        codes[rank] = "down"  # crashed for good, as the scenario says
                now = time.monotonic()
                if scenario.kind.ends_with_leader and 0 in codes and leader_done_at is None:
                    leader_done_at = now
                if leader_done_at is not None and now - leader_done_at > GRACE_S:
                    # The run is over; a client still waiting (it missed the Stop) is let go.
                    lingering = [r for r, p in enumerate(procs) if p is not None and p.poll() is None]
                    _stop(procs, codes)
                    if codes.get(0) == 0:
                        codes.update({r: "stopped" for r in lingering})
                if args.timeout is not None and now - started > args.timeout:
                    print(f"real launch: timed out after {args.timeout:g}s", file=sys.stderr)
                    _stop(procs, codes)
                    break
                if watch is not None:
                    watch.check(machines, dashboard)
                time.sleep(0.1)
    except KeyboardInterrupt:
        _stop(procs, codes, sig=signal.SIGINT)
        print(f"real launch: interrupted; partial runs in {out}", file=sys.stderr)
        return 130
    for rank, p in enumerate(procs):
        if p is not None:
            p.wait()
            if not isinstance(codes.get(rank), str):  # "stopped" / "down" say more than the signal's code
                codes[rank] = p.returncode
    summary = gather(out, scenario, time.monotonic() - started, codes, scale)
    if machines is not None:
        summary["testbed"] = testbed_summary(machines, out, scenario)
    bad = {r: c for r, c in codes.items() if c not in (0, "down", "stopped")}
    write_json(out, "summary.json", summary)
    if bad:
        # codes is in the order the ranks ended: the first failure is the cause, the others
        # (often ranks stopped because of it) follow from it.
        rank, code = next(iter(bad.items()))
        print(f"real launch: {scenario.node_names[rank]} (rank {rank}) failed first, with exit {code}"
              f"{_last_line(out / f'rank{rank}.log')}; all exits: {bad}; logs in {out}/rank<N>.log",
              file=sys.stderr)
        return code if isinstance(code, int) and code > 0 else 1
    acc = summary.get("final_accuracy")
    print(f"{scenario.name} (real, {ranks} processes): accuracy {acc}, up {summary.get('bytes_up', 0) / 1e6:.2f} MB, "
          f"down {summary.get('bytes_down', 0) / 1e6:.2f} MB, wall {summary['wall_time_s']:.1f} s"
          f"{_failed_rounds(out)} -> {out}")
    return 0


def _failed_rounds(out: Path) -> str:
    """', rounds failed: 3, 7' for an FL run that had failed rounds (a user's first question), or ''."""
    failed = [e.get("round") for e in read_events(out) if e.get("kind") == ev.ROUND_FAILED]
    return f", rounds failed: {', '.join(map(str, failed))}" if failed else ""


def _last_line(log: Path) -> str:
    """': <the last line of a rank's log>' (what it said when it failed), or ''."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f": {lines[-1][:300]}" if lines else ""


def _log_kill(folder: Path, node: str, t: float) -> None:
    """The killed rank cannot say it died: the launcher adds the line to its events."""
    folder.mkdir(parents=True, exist_ok=True)  # killed before it made its folder
    path = folder / "events.jsonl"
    torn = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if torn else "") + json.dumps({"t": round(t, 6), "node": node, "kind": ev.FAULT, "fault": "killed"},
                           separators=(",", ":")) + "\n")


class _Schedule:
    """When ranks are killed and (re)started, in wall-clock seconds since the Unix epoch.

    The offline windows count from the run's origin (``begin``: every rank is up); crash
    restarts are added as they happen.  A rank down from the start that comes up later
    (a window from 0 to ``end_s``) is ``held``: started at once, held until ``end_s``
    after the origin by itself (real.start_line), so it is neither killed nor started here.

    Every later start is made ``lead`` seconds early (what the ranks took to come up at the
    launch), never before the rank's kill, and held to its time the same way: a rank takes
    seconds to start (imports, data, DDS), and a client back from an offline window that
    many seconds late missed rounds that emu's made."""

    def __init__(self, scenario: Scenario):
        self.names = scenario.node_names
        self.offline = scenario.faults.offline
        self.kills: list[tuple[float, int]] = []
        self.starts: list[tuple[float, int, float]] = []  # (when it is up, rank, not started before)
        first = [w for w in self.offline if w.start_s == 0]
        self.held = {self.names.index(w.node): w.end_s for w in first if w.end_s is not None}
        self._killed = {self.names.index(w.node) for w in first} - set(self.held)
        self._first_down = set(self._killed)
        self.begun = False
        self.lead = 0.0

    def begin(self, epoch: float, lead: float = 0.0) -> None:
        self.begun = True
        self.lead = max(0.0, lead)
        for w in self.offline:
            rank = self.names.index(w.node)
            if w.start_s > 0:
                self.kills.append((epoch + w.start_s, rank))
            if w.end_s is not None and not (w.start_s == 0 and rank in self.held):
                self.starts.append((epoch + w.end_s, rank, epoch + w.start_s))

    def down_at_start(self, rank: int) -> bool:
        return rank in self._first_down

    def restart_at(self, rank: int, when: float) -> None:
        self.starts.append((when, rank, 0.0))

    def due_kills(self, now: float) -> list[int]:
        due = [r for t, r in self.kills if t <= now]
        self.kills = [(t, r) for t, r in self.kills if t > now]
        self._killed.update(due)
        return due

    def due_starts(self, now: float, idle=lambda rank: True) -> list[tuple[int, float]]:
        """(rank, when it is to be up) for each rank to start now; one not ``idle`` yet (its killed
        process not reaped) stays due."""
        due = [(r, t) for t, r, after in self.starts if max(t - self.lead, after) <= now and idle(r)]
        self.starts = [s for s in self.starts if (s[1], s[0]) not in due]
        self._killed.difference_update(r for r, _ in due)
        return due

    def killed(self, rank: int) -> bool:
        return rank in self._killed

    def pending(self, rank: int) -> bool:
        if not self.begun and any(self.names.index(w.node) == rank and w.end_s is not None for w in self.offline):
            return True  # down until its window ends, which counts from the origin to come
        return any(r == rank for _, r, _ in self.starts)


def _stop(procs, codes, sig=signal.SIGTERM) -> None:
    for rank, p in enumerate(procs):
        if p is None:
            codes.setdefault(rank, "down")  # down (a crash or an offline window) when the run ended
        elif p.poll() is None:
            p.send_signal(sig)
    deadline = time.monotonic() + 10
    for rank, p in enumerate(procs):
        if p is None:
            continue
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        codes[rank] = p.returncode


def gather(out: Path, scenario: Scenario, wall: float, codes: dict | None = None, time_scale: float = 1.0) -> dict:
    """Merge the ranks' folders: every event by time, and the run's summary from their records
    (``core.runtime.summary``, the same schema as emu's)."""
    ranks = len(scenario.node_names)
    events, records = [], []
    for rank in range(ranks):
        folder = out / f"rank{rank}"
        if (folder / "events.jsonl").exists():
            events += [(e.get("t", 0), rank, i, e) for i, e in enumerate(read_events(folder))]
        try:
            records.append(json.loads((folder / "summary.json").read_text()))
        except (OSError, ValueError):
            records.append({})
    # The run's scenario and the controller's latest checkpoint at the top, as in emu's folders
    # (resume with --set fl.init_path=RUN/checkpoint.dtck, whichever mode wrote RUN).
    for name in ("scenario.json", CHECKPOINT):
        if (out / "rank0" / name).exists():
            shutil.copy2(out / "rank0" / name, out / name)
    events.sort(key=lambda x: x[:3])
    with open(out / "events.jsonl", "w") as f:
        for *_, e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    time_s = scenario.kind.run_time(records)
    extra = {"exit_codes": codes or {}, "transport": (records[0].get("real") or {}).get("transport", {}),
             "time_scale": time_scale}
    # The ranks' kernels, as rank 0 recorded them (a rank on another host may differ: its own summary says)
    platform = records[0].get("platform") or cpu_arith.describe()
    device = next((r["device"] for r in records if r.get("device")), "cpu")   # (each rank resolved the same key)
    return run_summary(scenario, "real", records, time_s=time_s, wall_time_s=wall, extra=extra,
                       platform=platform, device=device)