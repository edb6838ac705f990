"""Calibration profiles: ``emu calibrate`` measures a scenario's costs here, a scenario or
``emu run --profile`` applies them before its own --set, and a file that is no profile, or
that would change the training, is refused at ``compute.profile`` with exit 2."""

from __future__ import annotations

import pytest
import yaml

from dtemu.core.errors import ScenarioError
from dtemu.emu.cli import main as emu_main
from dtemu.host.profile import read_profile
from dtemu.host.scenario_file import load_scenario
from helpers import needs_mnist

TINY = "name: tiny\nmodel: small_cnn\ndata: {test_samples: 200}\nfl: {clients: 2, rounds: 1, subset: 64, batch_size: 32}\n"


def write_profile(path, sets: dict, **extra) -> None:
    path.write_text(yaml.safe_dump({"format": 1, "machine": {"cpu": "test"}, "sets": sets, **extra}))


def test_a_scenario_names_its_profile_relative_to_its_folder_and_its_own_sets_win(tmp_path):
    (tmp_path / "profiles").mkdir()
    write_profile(tmp_path / "profiles" / "here.yaml", {"compute.default.train_s_per_sample": 2.5e-4,
                                                        "compute.nodes.controller.decode_s_per_mb": 1e-3,
                                                        "network.framing": "rtps"})
    path = tmp_path / "s.yaml"
    path.write_text(TINY + "compute: {profile: profiles/here.yaml}\n")
    s = load_scenario(path)
    assert s.compute.default.train_s_per_sample == 2.5e-4 and s.network.framing == "rtps"
    assert s.compute.nodes["controller"].decode_s_per_mb == 1e-3
    assert s.compute.profile == str((tmp_path / "profiles" / "here.yaml").resolve())
    assert load_scenario(path, ["compute.default.train_s_per_sample=1.0e-3"]).compute.default.train_s_per_sample == 1e-3
    # the same costs written out by hand give the same digest: the path is not part of it
    by_hand = tmp_path / "t.yaml"
    by_hand.write_text(TINY + "compute: {default: {train_s_per_sample: 2.5e-4}, nodes: {controller: "
                       "{decode_s_per_mb: 1.0e-3}}}\nnetwork: {framing: rtps}\n")
    assert load_scenario(by_hand).digest() == s.digest()


def test_an_override_of_a_whole_mapping_keeps_the_profiles_costs_inside_it(tmp_path):
    """``--set compute.nodes={client2: {slowdown: 4}}`` replaces the nodes' mapping; the profile's
    cost for the controller, inside it, stays (the user did not set it); one the user names is theirs."""
    write_profile(tmp_path / "p.yaml", {"compute.nodes.controller.decode_s_per_mb": 1e-3,
                                        "compute.default.decode_s_per_mb": 2e-3})
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    s = load_scenario(path, ["compute.nodes={client2: {slowdown: 4}}"], profile=tmp_path / "p.yaml")
    assert s.compute.nodes["controller"].decode_s_per_mb == 1e-3 and s.compute.nodes["client2"].slowdown == 4
    assert s.compute.default.decode_s_per_mb == 2e-3
    mine = load_scenario(path, ["compute.nodes={controller: {decode_s_per_mb: 5.0e-3}}"], profile=tmp_path / "p.yaml")
    assert mine.compute.nodes["controller"].decode_s_per_mb == 5e-3


@pytest.mark.parametrize("text,message", [
    ("format: 1\nsets: {fl.lr: 10.0}\n", "sets only the machine's costs"),
    ("format: 1\nsets: {compute.default: {slowdown: 2}}\n", "must be a single value"),
    ("format: 1\nsets: {compute.default.warmup_s: [0.1, x]}\n", "or a list of numbers"),
    ("name: not a profile\n", "is not a dtemu profile"),
    ("format: 2\nsets: {}\n", "is not a dtemu profile"),
])
def test_what_is_no_profile_is_refused_at_its_key(tmp_path, text, message):
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(ScenarioError, match=message) as err:
        read_profile(tmp_path / "p.yaml")
    assert err.value.path == "compute.profile"


