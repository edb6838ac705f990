"""Real mode's time scale: every scenario duration stretched alike, measured against the compute model."""

import pytest

from dtemu.core.scenario import parse_scenario, stretched
from dtemu.real.calibrate import time_scale

RAW = {"name": "t", "model": "small_cnn",
       "fl": {"clients": 4, "round_timeout_s": 0.8, "barrier_timeout_s": 30},
       "ddp": {"step_timeout_s": 5.0},
       "compute": {"nodes": {"client4": {"slowdown": 4.0}}},
       "faults": {"offline": [{"node": "client3", "start_s": 5, "end_s": 9}],
                  "partitions": [{"nodes": ["client1"], "start_s": 1, "end_s": 2}],
                  "crashes": [{"node": "client2", "round": 2, "at": "before_train", "restart_after_s": 0.5}],
                  "reorder_s": 0.1}}


def test_every_duration_is_stretched_and_nothing_else():
    s = stretched(parse_scenario(RAW), 2.5)
    assert (s.fl.round_timeout_s, s.fl.barrier_timeout_s, s.ddp.step_timeout_s) == (2.0, 75.0, 12.5)
    assert (s.faults.offline[0].start_s, s.faults.offline[0].end_s) == (12.5, 22.5)
    assert (s.faults.partitions[0].start_s, s.faults.partitions[0].end_s) == (2.5, 5.0)
    assert s.faults.crashes[0].restart_after_s == 1.25 and s.faults.reorder_s == 0.25
    # not durations: a straggler's slowdown is relative already, rounds and links stay
    assert s.compute.nodes["client4"].slowdown == 4.0 and s.fl.rounds == 10
    assert s.link("client1") == parse_scenario(RAW).link("client1")
    assert stretched(parse_scenario(RAW), 1) == parse_scenario(RAW)


@pytest.mark.slow  # (the default run keeps under 10 minutes on 2 cores; issue 45)
def test_the_scale_is_measured_with_the_ranks_that_share_the_cores_training_at_once():
    s = parse_scenario({**RAW, "threads": 2})
    one, _ = time_scale(s, cores=64)  # plenty of cores: only this machine's speed
    four, how = time_scale(s, cores=1)  # four clients x 2 threads on one core
    assert one >= 1 and four >= one and "4 ranks x 2 threads training at once on 1 cores" in how


def _paced(pace, slowdown, elapsed):
    """How long RealPrimitives.computed idles after a job of 100 samples that ran ``elapsed`` s."""
    import time
    from types import SimpleNamespace

    from dtemu.core.runtime.compute import ComputeTimer
    from dtemu.core.runtime.driver import run_blocking
    from dtemu.core.runtime.requests import Compute
    from dtemu.core.runtime.compute_spec import ComputeSpec
    from dtemu.real.primitives import RealPrimitives

    timer = ComputeTimer(ComputeSpec(train_s_per_sample=1e-4, slowdown=slowdown), None, seed=0)
    prims = RealPrimitives("client1", SimpleNamespace(on_reject=None, clock=SimpleNamespace(wall_ns=time.time_ns)),
                           None, (), timer, pace=pace)
    t0 = time.perf_counter()
    run_blocking(prims.computed(Compute(lambda: None, samples=100), elapsed))
    return time.perf_counter() - t0


def test_under_a_time_scale_a_job_lasts_its_modelled_time_times_the_scale():
    # modelled: 100 samples x 0.1 ms x slowdown 4 = 40 ms; at a scale of 3, 120 ms in all
    assert 0.10 <= _paced(3.0, 4.0, 0.02) + 0.02 < 0.6  # the job took 20 ms: it idles the rest
    assert _paced(3.0, 4.0, 0.5) < 0.05  # slower than its modelled time already: no idling
    # no time scale: a straggler idles (slowdown - 1) x its measured time, as before
    assert 0.06 <= _paced(None, 4.0, 0.02) < 0.5


def test_esyncs_question_timeout_is_a_duration_and_only_esyncs():
    raw = {"name": "e", "fl": {"clients": 2, "algorithm": "esync", "esync": {"query_timeout_s": 2.0}}}
    assert stretched(parse_scenario(raw), 3).fl.esync.query_timeout_s == 6.0
    other = stretched(parse_scenario(RAW), 3)   # fedavg: the rule's key keeps its default, and is no error
    assert other.fl.esync == parse_scenario(RAW).fl.esync
