"""``compute.spread``: the calibrated machine's own variation of a training job (emu only)."""

import statistics

from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.compute_spec import ComputeSpec
from dtemu.core.scenario import parse_scenario
from dtemu.host.train_cost import spread_of


def _durations(spec, n=4000, seed=(1, 2)):
    timer = ComputeTimer(spec, None, seed=list(seed))
    return [timer.duration(100) for _ in range(n)]


def test_spread_draws_jobs_around_their_mean_with_that_deviation():
    times = _durations(ComputeSpec(train_s_per_sample=1e-3, spread=0.08))
    assert abs(statistics.mean(times) - 0.1) < 0.002
    assert abs(statistics.pstdev(times) / 0.1 - 0.08) < 0.005
    assert min(times) > 0


def test_spread_is_seeded_and_leaves_the_jitter_stream_alone():
    spec = ComputeSpec(train_s_per_sample=1e-3, jitter=0.2)
    both = ComputeSpec(train_s_per_sample=1e-3, jitter=0.2, spread=0.1)
    assert _durations(both, 50) == _durations(both, 50)              # the same seed, the same run
    plain, spread = _durations(spec, 50), _durations(both, 50)
    assert plain != spread
    # the jitter factors are the same draws: the ratio is the spread's factor alone, mean 1
    ratios = [s / p for s, p in zip(spread, plain)]
    assert all(1 - 0.1 * 3 ** 0.5 - 1e-9 <= r <= 1 + 0.1 * 3 ** 0.5 + 1e-9 for r in ratios)


def test_real_mode_stages_no_spread():
    timer = ComputeTimer(ComputeSpec(train_s_per_sample=1e-3, spread=0.3), None, seed=0)
    assert timer.stretch() == 1.0   # its machines vary by themselves


def test_no_spread_keeps_a_scenarios_digest():
    raw = {"name": "s", "mode": "fl", "fl": {"clients": 2, "rounds": 1}}
    with_key = {**raw, "compute": {"default": {"spread": 0.0}}}
    assert parse_scenario(raw).digest() == parse_scenario(with_key).digest()
    assert parse_scenario({**raw, "compute": {"default": {"spread": 0.05}}}).digest() != parse_scenario(raw).digest()


def test_spread_of_step_times():
    assert spread_of([0.1]) == 0.0
    assert spread_of([0.1, 0.1, 0.1]) < 1e-12
    assert abs(spread_of([0.09, 0.11]) - 0.1) < 1e-12
