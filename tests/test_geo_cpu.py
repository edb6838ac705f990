"""The geo roles' CPU outside the gradient in emu (issue 11): ``compute.default.cpu``'s rates
charged where the roles do that work, exactly; ``compute.shared_cores``; absent keys change
nothing.  The stand-in model of tests/test_geo.py: 771 parameters, 3084 bytes as fp32."""

from __future__ import annotations

import json

import pytest

from dtemu.core.runtime.compute import CPU_OPS
from dtemu.emu.run import run_emulation
from test_geo import StandIn, geo_scenario

VEC_MB = 4 * 771 / 1e6   # the stand-in's fp32 vector, in the rates' MB
RATE = 0.1               # s per MB: one op on the vector takes 0.3084 ms


def _run(tmp_path, name, **sets):
    run_emulation(geo_scenario(**sets), tmp_path / name, work=StandIn())
    return [json.loads(line) for line in (tmp_path / name / "events.jsonl").read_text().splitlines()]


def _root_rounds(events) -> dict[int, float]:
    """round -> the root (global or flat) PS's close minus the previous close (rounds 2..)."""
    close = {e["round"]: e["t"] for e in events if e["kind"] == "geo_round" and e["node"] in ("global-ps", "ps")}
    return {r: close[r] - close[r - 1] for r in sorted(close) if r - 1 in close}


def _delta(base, priced) -> list[float]:
    a, b = _root_rounds(base), _root_rounds(priced)
    assert sorted(a) == sorted(b) == list(range(2, 13))
    return [b[r] - a[r] for r in sorted(a)]


def _priced(*ops, rate=RATE) -> dict[str, float]:
    return {f"compute.default.cpu.{op}_s_per_mb": rate for op in ops}


# A fast LAN (no transfer time to speak of), so that only the CPU work moves a round.
FAST_LAN = {f"network.sites.{s}.lan": "{bandwidth_mbps: 1000000000, latency_ms: 0}" for s in ("c", "a", "b")}


def test_absent_or_zero_costs_change_no_event(tmp_path):
    base = _run(tmp_path, "base")
    zeros = _run(tmp_path, "zeros", **_priced(*CPU_OPS, rate=0.0), **{"compute.shared_cores": 0})
    assert zeros == base
    # Nor the scenario's digest (checkpoints of a scenario written before these keys still match).
    assert geo_scenario(**_priced(*CPU_OPS, rate=0.0)).digest() == geo_scenario().digest()
    assert geo_scenario(**_priced("encode")).digest() != geo_scenario().digest()


@pytest.mark.parametrize("ops, sets, per_round", [
    # HiPS, dense: a worker encodes its push, its local PS sums 2 pushes and encodes the share, the
    # global PS sums 2 sites and encodes the aggregate; the local PS forwards it as it came and the
    # workers apply it (the master's apply is off the round's path).
    (("encode",), {}, 3),
    (("sum",), {}, 4),
    (("apply",), {}, 1),
    (("sparsify", "merge", "densify"), {}, 0),   # not BiSparse: never charged
    # BiSparse: the local PS sums 2 pushes and sparsifies, the global PS merges 2 sites' payloads,
    # the local PS makes the sparse aggregate dense for its workers.
    (("sum",), {"geo.compression": "bisparse"}, 2),
    (("sparsify",), {"geo.compression": "bisparse"}, 1),
    (("merge",), {"geo.compression": "bisparse"}, 2),
    (("densify",), {"geo.compression": "bisparse"}, 1),
    (("encode",), {"geo.compression": "bisparse"}, 1),
    (("apply",), {"geo.compression": "bisparse"}, 1),
    # The flat PS: every worker encodes, the PS sums the 4 pushes and encodes, the workers apply.
    (("encode", "sum", "apply"), {"geo.architecture": "flat"}, 1 + 4 + 1 + 1),
])
def test_each_op_is_charged_on_the_round_s_path(tmp_path, ops, sets, per_round):
    base = _run(tmp_path, "base", **sets, **FAST_LAN)
    priced = _run(tmp_path, "priced", **sets, **FAST_LAN, **_priced(*ops))
    for d in _delta(base, priced):
        assert d == pytest.approx(per_round * RATE * VEC_MB, abs=3e-9)
    # The time moved, not the training: the same model at the end.
    ends = lambda ev: {e["node"]: e.get("model_sha256") for e in ev if e["kind"] == "geo_end"}  # noqa: E731
    assert ends(priced) == ends(base)


@pytest.mark.parametrize("cores, extra", [(0, 0), (2, 0), (1, 1)])
def test_shared_cores_queue_the_sites_workers_encodes(tmp_path, cores, extra):
    # A site's two workers finish their gradients together: on cores of their own (or two shared
    # ones) they encode side by side; on one shared core the second waits for the first.
    base = _run(tmp_path, "base", **FAST_LAN)
    priced = _run(tmp_path, "priced", **FAST_LAN, **_priced("encode"), **{"compute.shared_cores": cores})
    for d in _delta(base, priced):
        assert d == pytest.approx((3 + extra) * RATE * VEC_MB, abs=3e-9)


