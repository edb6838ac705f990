"""Sealing is one layer under every mode (core.wire.auth through the driver's context): a sealed
run of ESync (FL's, from a ps scenario), geo (HiPS, BiSparse) and ddp trains the model the open run trains, says so
in summary.json, and refuses what an outsider without the key sends, counted with its reason."""

import json

import pytest

from dtemu.core import events as ev
from dtemu.core.ml.workload import Workload
from dtemu.core.runtime.requests import Message, RecordingContext, Recv
from dtemu.emu.run import run_emulation
from tests.test_geo import StandIn, geo_scenario
from tests.test_ps_form import DATA, scenario as ps_scenario

KEY = b"sixteen or more bytes of key"


def events(folder):
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def both(tmp_path, s, work):
    open_ = run_emulation(s, tmp_path / "open", work=work)
    sealed = run_emulation(s, tmp_path / "sealed", work=work, key=KEY)
    assert (open_["sealed"], sealed["sealed"]) == (False, True)
    assert sealed["model_sha256"] == open_["model_sha256"]
    assert sealed["bytes_up"] > open_["bytes_up"]      # every message carries its envelope
    assert ev.problems(events(tmp_path / "sealed")) == []
    return open_, sealed


def test_a_sealed_esync_run_trains_the_open_runs_model(tmp_path):
    s = ps_scenario(algorithm="esync")
    _, sealed = both(tmp_path, s, Workload(s, DATA))
    assert sealed["rounds"] == 4 and sealed["updates"].get("accepted")
    starts = [e for e in events(tmp_path / "sealed") if e["kind"] == "run_start"]
    assert starts[0]["authenticated"] is True


@pytest.mark.parametrize("sets", [{}, {"geo.compression": "bisparse_fp16", "geo.global_optimizer": False}],
                         ids=["hips", "bisparse_fp16"])
def test_a_sealed_geo_run_trains_the_open_runs_model(tmp_path, sets):
    _, sealed = both(tmp_path, geo_scenario(**sets), StandIn())
    assert sealed["models_agree"] and sealed["rounds"] == 12


def test_a_sealed_ddp_run_trains_the_open_runs_model(tmp_path):
    from dtemu.core.scenario import parse_scenario

    s = parse_scenario({"name": "ddp-sealed", "mode": "ddp", "model": "small_cnn", "threads": 1,
                        "ddp": {"workers": 3, "max_steps": 6, "batch_size": 16, "compression": "dgc",
                                "warmup_steps_per_stage": 1, "density": 0.01}})
    _, sealed = both(tmp_path, s, Workload(s, DATA))
    assert sealed["models_agree"] and sealed["steps"] == 6


def test_an_outsiders_message_is_refused_by_its_reason_in_each_role():
    """The state server, a geo inbox and a collective refuse unsigned and forged bytes and go on."""
    from dtemu.core.esync.state_server import state_server
    from dtemu.core.wire.auth import Sealer
    from dtemu.core.wire.topics import SS_STATE

    ctx = RecordingContext(node="ss", key=KEY)
    names = ["controller", "client1", "ss"]
    role = state_server(ctx, names, [1])
    assert isinstance(next(role), Recv)
    outsider = Sealer(b"another key of sixteen bytes", "client1")
    for data in (b"plain bytes", outsider.seal(SS_STATE, 0, b"x" * 40)):
        request = role.send(Message(SS_STATE, "client1", data, 0.0, 0.0))
        assert isinstance(request, Recv)   # refused, and it waits for the next message
    reasons = [e["reason"] for e in ctx.events if e["kind"] == ev.MESSAGE_REJECTED]
    assert reasons == ["unsigned", "forged"]
    assert ctx.bytes_rejected == len(b"plain bytes") + len(outsider.seal(SS_STATE, 0, b"x" * 40))
