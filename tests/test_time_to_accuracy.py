"""summary.json's time_to_accuracy: the first evaluation that reached each target, or null."""

from dtemu.core.runtime.summary import time_to_accuracy
from dtemu.core.scenario import parse_scenario


def test_the_first_evaluation_at_or_above_each_target():
    history = [(1.0, 0.5), (2.5, 0.81), (4.0, 0.79), (6.0, 0.9)]
    assert time_to_accuracy(history, [0.8, 0.9, 0.95]) == {"0.8": 2.5, "0.9": 6.0, "0.95": None}
    assert time_to_accuracy([], [0.8]) == {"0.8": None}


def test_targets_are_checked_and_do_not_change_the_digest():
    base = parse_scenario({"name": "t"})
    assert base.targets == [0.8, 0.9, 0.95]
    other = parse_scenario({"name": "t", "targets": [0.5]})
    assert other.digest() == base.digest()  # a checkpoint resumes whatever the run measures
    import pytest
    from dtemu.core.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"targets\[0\]"):
        parse_scenario({"name": "t", "targets": [1.5]})
