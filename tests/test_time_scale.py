"""Real mode's time scale: every scenario duration stretched alike, measured against the compute model."""

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


def test_the_scale_counts_the_ranks_that_share_the_cores():
    s = parse_scenario(RAW)
    one, _ = time_scale(s, cores=64)  # plenty of cores: only this machine's speed
    four, how = time_scale(s, cores=1)  # four clients x 2 threads on one core
    assert one >= 1 and four >= one and "4 training ranks x 2 threads share 1 cores" in how
