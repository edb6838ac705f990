"""Authenticated FL messages (core.auth): HMAC-SHA256 envelopes, replay windows, keys."""

import pytest
from hypothesis import given, settings, strategies as st

from dtemu.core.wire.auth import WINDOW, Sealer, parse_key
from dtemu.host.keys import load_key
from dtemu.core.errors import AuthError, KeyFileError
from dtemu.host.rundir import read_events
from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation
from test_fl_faults import BASE
from test_fl_protocol import StandIn, of

KEY = bytes(range(32))
TOPIC = "train/client_update"


def sealed(node="client1", key=KEY, incarnation=1, n=1, round_=3, data=b"payload"):
    s = Sealer(key, node, incarnation)
    return [s.seal(TOPIC, round_, data + bytes([i])) for i in range(n)]


def reason(fn):
    with pytest.raises(AuthError) as info:
        fn()
    return info.value.reason


def test_round_trip_gives_message_sender_and_round():
    rx = Sealer(KEY, "controller")
    opened = rx.open(TOPIC, "client1", sealed()[0])
    assert (opened.data, opened.sender, opened.round) == (b"payload\x00", "client1", 3)


def test_a_message_sealed_as_its_pieces_is_the_message_sealed_whole():
    from dtemu.core.runtime.requests import Buffers

    head, body = b"frame header", bytes(range(256)) * 300
    whole = Sealer(KEY, "w1", 1).seal("coll/frames", 5, head + body)
    pieces = Sealer(KEY, "w1", 1).seal("coll/frames", 5, Buffers(head, memoryview(body)))
    assert isinstance(pieces, Buffers) and bytes(pieces) == whole
    assert pieces.parts[-1].obj is body   # the body itself: not copied to be sealed
    assert Sealer(KEY, "w0").open("coll/frames", "w1", bytes(pieces)).data == head + body


def test_wrong_key_tampering_wrong_topic_and_spoofed_sender_are_forged():
    msg = sealed()[0]
    assert reason(lambda: Sealer(b"k" * 32, "controller").open(TOPIC, "client1", msg)) == "forged"
    assert reason(lambda: Sealer(KEY, "controller").open("train/train_cmd", "client1", msg)) == "forged"
    assert reason(lambda: Sealer(KEY, "controller").open(TOPIC, "client2", msg)) == "forged"
    for i in range(len(msg)):
        bad = bytearray(msg)
        bad[i] ^= 0x01
        assert reason(lambda: Sealer(KEY, "controller").open(TOPIC, "client1", bytes(bad))) in ("forged", "unsigned")


def test_unsigned_messages_are_refused_when_a_key_is_set():
    rx = Sealer(KEY, "controller")
    assert reason(lambda: rx.open(TOPIC, "client1", b"DTMS\x01\x04\x00\x00...")) == "unsigned"
    assert reason(lambda: rx.open(TOPIC, "client1", b"")) == "unsigned"


def test_replays_are_refused_reordering_inside_the_window_is_not():
    msgs = sealed(n=WINDOW + 5)
    rx = Sealer(KEY, "controller")
    rx.open(TOPIC, "client1", msgs[2])
    rx.open(TOPIC, "client1", msgs[1])  # overtaken, still new
    assert reason(lambda: rx.open(TOPIC, "client1", msgs[2])) == "replayed"
    rx.open(TOPIC, "client1", msgs[-1])
    assert reason(lambda: rx.open(TOPIC, "client1", msgs[0])) == "replayed"  # too old to tell


def test_a_restarted_sender_goes_on_above_its_previous_life():
    rx = Sealer(KEY, "controller")
    for m in sealed(incarnation=1, n=3):
        rx.open(TOPIC, "client1", m)
    rx.open(TOPIC, "client1", sealed(incarnation=2)[0])


def test_no_key_means_no_envelope():
    assert Sealer(None, "client1").seal(TOPIC, 1, b"x") == b"x"
    assert Sealer(None, "controller").open(TOPIC, "client1", b"x").data == b"x"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_open_raises_only_auth_errors(data):
    try:
        Sealer(KEY, "controller").open(TOPIC, "client1", data)
    except AuthError:
        pass


def test_keys_from_file_or_environment(tmp_path):
    f = tmp_path / "key"
    f.write_text(KEY.hex() + "\n")
    assert load_key(str(f), environ={}) == (KEY, str(f))
    assert load_key(None, environ={"DTEMU_KEY_FILE": str(f)})[0] == KEY
    assert load_key(None, environ={"DTEMU_KEY": "a" * 20})[0] == b"a" * 20
    assert load_key(None, environ={}) == (None, "none")
    with pytest.raises(KeyFileError, match="at least 16"):
        parse_key(b"short", "x")
    with pytest.raises(KeyFileError, match="cannot read"):
        load_key(str(tmp_path / "missing"), environ={})


def run(tmp_path, name, key=None, faults=None, **sets):
    sc = parse_scenario({**BASE, "faults": faults or {}}, [f"{k}={v}" for k, v in sets.items()])
    summary = run_emulation(sc, tmp_path / name, work=StandIn(), key=key)
    return summary, read_events(tmp_path / name)


def test_sealing_changes_bytes_not_training(tmp_path):
    plain, _ = run(tmp_path, "plain")
    signed, events = run(tmp_path, "signed", key=KEY)
    assert signed["model_sha256"] == plain["model_sha256"] and signed["updates"] == {"accepted": 12}
    assert of(events, "run_start")[0]["authenticated"]
    # every message carries sender, round, sequence and a 32-byte MAC
    assert 0 < signed["bytes_up"] - plain["bytes_up"] <= 12 * 60


def test_duplicates_under_a_key_are_replays(tmp_path):
    summary, events = run(tmp_path, "dup", key=KEY, faults={"duplicate_p": 1.0})
    # every copy of rounds 1-3 is refused (the last round's copies land after the run ends)
    assert summary["updates"]["accepted"] == 12 and summary["updates"]["replayed"] >= 9
    stops = of(events, "client_stop")
    assert all(s["rejected"].get("replayed", 0) > 0 for s in stops)  # the clients refuse them too


def test_a_keyed_client_whose_updates_are_damaged_is_refused_as_forged(tmp_path):
    summary, _ = run(tmp_path, "bad", key=KEY, faults={"corrupt": [{"node": "client2", "kind": "nan", "rounds": [2]}]})
    assert summary["updates"] == {"accepted": 11, "forged": 1}
