"""Geo-distributed training (issue 11): sites in the network model, the geo payloads, BiSparse's
residuals, and whole HiPS / flat-PS runs in emu over a tiny stand-in model (no data set)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import simpy
import torch
import torch.nn.functional as F

from dtemu.core.errors import GeoPayloadError
from dtemu.core.geo.bisparse import ResidualSparsifier
from dtemu.core.geo.common import GeoResult
from dtemu.core.geo.receiver import Receiver
from dtemu.core.geo.payload import (BLOCKS, BLOCKS_HEADER, HEADER_SIZE, SPARSE, decode, encode_blocks, encode_dense,
                                    encode_sparse, head, sum_sparse)
from dtemu.core.runtime.requests import Message, RecordingContext, Recv
from dtemu.core.scenario import parse_scenario
from dtemu.emu.network import Link, Network
from dtemu.emu.run import run_emulation


# --- the network model with sites ------------------------------------------------------
def _site_net(env, wan_mbps=10.0):
    lan = Link(up_bps=100e6, down_bps=100e6, latency_s=0.001)
    links = {n: lan for n in ("a1", "a2", "b1", "b2")}
    wan = {"A": Link(up_bps=wan_mbps * 1e6, down_bps=wan_mbps * 1e6, latency_s=0.01),
           "B": Link(up_bps=wan_mbps * 1e6, down_bps=wan_mbps * 1e6, latency_s=0.02)}
    return Network(env, links, sites={"a1": "A", "a2": "A", "b1": "B", "b2": "B"}, wan=wan)


def _deliveries(env, net, sends):
    got = {}
    for src, dst, n in sends:
        net.send(src, dst, n, lambda src=src, dst=dst: got.setdefault((src, dst), env.now))
    env.run()
    return got


def test_a_message_between_sites_crosses_both_wan_links_and_pays_their_latency():
    env = simpy.Environment()
    net = _site_net(env)
    got = _deliveries(env, net, [("a1", "b1", 125_000)])  # 1 Mbit through a 10 Mbit/s WAN: 0.1 s
    assert got[("a1", "b1")] == pytest.approx(0.1 + 0.001 + 0.001 + 0.01 + 0.02)
    assert net.wan_bytes == {"A": {"up": 125_000, "down": 0}, "B": {"up": 0, "down": 125_000}}


def test_inside_a_site_only_the_lan_counts():
    env = simpy.Environment()
    net = _site_net(env)
    got = _deliveries(env, net, [("a1", "a2", 125_000)])  # 1 Mbit at 100 Mbit/s
    assert got[("a1", "a2")] == pytest.approx(0.01 + 0.002)
    assert net.wan_bytes["A"] == {"up": 0, "down": 0}


def test_flows_share_a_site_wan_link_max_min_fairly():
    env = simpy.Environment()
    net = _site_net(env)
    # Two senders of site A to two receivers of B: A's WAN uplink is shared, 5 Mbit/s each.
    got = _deliveries(env, net, [("a1", "b1", 125_000), ("a2", "b2", 125_000)])
    assert got[("a1", "b1")] == pytest.approx(0.2 + 0.032)
    assert got[("a2", "b2")] == pytest.approx(0.2 + 0.032)
    # A LAN flow beside them is not slowed by the WAN.
    env = simpy.Environment()
    net = _site_net(env)
    got = _deliveries(env, net, [("a1", "b1", 125_000), ("a1", "a2", 125_000)])
    assert got[("a1", "a2")] == pytest.approx(125_000 * 8 / 90e6 + 0.002)


def test_without_sites_the_network_is_the_flat_star():
    env = simpy.Environment()
    link = Link(up_bps=8e6, down_bps=8e6, latency_s=0.0)
    net = Network(env, {"x": link, "y": link})
    got = _deliveries(env, net, [("x", "y", 1_000_000)])
    assert got[("x", "y")] == pytest.approx(1.0)
    assert net.wan_bytes == {}


# --- payloads ---------------------------------------------------------------------------
def test_payloads_round_trip():
    v = np.arange(10, dtype=np.float32) / 3
    assert np.array_equal(decode(encode_dense(4, v), 10).dense(), v)
    half = decode(encode_dense(4, v, fp16=True), 10)
    assert half.round == 4 and np.array_equal(half.dense(), v.astype(np.float16).astype(np.float32))
    assert len(encode_dense(1, v, fp16=True)) == HEADER_SIZE + 20
    sp = decode(encode_sparse(7, 10, np.array([1, 5]), np.array([0.5, -2.0])), 10)
    assert sp.sparse and sp.round == 7
    assert np.array_equal(sp.dense(), np.array([0, .5, 0, 0, 0, -2, 0, 0, 0, 0], np.float32))


def _sparse_raw(dim, count, idx, vals):
    return head(SPARSE, 0, 1, dim, count) + np.array(idx, "<u4").tobytes() \
        + np.array(vals, "<f4").tobytes()


@pytest.mark.parametrize("raw, why", [
    (_sparse_raw(10, 2, [1, 10], [1, 1]), "out of range"),
    (_sparse_raw(10, 2, [3, 3], [1, 1]), "repeated"),
    (_sparse_raw(10, 2, [4, 3], [1, 1]), "repeated or out of order"),
    (_sparse_raw(10, 3, [1, 2], [1, 1]), "header says 3"),
    (_sparse_raw(10, 11, [1] * 11, [1] * 11), "11 sparse entries"),
    (_sparse_raw(12, 1, [1], [1]), "dimension 12"),
    (_sparse_raw(10, 1, [1], [float("nan")]), "not finite"),
    (encode_dense(1, np.ones(10))[:-1], "dense body"),
    (b"XXXX" + encode_dense(1, np.ones(10))[4:], "magic"),
    (b"DTEM", "shorter"),
])
def test_malformed_payloads_are_refused_with_a_typed_error(raw, why):
    with pytest.raises(GeoPayloadError, match=why):
        decode(raw, 10)


def test_whole_tensors_cross_as_dense_blocks():
    idx = np.array([0, 2, 3, 4, 7, 8, 9])
    vals = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], np.float32) / 3
    for fp16, width in [(False, 4), (True, 2)]:
        raw = encode_blocks(5, 10, [(2, 3), (8, 2)], idx, vals, fp16)
        # 5 block values at ``width`` bytes and 2 pairs at 8, not 7 pairs at 8
        assert len(raw) == HEADER_SIZE + BLOCKS_HEADER.size + 2 * 8 + 5 * width + 2 * 8
        p = decode(raw, 10)
        assert p.sparse and p.round == 5 and p.indices.tolist() == idx.tolist()
        want = vals.copy()
        if fp16:   # only the blocks are half precision: the pairs stay fp32
            want[[1, 2, 3, 5, 6]] = want[[1, 2, 3, 5, 6]].astype(np.float16)
        assert np.array_equal(p.values, want)
    # the blocks' positions join the sum by index like any pair
    a = decode(encode_blocks(1, 10, [(2, 3)], np.array([2, 3, 4, 9]), np.ones(4)), 10)
    b = decode(encode_sparse(1, 10, np.array([3, 5]), np.array([1.0, 1.0])), 10)
    assert sum_sparse([a, b], 10)[0].tolist() == [2, 3, 4, 5, 9]


def _blocks_raw(dim, blocks, total, dense, idx, vals, count=None, flag=0, nblocks=None):
    return (head(BLOCKS, flag, 1, dim, len(idx) if count is None else count)
            + BLOCKS_HEADER.pack(len(blocks) if nblocks is None else nblocks, total)
            + np.array(blocks, "<u4").tobytes() + np.array(dense, "<f2" if flag else "<f4").tobytes()
            + np.array(idx, "<u4").tobytes() + np.array(vals, "<f4").tobytes())


@pytest.mark.parametrize("raw, why", [
    (_blocks_raw(10, [(2, 3)], 3, [1, 1, 1], [3], [1]), "inside a dense block"),
    (_blocks_raw(10, [(2, 3), (4, 2)], 5, [1] * 5, [], []), "overlapping or out of order"),
    (_blocks_raw(10, [(6, 2), (2, 2)], 4, [1] * 4, [], []), "overlapping or out of order"),
    (_blocks_raw(10, [(8, 3)], 3, [1] * 3, [], []), "past dimension"),
    (_blocks_raw(10, [(2, 0)], 0, [], [], []), "empty"),
    (_blocks_raw(10, [(2, 3)], 4, [1] * 4, [], []), "the header says 4"),
    (_blocks_raw(10, [(2, 3)], 3, [1] * 3, [0, 1], [1, 1], count=3), "header says"),
    (_blocks_raw(10, [(2, 3)], 3, [1] * 3, [], [], nblocks=2), "header says"),
    (_blocks_raw(10, [(0, 8)], 8, [1] * 8, [8, 9, 9], [1] * 3), "for dimension 10"),
    (_blocks_raw(10, [(0, 2)], 2, [1] * 2, [9, 8], [1, 1]), "repeated or out of order"),
    (_blocks_raw(10, [(0, 2)], 2, [1] * 2, [10], [1]), "out of range"),
    (_blocks_raw(10, [(0, 2)], 2, [1, 1], [], [], flag=2), "width flag"),
    (_blocks_raw(10, [(0, 2)], 2, [1, float("inf")], [], [], flag=1), "not finite"),
    (_blocks_raw(10, [(0, 2)], 2, [1, 1], [], [])[:HEADER_SIZE + 4], "no block count"),
])
def test_malformed_block_payloads_are_refused_with_a_typed_error(raw, why):
    with pytest.raises(GeoPayloadError, match=why):
        decode(raw, 10)


def test_random_bytes_never_decode_into_something_applied():
    """Fuzz: every truncation and single-byte flip of a valid BLOCKS payload either decodes to
    positions in range, ascending and unique, or is refused with GeoPayloadError."""
    raw = encode_blocks(3, 40, [(0, 5), (20, 4)], np.array([0, 1, 2, 3, 4, 10, 20, 21, 22, 23, 30]),
                        np.arange(11, dtype=np.float32), fp16=True)
    rng = np.random.default_rng(0)
    variants = [raw[:n] for n in range(len(raw))]
    for _ in range(400):
        b = bytearray(raw)
        b[rng.integers(len(b))] = int(rng.integers(256))
        variants.append(bytes(b))
    for data in variants:
        try:
            p = decode(data, 40)
        except GeoPayloadError:
            continue
        if p.sparse:
            assert p.indices.min() >= 0 and p.indices.max() < 40 and np.all(np.diff(p.indices) > 0)
            assert len(p.values) == len(p.indices) and np.all(np.isfinite(p.values))


def test_sparse_payloads_are_summed_by_index():
    a = decode(encode_sparse(1, 8, np.array([0, 3]), np.array([1.0, 2.0])), 8)
    b = decode(encode_sparse(1, 8, np.array([3, 7]), np.array([0.5, 4.0])), 8)
    idx, vals = sum_sparse([a, b], 8)
    assert idx.tolist() == [0, 3, 7] and vals.tolist() == [1.0, 2.5, 4.0]


def test_a_role_refuses_and_counts_what_it_cannot_use():
    ctx = RecordingContext(node="global-ps")
    result = GeoResult(role="global_ps", site="c")
    inbox = Receiver(ctx, "geo/push", 10, {"a-ps": "a", "b-ps": "b"}, "c", result)
    good = encode_sparse(2, 10, np.array([1]), np.array([1.0]))
    queue = [Message("geo/push", "a-ps", _sparse_raw(10, 2, [3, 3], [1, 1])),   # duplicates
             Message("geo/push", "evil", good),                                     # unknown sender
             Message("geo/push", "a-ps", encode_sparse(1, 10, np.array([1]), np.array([1.0]))),  # stale
             Message("geo/push", "a-ps", good), Message("geo/push", "a-ps", good),  # a duplicate
             Message("geo/push", "b-ps", good)]
    gen = inbox.collect(["a-ps", "b-ps"], 2, deadline=5.0)
    req = next(gen)
    try:
        while True:
            assert isinstance(req, Recv)
            req = gen.send(queue.pop(0))
    except StopIteration as stop:
        got = stop.value
    assert sorted(got) == ["a-ps", "b-ps"]
    assert result.rejected == 4
    reasons = [e["reason"] for e in ctx.events]
    assert reasons == ["malformed", "unknown_sender", "late", "duplicate"]
    assert ctx.bytes_rejected > 0


# --- BiSparse's residuals -----------------------------------------------------------------
def test_residuals_with_momentum_correction():
    sp = ResidualSparsifier([100, 4], density=0.05, sample_ratio=0.5, momentum=0.9, seed=0, site=0)
    g = np.linspace(-1, 1, 104).astype(np.float32)
    idx, vals = sp.compress(g, 1)
    assert len(idx) == 5 + 1   # ceil(5% of 100) + at least one of the small tensor
    assert np.array_equal(vals, g[idx])           # v = g, u = v at the first round
    assert np.all(sp.u[idx] == 0) and np.all(sp.v[idx] == 0)
    rest = np.setdiff1d(np.arange(104), idx)
    assert np.array_equal(sp.u[rest], g[rest])
    idx2, vals2 = sp.compress(g, 2)               # v = 0.9 v + g, u = u + v
    v = 0.9 * g + g
    v[idx] = g[idx]
    u = g.copy()
    u[idx] = 0
    u = u + v
    assert np.allclose(vals2, u[idx2])


def test_a_small_tensor_goes_whole_with_its_momentum():
    sp = ResidualSparsifier([100, 4], density=0.05, sample_ratio=0.5, momentum=0.9, seed=0, site=0, dense_below=10)
    g = np.linspace(-1, 1, 104).astype(np.float32)
    idx, vals = sp.compress(g, 1)
    assert len(idx) == 5 + 4 and list(idx[-4:]) == [100, 101, 102, 103]
    assert np.array_equal(vals[-4:], g[100:])
    assert np.all(sp.u[100:] == 0) and np.array_equal(sp.v[100:], g[100:])   # velocity kept
    assert np.all(sp.v[idx[:5]] == 0)                                        # masked where sparse
    idx2, vals2 = sp.compress(g, 2)
    assert np.allclose(vals2[-4:], 1.9 * g[100:])   # momentum SGD's step: 0.9 * g + g


def test_without_momentum_masking_the_velocity_goes_on():
    sp = ResidualSparsifier([100], density=0.05, sample_ratio=0.5, momentum=0.9, seed=0, site=0, masking=False)
    g = np.linspace(-1, 1, 100).astype(np.float32)
    idx, _ = sp.compress(g, 1)
    assert np.all(sp.u[idx] == 0) and np.array_equal(sp.v[idx], g[idx])
    masked = ResidualSparsifier([100], density=0.05, sample_ratio=0.5, momentum=0.9, seed=0, site=0)
    assert np.array_equal(masked.compress(g, 1)[0], idx)   # the same selection, the same draws
    assert np.all(masked.v[idx] == 0)


# --- whole runs in emu ---------------------------------------------------------------------
class _Data:
    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.x_train = torch.randn(512, 8, generator=gen)
        w = torch.randn(8, 3, generator=gen)
        self.y_train = (self.x_train @ w).argmax(1)
        self.x_test, self.y_test = self.x_train[:128], self.y_train[:128]


class StandIn:
    """What the geo roles use of a Workload: a linear model on 512 synthetic samples."""

    reference_cost = 1e-4
    test_size = 128

    def __init__(self):
        self.dataset = _Data()

    def new_model(self):
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))

    def split(self, parties):  # Workload.split for geo_scenario's data (iid, seed 3)
        from dtemu.core.ml.data import partition

        return partition("iid", self.dataset.y_train.numpy(), parties, seed=3)

    def gradients(self, model, batch, rank, step):
        model.zero_grad()
        loss = F.cross_entropy(model(self.dataset.x_train[batch]), self.dataset.y_train[batch])
        loss.backward()
        return float(loss.detach())

    def evaluate_shard(self, model, rank, world):
        with torch.no_grad():
            pred = model(self.dataset.x_test).argmax(1)
        return int((pred == self.dataset.y_test).sum()), 128


def geo_scenario(**sets):
    raw = {"name": "geo-test", "mode": "geo", "seed": 3, "targets": [0.5],
           "network": {"sites": {"c": {"wan": {"up_mbps": 10, "down_mbps": 10, "latency_ms": 5}},
                                 "a": {"wan": {"up_mbps": 10, "down_mbps": 10, "latency_ms": 5}},
                                 "b": {"wan": {"up_mbps": 10, "down_mbps": 10, "latency_ms": 5}}}},
           "geo": {"workers_per_site": 2, "rounds": 12, "eval_every": 4, "batch_size": 16, "lr": 0.1,
                   "round_timeout_s": 5, "sample_ratio": 0.5}}
    return parse_scenario(raw, [f"{k}={v}" for k, v in sets.items()])


def _run(tmp_path, name, **sets):
    return run_emulation(geo_scenario(**sets), tmp_path / name, work=StandIn())


def test_hips_run_agrees_everywhere_and_counts_the_wan(tmp_path):
    s = _run(tmp_path, "hips")
    assert s["mode"] == "geo" and s["stop_reason"] == "done" and s["rounds"] == 12
    assert s["models_agree"] and s["model_sha256"]
    assert s["final_accuracy"] is not None and s["time_to_accuracy"]["0.5"] is not None
    # Every byte the roles say they sent across the WAN is what the network carried through the WANs.
    net = s["emu"]["wan_bytes"]
    assert s["wan_bytes"] == sum(v["up"] for v in net.values()) == sum(v["down"] for v in net.values())
    # A local PS pushes one dense fp32 vector a round and pulls one back: no more.
    dense = s["wan"]["dense_bytes"]
    assert s["wan"]["up_per_node_round"] == dense + HEADER_SIZE
    assert s["wan"]["down_per_node_round"] == dense + HEADER_SIZE
    records = [json.loads(line) for line in (tmp_path / "hips" / "events.jsonl").read_text().splitlines()]
    ends = {e["node"]: e for e in records if e["kind"] == "geo_end"}
    assert all(ends[n]["wan_sent"] == 0 for n in ends if "-w" in n)   # workers never cross the WAN
    assert _run(tmp_path, "again")["model_sha256"] == s["model_sha256"]  # deterministic


def test_the_flat_ps_sends_every_worker_across_the_wan_and_takes_longer(tmp_path):
    flat = _run(tmp_path, "flat", **{"geo.architecture": "flat"})
    hips = _run(tmp_path, "hips")
    assert flat["models_agree"] and flat["wan"]["nodes"] == 4
    assert flat["wan"]["up_per_node_round"] == flat["wan"]["dense_bytes"] + HEADER_SIZE
    assert flat["wan_bytes"] > 1.9 * hips["wan_bytes"]
    assert flat["time_s"] > hips["time_s"]


@pytest.mark.parametrize("variant, limit", [("bisparse", 0.1), ("bisparse_fp16", 0.07)])
def test_bisparse_cuts_the_wan_both_ways(tmp_path, variant, limit):
    s = _run(tmp_path, variant, **{"geo.compression": variant})
    assert s["models_agree"] and s["stop_reason"] == "done"
    assert s["wan"]["up_ratio"] <= limit and s["wan"]["down_ratio"] <= limit


@pytest.mark.parametrize("variant, width", [("bisparse", 4), ("bisparse_fp16", 2)])
def test_bisparse_sends_small_tensors_as_dense_blocks(tmp_path, variant, width):
    # The stand-in's tensors: 512 and 192 weights (sparse), 64 and 3 biases (whole, two blocks).
    s = _run(tmp_path, variant, **{"geo.compression": variant, "geo.dense_below": 100})
    assert s["models_agree"] and s["stop_reason"] == "done"
    pairs = 6 + 2   # ceil(1% of 512) + ceil(1% of 192)
    assert s["wan"]["up_per_node_round"] == HEADER_SIZE + BLOCKS_HEADER.size + 2 * 8 + 67 * width + pairs * 8
    down = s["wan"]["down_per_node_round"]   # the two sites' pairs, summed by index: 8 to 16 of them
    assert HEADER_SIZE + BLOCKS_HEADER.size + 16 + 67 * width + 8 * 8 <= down <= \
        HEADER_SIZE + BLOCKS_HEADER.size + 16 + 67 * width + 16 * 8


def test_fp16_halves_every_dense_transfer(tmp_path):
    fp16 = _run(tmp_path, "fp16", **{"geo.compression": "fp16"})
    none = _run(tmp_path, "none")
    assert fp16["models_agree"]
    assert fp16["wan"]["up_per_node_round"] - HEADER_SIZE == (none["wan"]["up_per_node_round"] - HEADER_SIZE) / 2
    assert fp16["bytes_up"] < 0.51 * none["bytes_up"]


def test_global_optimizer_returns_weights(tmp_path):
    s = _run(tmp_path, "gopt", **{"geo.global_optimizer": "true"})
    assert s["models_agree"] and s["stop_reason"] == "done"


def test_a_lost_site_is_reported_and_the_others_go_on(tmp_path):
    sc = geo_scenario(**{"faults.offline": '[{"node": "b-ps", "start_s": 0.05}]'})
    s = run_emulation(sc, tmp_path / "lost", work=StandIn())
    assert s["stop_reason"] == "done" and s["rounds"] == 12 and s["lost"] == ["b-ps"]
    assert s["survivors"] == 2 and s["models_agree"]     # site a's workers, with the master
    lost = [json.loads(line) for line in (tmp_path / "lost" / "events.jsonl").read_text().splitlines()
            if '"geo_lost"' in line]
    assert {e["node"] for e in lost} == {"global-ps", "b-w0", "b-w1"}
    assert s["time_s"] < 5 * 5 + 1     # b's workers wait out their pull (5 round timeouts), then stop


def test_a_lost_worker_leaves_its_site_going(tmp_path):
    sc = geo_scenario(**{"faults.offline": '[{"node": "a-w1", "start_s": 0.05}]'})
    s = run_emulation(sc, tmp_path / "lostw", work=StandIn())
    assert s["stop_reason"] == "done" and s["lost"] == ["a-w1"] and s["survivors"] == 3 and s["models_agree"]


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_mixedsync_is_asynchronous_between_sites(tmp_path, lam):
    sets = {"geo.sync": "mixed", "geo.dcasgd_lambda": lam,
            "network.sites.b.wan.up_mbps": 1, "network.sites.b.wan.down_mbps": 1}   # site b is slow
    s = _run(tmp_path, f"mixed{lam}", **sets)
    assert s["stop_reason"] == "done" and s["rounds"] == 2 * 12 and s["final_accuracy"] is not None
    events = [json.loads(line) for line in (tmp_path / f"mixed{lam}" / "events.jsonl").read_text().splitlines()]
    done = {e["node"]: e["t"] for e in events if e["kind"] == "geo_end"}
    assert done["a-ps"] < done["b-ps"] / 2     # the fast site did not wait for the slow one
    fsa = _run(tmp_path, f"fsa{lam}", **{k: v for k, v in sets.items() if k.startswith("network")})
    assert done["a-ps"] < fsa["time_s"] / 2


def test_mixedsync_goes_on_without_a_lost_site(tmp_path):
    s = _run(tmp_path, "mixedlost", **{"geo.sync": "mixed",
                                       "faults.offline": '[{"node": "b-ps", "start_s": 0.05}]'})
    assert s["stop_reason"] == "done" and "b-ps" in s["lost"] and s["survivors"] == 2


@pytest.mark.parametrize("sets, key", [
    ({"network.sites": "{}"}, "network.sites"),
    ({"network.central": "nowhere"}, "network.central"),
    ({"geo.compression": "bisparse", "geo.architecture": "flat"}, "geo.compression"),
    ({"geo.compression": "bisparse", "geo.global_optimizer": "true"}, "geo.global_optimizer"),
    ({"geo.sync": "mixed", "geo.architecture": "flat"}, "geo.sync"),
])
def test_scenarios_that_cannot_work_are_refused(sets, key):
    from dtemu.core.errors import ScenarioError
    with pytest.raises(ScenarioError, match=key):
        geo_scenario(**sets)


def test_sites_in_an_fl_scenario_place_every_node():
    from dtemu.core.errors import ScenarioError
    raw = {"name": "x", "fl": {"clients": 2},
           "network": {"sites": {"h": {"nodes": ["controller", "client1"]}, "f": {"nodes": ["client2"]}}}}
    s = parse_scenario(raw)
    assert s.site_of == {"controller": "h", "client1": "h", "client2": "f"}
    assert s.link("client2").up_mbps == 1000.0
    raw["network"]["sites"]["f"]["nodes"] = []
    with pytest.raises(ScenarioError, match="not placed: client2"):
        parse_scenario(raw)


def test_the_communication_table_tool_measures_rounds():
    from tools.geo_table import markdown, measure
    hips = measure(0.05, "hips", 155, 2, 2)
    flat = measure(0.05, "flat", 155, 2, 2)
    # 0.2 MB a vector: the flat PS carries 4 workers' vectors over its site's WAN, HiPS 2 sites'.
    assert 0 < hips < flat
    md = markdown([{"params_m": 0.05, "hips_1000": 1.0, "hips_155": hips, "flat_1000": 2.0, "flat_155": flat}],
                  [1000, 155])
    assert f"| {hips / 2.0:.2f} |" in md


def test_bisparse_warm_up_sends_more_first():
    g = geo_scenario(**{"geo.warmup_rounds": 6}).geo
    assert [g.density_at(r) for r in range(1, 9)] == [0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.01, 0.01]
    assert geo_scenario().geo.density_at(1) == 0.01


def test_hfa_averages_locally_k2_times_per_global_round(tmp_path):
    s = _run(tmp_path, "hfa", **{"geo.sync": "hfa", "geo.k1": 2, "geo.k2": 3, "geo.rounds": 4})
    assert s["stop_reason"] == "done" and s["rounds"] == 4 and s["models_agree"]
    # one WAN push and pull of the site's weights per global round
    assert s["wan"]["up_per_node_round"] == s["wan"]["dense_bytes"] + HEADER_SIZE
    events = [json.loads(line) for line in (tmp_path / "hfa" / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["kind"] == "geo_step" and e["node"] == "a-w0"]
    assert len(steps) == 4 * 3      # a local sync every k1 = 2 batches, k2 = 3 of them a round


def test_heartbeats_find_a_dead_local_ps_before_the_round_timeout(tmp_path):
    sc = geo_scenario(**{"geo.heartbeat_s": 0.2, "faults.offline": '[{"node": "b-ps", "start_s": 0.05}]'})
    s = run_emulation(sc, tmp_path / "beat", work=StandIn())
    assert s["stop_reason"] == "done" and s["rounds"] == 12 and s["lost"] == ["b-ps"]
    lost = [json.loads(line) for line in (tmp_path / "beat" / "events.jsonl").read_text().splitlines()
            if '"geo_lost"' in line and '"global-ps"' in line]
    assert lost[0]["reason"] == "heartbeat, going on without" and lost[0]["t"] < 1.0   # not 2 x 5 s
    # beats alone do not change a healthy run's model
    assert _run(tmp_path, "beats", **{"geo.heartbeat_s": 0.05})["model_sha256"] == \
        _run(tmp_path, "nobeats")["model_sha256"]


def test_a_heartbeat_is_a_payload_of_its_own():
    from dtemu.core.geo.payload import BEAT, encode_beat
    assert decode(encode_beat(10), 10).kind == BEAT
    with pytest.raises(GeoPayloadError, match="heartbeat"):
        decode(head(BEAT, 0, 0, 10, 1) + b"\0" * 8, 10)


def test_an_fl_run_across_sites_pays_the_wan(tmp_path):
    from test_fl_protocol import StandIn as FLStandIn
    raw = {"name": "fl-sites", "fl": {"clients": 2, "rounds": 2, "subset": 1000, "round_timeout_s": 5.0},
           "network": {"sites": {"hq": {"nodes": ["controller", "client1"]},
                                 "far": {"nodes": ["client2"], "wan": {"up_mbps": 1, "down_mbps": 1}}}}}
    s = run_emulation(parse_scenario(raw), tmp_path / "fl", work=FLStandIn())
    assert s["rounds"] == 2 and s["stop_reason"] == "done"
    wan = s["emu"]["wan_bytes"]
    # only client2's traffic crosses: the model and commands down to it, its updates up
    assert wan["far"]["up"] > 0 and wan["far"]["down"] > 0 and wan["hq"]["up"] == wan["far"]["down"]


def test_a_step_schedule_cuts_the_learning_rate_after_each_milestone():
    g = geo_scenario(**{"geo.lr_milestones": "[2, 4]", "geo.lr_gamma": 0.5}).geo
    assert [g.lr_at(r) for r in range(1, 7)] == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    assert geo_scenario().geo.lr_at(10_000) == 0.1   # no schedule: geo.lr, bit for bit


@pytest.mark.parametrize("key, value", [("geo.lr_milestones", "[4, 2]"), ("geo.lr_milestones", "[3, 3]"),
                                        ("geo.lr_milestones", "[0]"), ("geo.lr_gamma", 0),
                                        ("geo.lr_gamma", 1.5)])
def test_a_schedule_that_makes_no_sense_is_refused(key, value):
    from dtemu.core.errors import ScenarioError
    with pytest.raises(ScenarioError, match=key.replace(".", r"\.")):
        geo_scenario(**{key: value})


def test_the_applier_steps_at_its_rounds_rate():
    from dtemu.core.geo.common import Applier
    from dtemu.core.ml.params import params_vector as get_vector
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    g = geo_scenario(**{"geo.lr_milestones": "[1]", "geo.lr_gamma": 0.5}).geo
    applier = Applier(model, g.lr_at, 0.0, False)
    ones = np.ones(2, np.float32)
    applier.apply(ones, 1)
    assert get_vector(model).tolist() == pytest.approx([-0.1, -0.1])
    applier.apply(ones, 2)
    assert get_vector(model).tolist() == pytest.approx([-0.15, -0.15])


@pytest.mark.parametrize("variant", [{}, {"geo.compression": "bisparse_fp16"}, {"geo.global_optimizer": "true"},
                                     {"geo.sync": "mixed"}, {"geo.sync": "hfa", "geo.rounds": 4},
                                     {"geo.architecture": "flat"}])
def test_a_schedule_moves_the_run_only_after_its_milestone(tmp_path, variant):
    rounds = int(variant.get("geo.rounds", 12))
    base = _run(tmp_path, "base", **variant)
    after_the_end = _run(tmp_path, "late", **variant, **{"geo.lr_milestones": f"[{rounds}]"})
    assert after_the_end["model_sha256"] == base["model_sha256"]
    early = _run(tmp_path, "early", **variant, **{"geo.lr_milestones": f"[{rounds // 2}]", "geo.lr_gamma": 0.5})
    assert early["stop_reason"] == "done" and early["models_agree"] == base["models_agree"]   # mixed: never
    assert early["model_sha256"] != base["model_sha256"]