def test_a_missing_profile_is_exit_2(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    assert emu_main(["run", str(path), "--no-tui", "--profile", str(tmp_path / "nope.yaml"),
                     "--out", str(tmp_path / "run")]) == 2
    assert "compute.profile: cannot read profile" in capsys.readouterr().err


@needs_mnist
def test_calibrate_writes_a_profile_that_a_run_applies(tmp_path, monkeypatch, capsys):
    from helpers import DATA

    monkeypatch.setenv("DTEMU_DATA", DATA)
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    assert emu_main(["calibrate", str(path), "--reps", "1", "--out", str(tmp_path / "p.yaml")]) == 0
    profile = read_profile(tmp_path / "p.yaml")
    assert profile["measured"]["batch_size"] == 32 and profile["measured"]["input_shape"] == [1, 28, 28]
    assert profile["measured"]["ranks_training_at_once"] == 1 and profile["measured"]["contention"] == 1.0
    assert profile["measured"]["device"] == "cpu"   # (a GPU's step says so: tests/test_fake_gpu.py)
    assert profile["machine"]["fingerprint"] and profile["machine"]["cores"] >= 1
    sets = profile["sets"]
    assert sets["compute.default.train_s_per_sample"] > 0 and sets["compute.default.decode_s_per_mb"] > 0
    assert sets["compute.nodes.controller.decode_s_per_mb"] > 0 and sets["network.framing"] == "rtps"
    # a message's own CPU over DDS, each side (real.message_costs: a reader process on loopback)
    assert 0 < sets["compute.default.send_s_per_message"] < 0.01 and 0 < sets["compute.default.recv_s_per_message"] < 0.01
    # and per MB of it (large messages: framing and sockets; the receive thread beyond decoding's copy)
    assert 0 < sets["compute.default.send_s_per_mb"] < 0.05 and 0 <= sets["compute.default.recv_s_per_mb"] < 0.05
    assert sets["compute.default.cpu.encode_s_per_mb"] > 0  # an FL client's codec encoding its update
    # the controller's own work: its rule's aggregation, and saving a checkpoint
    assert sets["compute.nodes.controller.cpu.sum_s_per_mb"] > 0 and sets["compute.nodes.controller.cpu.encode_s_per_mb"] > 0
    s = load_scenario(path, profile=tmp_path / "p.yaml")
    assert s.compute.default.train_s_per_sample == pytest.approx(sets["compute.default.train_s_per_sample"], rel=1e-6)
    assert emu_main(["run", str(path), "--no-tui", "--profile", str(tmp_path / "p.yaml"),
                     "--out", str(tmp_path / "run")]) == 0


@needs_mnist
def test_calibrate_together_times_every_training_rank_at_once(tmp_path, monkeypatch):
    """--together: the step of the scenario's two clients training at once on this machine (what a
    run whose ranks share it sees), recorded as such; alone it is one rank's."""
    from helpers import DATA

    monkeypatch.setenv("DTEMU_DATA", DATA)
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    assert emu_main(["calibrate", str(path), "--reps", "1", "--together", "--out", str(tmp_path / "p.yaml")]) == 0
    profile = read_profile(tmp_path / "p.yaml")
    assert profile["measured"]["ranks_training_at_once"] == 2 and profile["measured"]["contention"] >= 1.0
    assert profile["sets"]["compute.default.train_s_per_sample"] > 0
    # and the fresh processes' start-up in their first steps, step by step, which a node's first
    # steps carry (none listed where no step took longer than a steady one)
    warmup = profile["sets"].get("compute.default.warmup_s", [])
    assert isinstance(warmup, list) and len(warmup) <= 4 and all(w >= 0 for w in warmup)
    assert "--together" in (tmp_path / "p.yaml").read_text().splitlines()[0]
    reference = profile["measured"]["reference"]
    assert reference["ranks"] == 2 and reference["s_per_sample"] == pytest.approx(
        profile["sets"]["compute.default.train_s_per_sample"], rel=1e-6)
    # emu validate follows the host's speed by this step, timed again as calibrated
    from dtemu.emu.calibrate import host_speed
    from dtemu.host.scenario_file import load_scenario

    assert 0.2 < host_speed(load_scenario(str(path)), profile, None) < 5


def test_a_profile_follows_the_hosts_speed_in_every_cpu_price_and_nothing_else():
    from dtemu.emu.calibrate import scaled

    profile = {"measured": {"reference": {"s_per_sample": 1e-3}},
               "sets": {"compute.default.train_s_per_sample": 1e-3, "compute.default.cpu.sum_s_per_mb": 2e-4,
                        "compute.default.send_s_per_message": 5e-5, "compute.default.spread": 0.05,
                        "compute.default.warmup_s": [0.1, 0.02],
                        "network.send_window_bytes": 2097152, "network.framing": "rtps"}}
    moved = scaled(profile, 1.1)
    assert moved["sets"] == {"compute.default.train_s_per_sample": pytest.approx(1.1e-3),
                             "compute.default.cpu.sum_s_per_mb": pytest.approx(2.2e-4),
                             "compute.default.send_s_per_message": pytest.approx(5.5e-5),
                             "compute.default.warmup_s": [pytest.approx(0.11), pytest.approx(0.022)],
                             "compute.default.spread": 0.05, "network.send_window_bytes": 2097152,
                             "network.framing": "rtps"}
    assert moved["measured"]["host_factor"] == 1.1 and "host_factor" not in profile["measured"]


def test_contention_slows_every_cpu_cost_and_nothing_else():
    from dtemu.emu.calibrate import _times

    assert _times("compute.default.decode_s_per_mb=1.000000e-03", 2.0) == "compute.default.decode_s_per_mb=2.000000e-03"
    assert _times("compute.default.cpu.apply_s_per_mb=1.0e-03", 1.5) == "compute.default.cpu.apply_s_per_mb=1.500000e-03"
    assert _times("compute.default.send_s_per_message=5e-05", 2.0) == "compute.default.send_s_per_message=1.000000e-04"
    assert _times("network.send_window_bytes=8388608", 2.0) == "network.send_window_bytes=8388608"
    assert _times("network.framing=rtps", 2.0) == "network.framing=rtps"


def test_the_controllers_decoding_is_priced_in_the_scenarios_codec():
    """A q8 update is a quarter of fp32's bytes, and each of its bytes becomes a float: per MB of what
    travels, the controller's decoding costs more than fp32's (emu.federation_costs.fl_decode_costs)."""
    from dtemu.core.compression.codecs import CodecParams
    from dtemu.emu.federation_costs import fl_decode_costs

    fp32 = fl_decode_costs(200_000, reps=3)
    q8 = fl_decode_costs(200_000, reps=3, codec=CodecParams("q8"))
    assert q8["update_bytes"] < fp32["update_bytes"] / 3 and q8["model_bytes"] == fp32["model_bytes"]
    assert q8["controller"] > fp32["controller"]


def test_a_messages_cpu_is_priced_in_the_machines_seconds_under_a_share(monkeypatch):
    """real.message_costs gives CPU seconds; under a CPU share the machine's other work is timed in
    wall seconds within it, so a second of CPU is 1/share of them (and alone, one)."""
    import subprocess
    import types

    from dtemu.emu.calibrate import _message_sets

    measured = '{"send": 1e-4, "recv": 2e-4, "send_per_mb": 3e-4, "recv_per_mb": 4e-4}'
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: types.SimpleNamespace(returncode=0, stdout=measured, stderr=""))
    alone = dict(s.split("=") for s in _message_sets())
    shared = dict(s.split("=") for s in _message_sets(0.5))
    assert set(alone) == {f"compute.default.{side}_s_per_{u}" for side in ("send", "recv") for u in ("message", "mb")}
    assert float(alone["compute.default.recv_s_per_mb"]) == pytest.approx(4e-4)
    assert all(float(shared[k]) == pytest.approx(2 * float(alone[k])) for k in alone)



