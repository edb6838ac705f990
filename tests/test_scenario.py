import pytest

from dtemu.core.errors import ScenarioError
from dtemu.core.scenario import apply_override, parse_scenario
from dtemu.host.scenario_file import load_scenario

BASE = {"name": "t"}


def err(raw, overrides=()):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(raw, list(overrides))
    return str(info.value)


def test_defaults_are_valid():
    s = parse_scenario(BASE)
    assert s.fl.codec == "fp32" and s.node_names == ["controller", "client1", "client2"]


def test_bad_choice_names_path_expected_and_found():
    assert err({**BASE, "fl": {"codec": "int8"}}) == "fl.codec: expected one of fp32, q8, s4, sq8, got 'int8'"


def test_unknown_key_is_refused_with_its_path():
    msg = err({**BASE, "network": {"default": {"upmbps": 10}}})
    assert msg.startswith("network.default.upmbps: unknown key")


@pytest.mark.parametrize(
    "raw, path",
    [
        ({"fl": {"rounds": "ten"}}, "fl.rounds: expected an integer, got 'ten'"),
        ({"fl": {"rounds": 2.5}}, "fl.rounds: expected an integer"),
        ({"fl": {"error_feedback": "yes"}}, "fl.error_feedback: expected a boolean"),
        ({"fl": {"round_timeout_s": 0}}, "fl.round_timeout_s: expected a value > 0"),
        ({"fl": {"density": 1.5}}, "fl.density: expected a fraction in (0, 1]"),
        ({"network": {"default": {"loss": 2}}}, "network.default.loss: expected a probability"),
        ({"fl": {"clients": 2, "min_clients": 3}}, "fl.min_clients: 3 is more than fl.clients (2)"),
        ({"compute": {"nodes": {"client7": {"slowdown": 2}}}}, "compute.nodes.client7: no such node"),
        ({"faults": {"offline": [{"node": "client1", "start_s": 5, "end_s": 1}]}}, "faults.offline[0].end_s"),
        ({"faults": {"offline": [{"node": "client1"}]}}, "faults.offline[0].start_s: missing required key"),
        ({"fl": []}, "fl: expected a mapping"),
    ],
)
def test_invalid_fields_name_their_path(raw, path):
    assert err({**BASE, **raw}).startswith(path)


def test_set_overrides_parse_yaml_values():
    s = parse_scenario(BASE, ["fl.codec=q8", "fl.rounds=3", "network.nodes.client1.up_mbps=10", "fl.subset=null"])
    assert (s.fl.codec, s.fl.rounds, s.link("client1").up_mbps, s.fl.subset) == ("q8", 3, 10.0, None)
    assert s.link("client2").up_mbps == s.network.default.up_mbps


def test_set_errors():
    assert err(BASE, ["fl.codec"]).startswith("--set")
    assert err(BASE, ["fl.codec=int8"]).startswith("fl.codec: expected one of")
    raw = {"fl": 3}
    with pytest.raises(ScenarioError):
        apply_override(raw, "fl.codec=q8")


def test_digest_ignores_init_path_and_rounds_only():
    a = parse_scenario(BASE)
    assert a.digest() == parse_scenario(BASE, ["fl.init_path=x.dtck", "fl.rounds=20"]).digest()
    assert a.digest() != parse_scenario(BASE, ["fl.lr=0.5"]).digest()


def test_shipped_scenarios_load():
    from pathlib import Path

    for path in sorted(Path(__file__).parent.parent.glob("scenarios/**/*.yaml")):
        load_scenario(path)


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