def test_a_node_s_own_rates_replace_the_default_block(tmp_path):
    s = geo_scenario(**_priced("encode", "apply"), **{"compute.nodes.a-w0.cpu": "{apply_s_per_mb: 0.5}"})
    assert s.compute_for("a-w1").cpu.encode_s_per_mb == RATE
    assert s.compute_for("a-w0").cpu.encode_s_per_mb == 0.0 and s.compute_for("a-w0").cpu.apply_s_per_mb == 0.5


def test_the_tool_measures_every_op_and_emu_takes_its_keys():
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu.costs import cpu_sets, geo_cpu_costs

    s = geo_scenario(**{"geo.compression": "bisparse_fp16"})
    costs = geo_cpu_costs(s, reps=1)
    assert set(costs) == set(CPU_OPS) and all(v > 0 for v in costs.values())
    priced = parse_scenario(s.to_dict(), cpu_sets(costs, shared_cores=2))
    assert priced.compute.shared_cores == 2
    assert priced.compute_for("a-ps").cpu.sparsify_s_per_mb == pytest.approx(costs["sparsify"], rel=1e-5)
    # Small rates too (YAML takes 9e-05 for a string): the --set values are numbers.
    small = parse_scenario(s.to_dict(), cpu_sets({op: 7.7e-5 for op in CPU_OPS}, 0, {"send": 9e-5, "recv": 9e-5}))
    assert small.compute.default.cpu.sum_s_per_mb == 7.7e-5 and small.compute.default.send_s_per_message == 9e-5


@pytest.mark.parametrize("key, per_round", [
    # The round's path through site b (the global PS answers site a first): the global PS's writes to
    # a-ps and b-ps, b-ps's to b-w0 and b-w1, b-w1's push, b-ps's push: 6 writes.
    ("send_s_per_message", 6),
    # b-ps takes the answer, each worker its pull (side by side), b-ps both pushes (one after the
    # other, they come together), the global PS b's push (a's came long before): 5 on the path.
    ("recv_s_per_message", 5),
])
def test_a_message_s_own_cpu_is_charged_per_message(tmp_path, key, per_round):
    base = _run(tmp_path, "base", **FAST_LAN)
    priced = _run(tmp_path, "priced", **FAST_LAN, **{f"compute.default.{key}": 2e-4})
    for d in _delta(base, priced):
        assert d == pytest.approx(per_round * 2e-4, abs=3e-9)
    zero = _run(tmp_path, "zero", **FAST_LAN, **{f"compute.default.{key}": 0.0})
    assert zero == base


def test_the_transports_cpu_per_mb_is_charged_on_both_sides(tmp_path):
    """compute.send_s_per_mb once a message on its sender, recv_s_per_mb on each receiver beside its
    decoding (emu calibrate measures both: real.message_costs); 0 moves nothing, nor the digest."""
    base = _run(tmp_path, "base", **FAST_LAN)
    assert _run(tmp_path, "zero", **FAST_LAN, **{"compute.default.send_s_per_mb": 0.0,
                                                "compute.default.recv_s_per_mb": 0.0}) == base
    assert geo_scenario(**{"compute.default.recv_s_per_mb": 0.0}).digest() == geo_scenario().digest()
    # a received MB's reassembly is spent while its bytes come in (emu.world: deliver), its decoding
    # after: over the fast LAN nothing hides the first, over the WAN its transfer does, in part
    as_recv = _delta(base, _run(tmp_path, "recv", **FAST_LAN, **{"compute.default.recv_s_per_mb": 0.01}))
    as_decode = _delta(base, _run(tmp_path, "decode", **FAST_LAN, **{"compute.default.decode_s_per_mb": 0.01}))
    assert all(0 < r <= d + 1e-9 for r, d in zip(as_recv, as_decode)) and sum(as_recv) < sum(as_decode)
    sent = _delta(base, _run(tmp_path, "send", **FAST_LAN, **{"compute.default.send_s_per_mb": 0.01}))
    assert sent[0] > 0 and sent == pytest.approx([sent[0]] * len(sent), abs=1e-9)   # the same messages each round


def test_a_sealed_runs_hmac_is_charged_on_both_sides_only_where_it_is_sealed(tmp_path):
    """compute.seal_s_per_mb: every message's seal on its sender and its opening on each receiver,
    per MB, in a sealed run only (emu calibrate measures it: emu.costs.seal_cost)."""
    from dtemu.emu.costs import seal_cost

    key, rate = b"k" * 32, {"compute.default.seal_s_per_mb": 0.5}

    def run(name, key=None, **sets):
        run_emulation(geo_scenario(**FAST_LAN, **sets), tmp_path / name, work=StandIn(), key=key)
        return [json.loads(line) for line in (tmp_path / name / "events.jsonl").read_text().splitlines()]

    assert run("plain") == run("plain_priced", **rate)   # nothing is sealed: nothing is charged
    deltas = _delta(run("sealed", key), run("sealed_priced", key, **rate))
    # every round's path is the same messages: the same CPU more each round
    assert deltas[0] > 0 and deltas == pytest.approx([deltas[0]] * len(deltas), abs=1e-9)
    assert 1e-5 < seal_cost(reps=1) < 0.05   # seconds per MB: an HMAC-SHA256 and a copy or two
