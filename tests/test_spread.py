"""``compute.spread``: the calibrated machine's own variation of a training job (emu only)."""

import statistics

import pytest

from dtemu.core.errors import ScenarioError
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.compute_spec import ComputeSpec
from dtemu.core.scenario import parse_scenario
from dtemu.host.train_cost import spread_of, spread_parts


def _durations(spec, n=4000, seed=(1, 2)):
    timer = ComputeTimer(spec, None, seed=list(seed))
    return [timer.duration(100) for _ in range(n)]


def test_spread_draws_jobs_around_their_mean_with_that_deviation():
    times = _durations(ComputeSpec(train_s_per_sample=1e-3, spread=0.08))
    assert abs(statistics.mean(times) - 0.1) < 0.002
    assert abs(statistics.pstdev(times) / 0.1 - 0.08) < 0.005
    assert min(times) > 0


def test_a_steps_own_spread_averages_out_over_a_longer_job():
    spec = ComputeSpec(train_s_per_sample=1e-3, spread=0.03, spread_per_sample=0.4)
    for samples in (16, 1600):
        timer = ComputeTimer(spec, None, seed=[1, 2])
        times = [timer.duration(samples) for _ in range(4000)]
        want = (0.03 ** 2 + 0.4 ** 2 / samples) ** 0.5   # 0.104 for one 16-sample step, 0.031 for 100
        assert abs(statistics.pstdev(times) / statistics.mean(times) - want) < 0.1 * want


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


def test_spread_of_step_times_is_robust_to_one_held_up_step():
    import numpy as np

    assert spread_of([0.1, 0.1, 0.1]) == 0.0   # too few to say
    steps = list(np.random.default_rng(0).normal(0.1, 0.006, 4000))
    assert abs(spread_of(steps) - 0.06) < 0.004
    steps = list(np.random.default_rng(1).normal(0.1, 0.006, 48))
    held_up = steps[:-1] + [0.4]
    assert abs(spread_of(held_up) - spread_of(steps)) < 0.01   # a standard deviation would be 0.42


def test_spread_parts_separates_a_steps_own_variation_from_slow_spells():
    """Steps of 32 samples: each varies by 8% on its own, and each run of 6 by a common 4% (a slow
    spell): the parts come back as (0.04, 0.08 * sqrt(32))."""
    import numpy as np

    rng = np.random.default_rng(3)
    runs = []
    for _ in range(200):
        run = []
        for _block in range(4):
            spell = 1 + 0.04 * rng.standard_normal()
            run += list(0.1 * spell * (1 + 0.08 * rng.standard_normal(6)))
        runs.append(run)
    spread, per_sample = spread_parts(runs, batch=32)
    assert abs(spread - 0.04) < 0.006
    assert abs(per_sample / 32 ** 0.5 - 0.08) < 0.006
    assert spread_parts([[0.1] * 24, [0.1] * 24], batch=32) == (0.0, 0.0)


def test_a_nodes_first_training_job_carries_its_warmup_once():
    spec = ComputeSpec(train_s_per_sample=1e-3, warmup_s=0.25, slowdown=2.0)
    timer = ComputeTimer(spec, None, seed=[1, 2])
    assert timer.duration(100, kind="eval") == 0.0                # (not a training job: it keeps the warm-up)
    assert abs(timer.duration(100) - (0.2 + 0.5)) < 1e-12         # 100 samples at 2 ms, and 0.25 s x 2
    assert abs(timer.duration(100) - 0.2) < 1e-12                 # then never again
    raw = {"name": "s", "mode": "fl", "fl": {"clients": 2, "rounds": 1}}
    assert parse_scenario(raw).digest() == parse_scenario(
        {**raw, "compute": {"default": {"warmup_s": 0.0}}}).digest()


def test_a_warmup_step_by_step_falls_on_the_nodes_first_steps_whichever_jobs_hold_them():
    # a geo worker's job is one step: its second pass carries the second step's warm-up, which
    # charging it all to the first job (excluded as the run's first unit) left out (notebook entry 44)
    spec = ComputeSpec(train_s_per_sample=1e-3, warmup_s=[0.5, 0.2, 0.05])
    timer = ComputeTimer(spec, None, seed=[1, 2], batch=10)
    assert [round(timer.duration(10), 9) for _ in range(4)] == [0.51, 0.21, 0.06, 0.01]
    two = ComputeTimer(spec, None, seed=[1, 2], batch=10)          # a job of two steps takes two steps'
    assert [round(two.duration(20), 9) for _ in range(3)] == [0.72, 0.07, 0.02]
    whole = ComputeTimer(spec, None, seed=[1, 2])                  # no batch known: all in the first job
    assert [round(whole.duration(10), 9) for _ in range(2)] == [0.76, 0.01]
    with pytest.raises(ScenarioError, match=r"warmup_s.*>= 0 \(item 1\)"):
        parse_scenario({"name": "s", "mode": "fl", "fl": {"clients": 2, "rounds": 1},
                        "compute": {"default": {"warmup_s": [0.1, -0.1]}}})


def test_the_warmup_is_the_median_of_fresh_processes_first_steps_beyond_steady_ones_step_by_step():
    from dtemu.host.train_cost import warmup_of

    assert warmup_of([[0.2, 0.1], [0.3, 0.0], [0.25, 0.05]]) == [0.25, 0.05]
    assert warmup_of([[0.4, 0.1]], per=2) == [0.2, 0.05]     # two processes that warmed up at once on a machine
    assert warmup_of([[-0.01, 0.0], [-0.02, 0.0], [0.0, 0.0]]) == []   # (noise below steady: none)
    assert warmup_of([[0.2, 0.0, 0.0]]) == [0.2]
    assert warmup_of([]) == []


def test_another_spread_draw_moves_the_spread_alone():
    """compute.spread_draw: another draw of the machines' variation (emu validate --draws); the jitter
    stream and draw 0's arithmetic stay as they were."""
    both = ComputeSpec(train_s_per_sample=1e-3, jitter=0.2, spread=0.1)

    def durations(draw):
        timer = ComputeTimer(both, None, seed=[1, 2], spread_draw=draw)
        return [timer.duration(100) for _ in range(50)]

    assert durations(0) == _durations(both, 50)                     # the seed's own draw: unchanged
    assert durations(1) != durations(0) and durations(1) == durations(1) and durations(2) != durations(1)
    plain = _durations(ComputeSpec(train_s_per_sample=1e-3, jitter=0.2), 50)
    for draw in (1, 2):   # the jitter factors are the same draws: the ratio is the spread's factor alone
        ratios = [s / p for s, p in zip(durations(draw), plain)]
        assert all(1 - 0.1 * 3 ** 0.5 - 1e-9 <= r <= 1 + 0.1 * 3 ** 0.5 + 1e-9 for r in ratios)


def test_the_seeds_own_spread_draw_keeps_a_scenarios_digest_and_a_bad_one_is_refused():
    raw = {"name": "s", "mode": "fl", "fl": {"clients": 2, "rounds": 1}}
    assert parse_scenario({**raw, "compute": {"spread_draw": 0}}).digest() == parse_scenario(raw).digest()
    assert parse_scenario({**raw, "compute": {"spread_draw": 3}}).compute.spread_draw == 3
    with pytest.raises(ScenarioError, match="spread_draw"):
        parse_scenario({**raw, "compute": {"spread_draw": -1}})
