
import pytest
from hypothesis import given, strategies as st

from dtemu.core.wire import messages
from dtemu.core.errors import MessageError
from dtemu.core.wire.messages import ClientUpdate, ModelBlob, Stop, TrainCmd

SAMPLES = [
    TrainCmd(3, 6000, 1, 0.05, 2**62),
    Stop(10, "done"),
    ModelBlob.of(4, b"FP32" + bytes(40)),
    ClientUpdate(2, 99, "client1", 6000, "delta", 94, 0.25, b"S4\x00\x00" + bytes(30)),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    assert messages.decode(messages.encode(msg)) == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_truncation_is_a_typed_error(msg):
    data = messages.encode(msg)
    cut = len(data) - len(getattr(msg, "packet", b"")) - 1
    for n in range(0, max(cut, 0)):
        with pytest.raises(MessageError):
            messages.decode(data[:n])


def test_bad_header_fields():
    data = bytearray(messages.encode(SAMPLES[0]))
    for offset, value in ((0, ord("X")), (4, 9), (5, 77), (6, 1)):
        bad = bytearray(data)
        bad[offset] = value
        with pytest.raises(MessageError):
            messages.decode(bytes(bad))


def test_damaged_model_blob_is_refused():
    data = bytearray(messages.encode(SAMPLES[2]))
    data[-1] ^= 0xFF
    with pytest.raises(MessageError, match="checksum"):
        messages.decode(bytes(data))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_message_error(data):
    try:
        messages.decode(data)
    except MessageError:
        pass


@given(st.integers(0, 120), st.integers(0, 255))
def test_mutated_messages_only_raise_message_error(pos, value):
    for msg in SAMPLES:
        data = bytearray(messages.encode(msg))
        data[pos % len(data)] = value
        try:
            messages.decode(bytes(data))
        except MessageError:
            pass
