"""The mode registry (core.modes): every mode answers everything the rest of dtemu asks of it."""

import pytest

from dtemu.core.modes import MODES
from dtemu.core.scenario import parse_scenario
from dtemu.host.resolve import resolve

SCENARIOS = {
    "fl": {"name": "m", "fl": {"clients": 3}},
    "ddp": {"name": "m", "mode": "ddp", "ddp": {"workers": 3, "max_steps": 7}},
    "geo": {"name": "m", "mode": "geo", "network": {"sites": {"c": {}, "a": {}, "b": {}}}},
    "flower": {"name": "m", "mode": "flower", "flower": {"server_app": "a:s", "client_app": "a:c"}},
}


def test_every_mode_is_registered_with_a_scenario_here():
    assert set(MODES) == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(MODES))
def test_a_mode_answers_for_its_scenario(name):
    s = parse_scenario(SCENARIOS[name])
    kind = s.kind
    assert kind is MODES[name] and kind.name == name
    nodes = kind.node_names(s)
    assert len(set(nodes)) == len(nodes) and set(kind.training_nodes(s)) <= set(nodes)
    roles = [kind.role_of(s, rank, None) for rank in range(len(nodes))]
    assert [r.name for r in roles] == nodes
    readers = kind.readers_of(s)
    published = {t for r in roles for t in r.publishes}
    assert readers is None or set(readers) <= published
    # who writes each topic, as a barrier waits for it (real.primitives), is what the roles publish
    assert kind.writers_of(s) == _published_by(roles)
    assert kind.batch_size(s) > 0 and kind.unit in ("round", "step")
    assert kind.rounds(s) is None or kind.rounds(s) > 0
    assert callable(resolve(kind.audit)) and callable(resolve(kind.report))
    assert {"fl", "ddp", "ps", "geo", "flower"} >= kind.digest_sections


def test_digests_keep_only_their_modes_sections():
    fl = parse_scenario(SCENARIOS["fl"])
    assert fl.digest() == parse_scenario({**SCENARIOS["fl"], "ddp": {"workers": 9}}).digest()
    ddp = parse_scenario(SCENARIOS["ddp"])
    assert ddp.digest() == parse_scenario({**SCENARIOS["ddp"], "fl": {"clients": 9}}).digest()


def test_fl_says_who_writes_without_building_every_role_and_agrees_with_them():
    """FL's writers_of is written out (10,000 clients would build 10,000 roles on every rank);
    with a state server it must still match the roles."""
    s = parse_scenario({"name": "m", "fl": {"clients": 3, "algorithm": "esync"}})
    kind = s.kind
    assert kind.writers_of(s) == _published_by([kind.role_of(s, rank, None) for rank in range(len(kind.node_names(s)))])


def _published_by(roles) -> dict[str, set[str]]:
    writers: dict[str, set[str]] = {}
    for role in roles:
        for topic in role.publishes:
            writers.setdefault(topic, set()).add(role.name)
    return writers
