"""The world-size sweep: payload sizes, emulated exchange times, the crossover, the CLI."""

from __future__ import annotations

import pytest

from dtemu.core.ddp.collectives import Collective
from tools import sweep_world as sw
from tools.sweep_world import DGC, GATHER, RING, Method, NetSpec

GBIT = NetSpec(1000.0, 0.1)


def test_shapes_are_mnist_cnns():
    from dtemu.core.ml.models import MnistCnn

    shapes = tuple((n, tuple(p.shape)) for n, p in MnistCnn().named_parameters())
    assert shapes == sw.MNIST_CNN_SHAPES
    assert sw.dense_payload_bytes() == 4 * 1_199_882


@pytest.mark.parametrize("density", sw.DGC_DENSITIES)
@pytest.mark.parametrize("fp16", [False, True])
def test_dgc_payload_is_the_bucket_formats_size(density, fp16):
    import torch

    from dtemu.core.wire.bucket import Bucket, TensorPayload, bucket_size
    from dtemu.core.compression.codecs import topk_count
    from dtemu.core.compression.dgc import DGCConfig

    kinds = DGCConfig(density=density).kinds(list(sw.MNIST_CNN_SHAPES))
    payloads = []
    for (_, shape), kind in zip(sw.MNIST_CNN_SHAPES, kinds):
        n = sw.numel(shape)
        if kind == 0:  # dense
            payloads.append(TensorPayload(n, torch.zeros(n)))
        else:
            k = topk_count(n, density)
            payloads.append(TensorPayload(n, torch.zeros(k), torch.arange(k)))
    expected = bucket_size(Bucket(0, 0, 2, fp16, payloads))
    assert sw.dgc_payload_bytes(density, fp16=fp16) == expected


def test_final_density_payload_by_hand():
    # header 20 + 8 entries of 12; dense: 4 biases (234) and conv1.weight (288);
    # sparse k: ceil(18.432) + ceil(1179.648) + ceil(1.28) = 19 + 1180 + 2 entries of 8 bytes
    assert sw.dgc_payload_bytes(0.001) == 20 + 96 + 4 * 522 + 8 * 1201
    assert sw.dgc_payload_bytes(0.001, fp16=True) == 20 + 96 + 2 * 522 + 6 * 1201


def test_two_ranks_match_the_link_arithmetic():
    gather, ring = sw.exchange_times(2, [Method(GATHER), Method(RING)], GBIT)
    path = 2 * 0.1e-3
    # gather: one rank's vector (and its frame headers) over a 1 Gbit/s uplink, then the path latency
    assert gather.time_s == pytest.approx(gather.bytes_sent * 8 / 1e9 + path, rel=1e-6)
    assert gather.bytes_sent == pytest.approx(4 * 1_199_882, rel=1e-3)
    # ring, W = 2: reduce-scatter then allgather of half the vector, a latency each
    assert ring.time_s == pytest.approx(ring.bytes_sent * 8 / 1e9 + 2 * path, rel=1e-6)
    assert ring.bytes_sent == pytest.approx(4 * 1_199_882, rel=1e-3)


def test_repeats_agree_and_lean_collective_does_not_change_timing(monkeypatch):
    methods = [Method(GATHER), Method(RING), Method(DGC, 0.0625)]
    lean = sw.exchange_times(3, methods, GBIT, repeats=2, frame_bytes=1 << 18)
    for r in lean:
        assert r.times_s[0] == pytest.approx(r.times_s[1], rel=1e-9, abs=1e-12)
    monkeypatch.setattr(sw, "LeanCollective", Collective)
    full = sw.exchange_times(3, methods, GBIT, repeats=1, frame_bytes=1 << 18)
    assert [r.time_s for r in full] == pytest.approx([r.time_s for r in lean], rel=1e-9)
    assert [r.bytes_sent for r in full] == [r.bytes_sent for r in lean]


def test_tiny_sweep_ordering():
    methods = [Method(RING), Method(DGC, 0.25), Method(DGC, 0.001)]
    results = sw.sweep([2, 4, 8], methods, GBIT)
    t = {(r.world, r.method.name): r.time_s for r in results}
    # the final density: far below the ring at every W
    for w in (2, 4, 8):
        assert t[(w, "dgc@0.001")] < t[(w, "ring")] / 10
    # density 0.25: a rank's allgather sends (W-1)·P ≈ (W-1)·2D bytes, the ring 2(W-1)/W·4D:
    # sparse wins at W = 2, the bytes tie at W = 4, the ring wins from W = 8 on
    assert t[(2, "dgc@0.25")] < t[(2, "ring")] / 1.5
    assert t[(4, "dgc@0.25")] == pytest.approx(t[(4, "ring")], rel=0.05)
    assert t[(8, "dgc@0.25")] > 1.5 * t[(8, "ring")]
    assert sw.crossovers(results) == {0.25: 8, 0.001: None}
    # every exchange grows with W
    for m in methods:
        assert t[(2, m.name)] < t[(4, m.name)] < t[(8, m.name)]


def test_slower_network_scales_bandwidth_terms():
    fast = sw.exchange_time(4, Method(DGC, 0.0625), NetSpec(1000.0, 0.0))
    slow = sw.exchange_time(4, Method(DGC, 0.0625), NetSpec(100.0, 0.0))
    assert slow.time_s == pytest.approx(10 * fast.time_s, rel=1e-6)


def test_main_writes_table_figure_and_markdown(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert sw.main(["--worlds", "2,4", "--methods", "ring,dgc", "--densities", "0.25,0.001",
                    "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ring" in printed and "dgc@0.001" in printed
    assert (out / "sweep_world.png").stat().st_size > 0
    md = (out / "sweep_world.md").read_text()
    assert "| W | ring | dgc@0.25 | dgc@0.001 |" in md
    assert "density 0.001 (P = 11.8 kB): none up to W = 4" in md


def test_main_rejects_bad_arguments():
    with pytest.raises(SystemExit):
        sw.main(["--methods", "butterfly"])
    with pytest.raises(SystemExit):
        sw.main(["--worlds", "1,2"])
