"""tools/esync_experiments.py's runs are scenarios that load: each experiment's overrides, in FL's
keys, on scenarios/esync.yaml (nothing is run)."""

from pathlib import Path

import pytest

from dtemu.core import bounded_yaml
from dtemu.core.scenario import parse_scenario
from tools import esync_experiments as ex

RUNS = ex.every_run()


@pytest.mark.parametrize("label", sorted(RUNS))
def test_every_experiment_is_a_scenario_that_loads(label):
    raw = bounded_yaml.load(Path(ex.BASE).read_text(), str(ex.BASE))
    scenario = parse_scenario(raw, RUNS[label])
    assert scenario.kind.name == "fl"


def test_the_baselines_are_fl_rules_at_one_batch_a_round():
    raw = bounded_yaml.load(Path(ex.BASE).read_text(), str(ex.BASE))
    ssgd = parse_scenario(raw, RUNS["ssgd-hc150"])
    assert (ssgd.fl.algorithm, ssgd.fl.subset) == ("fedavg", ssgd.fl.batch_size)
    assert parse_scenario(raw, RUNS["esync-hc150"]).fl.algorithm == "esync"