def test_messages_are_priced_on_the_path_the_run_takes(monkeypatch):
    """Under a share (the testbed's machines: the lan profile, every byte through DDS) a message is
    timed on the ``dds`` path; alone (real launch on one machine: large payloads beside DDS) on
    ``shm``; ``--messages-over`` chooses either.  The path is written into the profile."""
    import subprocess
    import types

    from dtemu.emu import calibrate

    asked = []

    def run(cmd, **kw):
        asked.append(cmd[cmd.index("--path") + 1])
        return types.SimpleNamespace(returncode=0, stdout='{"send": 1e-4, "recv": 2e-4, "send_per_mb": 3e-4, '
                                                          '"recv_per_mb": 4e-4}', stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    calibrate._message_sets(0.5, "dds")
    calibrate._message_sets(None, "shm")
    assert asked == ["dds", "shm"]
    with pytest.raises(ValueError, match="path must be one of"):
        from dtemu.real.message_costs import message_costs
        message_costs(path="tcp")


def test_messages_are_priced_on_the_path_the_testbeds_ranks_take(monkeypatch):
    from dtemu.emu.calibrate import messages_path

    monkeypatch.delenv("DTEMU_DDS_STREAM", raising=False)
    assert (messages_path(None), messages_path(0.5)) == ("shm", "dds")
    monkeypatch.setenv("DTEMU_DDS_STREAM", "1")   # large payloads on the TCP stream beside DDS
    assert (messages_path(None), messages_path(0.5)) == ("shm", "stream")


@pytest.mark.slow
def test_a_mb_through_dds_costs_the_reader_more_than_one_beside_it():
    """The reason the path matters (notebook entry 39): over the lan profile every fragment crosses the
    kernel's UDP path and CycloneDDS's reassembly; beside DDS, a MB is a copy out of shared memory."""
    pytest.importorskip("cyclonedds")
    from dtemu.real.message_costs import message_costs

    shm, dds = message_costs(messages=200, path="shm"), message_costs(messages=200, path="dds")
    assert dds["recv_per_mb"] > 1.5 * shm["recv_per_mb"]


def test_an_ops_cpu_seconds_are_given_in_the_shares_seconds_and_nothing_else():
    """The roles' ops are timed in CPU seconds (emu.costs.median_cpu_s); under a share of 0.5 a machine
    takes twice as long for each, as for its messages; a per-sample price and the framing stay."""
    from dtemu.emu.calibrate import _share_of

    assert _share_of("compute.default.cpu.apply_s_per_mb=1.0e-03", 0.5) == "compute.default.cpu.apply_s_per_mb=2.000000e-03"
    assert _share_of("compute.nodes.controller.decode_s_per_mb=1e-03", 0.25) == \
        "compute.nodes.controller.decode_s_per_mb=4.000000e-03"
    assert _share_of("compute.default.cpu.apply_s_per_mb=1.0e-03", None) == "compute.default.cpu.apply_s_per_mb=1.0e-03"
    assert _share_of("compute.default.train_s_per_sample=1e-03", 0.5) == "compute.default.train_s_per_sample=1e-03"
    assert _share_of("network.framing=rtps", 0.5) == "network.framing=rtps"
