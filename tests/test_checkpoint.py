import numpy as np
import pytest

from core.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from core.errors import CheckpointError
from core.rundir import atomic_write


def sample():
    return Checkpoint(5, np.arange(10, dtype=np.float32), "abc", {"rounds_failed": 1})


def test_round_trip():
    back = decode_checkpoint(encode_checkpoint(sample()), expected_dim=10)
    assert back.round == 5 and back.scenario_digest == "abc" and back.extra == {"rounds_failed": 1}
    np.testing.assert_array_equal(back.weights, sample().weights)


@pytest.mark.parametrize("cut", [0, 3, 12, 30, -1, -4])
def test_truncated_is_refused(cut):
    data = encode_checkpoint(sample())
    with pytest.raises(CheckpointError):
        decode_checkpoint(data[:cut])


def test_corrupt_and_mismatched_are_refused():
    data = bytearray(encode_checkpoint(sample()))
    data[-1] ^= 1
    with pytest.raises(CheckpointError, match="checksum"):
        decode_checkpoint(bytes(data))
    with pytest.raises(CheckpointError, match="model has 11"):
        decode_checkpoint(encode_checkpoint(sample()), expected_dim=11)
    with pytest.raises(CheckpointError, match="bad magic"):
        decode_checkpoint(b"XXXX" + bytes(20))


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "c.dtck"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["c.dtck"]
