"""emu's machines shared by a site's nodes (compute.machines: sites; emu.machines): processor sharing."""

import pytest
import simpy

from dtemu.emu.machines import SharedMachine, machines_of


def _ends(jobs: list[tuple[float, float]]) -> list[float]:
    """Each job (start, seconds) on one machine: when it ended."""
    env = simpy.Environment()
    machine = SharedMachine(env)
    ends = [None] * len(jobs)

    def job(i, start, seconds):
        yield env.timeout(start)
        yield from machine.run(seconds)
        ends[i] = env.now

    for i, (start, seconds) in enumerate(jobs):
        env.process(job(i, start, seconds))
    env.run()
    return ends


def test_jobs_share_the_machine_as_processor_sharing():
    assert _ends([(0, 1.0)]) == [1.0]
    assert _ends([(0, 1.0), (0, 1.0)]) == pytest.approx([2.0, 2.0])
    # the short job ends at 1.0 (half speed); the long one then runs alone: 0.5 left at 1.0 -> 1.5
    assert _ends([(0, 1.0), (0, 0.5)]) == pytest.approx([1.5, 1.0])
    # a job that comes later: alone for 0.5 s, then both at half speed
    assert _ends([(0, 1.0), (0.5, 1.0)]) == pytest.approx([1.5, 2.0])
    assert _ends([(0, 1.0), (0, 1.0), (0, 1.0)]) == pytest.approx([3.0, 3.0, 3.0])


def test_an_interrupted_job_leaves_the_machine_to_the_others():
    env = simpy.Environment()
    machine = SharedMachine(env)
    ends = {}

    def job(name, seconds):
        try:
            yield from machine.run(seconds)
            ends[name] = env.now
        except simpy.Interrupt:
            ends[name] = ("crashed", env.now)

    env.process(job("a", 1.0))
    doomed = env.process(job("b", 10.0))

    def crash():
        yield env.timeout(0.4)
        doomed.interrupt()

    env.process(crash())
    env.run()
    # a ran at half speed until 0.4 (0.2 done), then alone: 0.8 more
    assert ends == {"a": pytest.approx(1.2), "b": ("crashed", pytest.approx(0.4))}
    assert machine.left == {}


def test_a_site_is_one_machine_and_a_node_outside_the_sites_has_its_own():
    env = simpy.Environment()
    m = machines_of({"a-ps": "a", "a-w0": "a", "b-w0": "b"}, ["master", "a-ps", "a-w0", "b-w0"], env)
    assert m["a-ps"] is m["a-w0"] and m["a-ps"] is not m["b-w0"] and "master" not in m


@pytest.mark.slow
def test_a_geo_site_on_one_machine_trains_slower_talks_faster_and_trains_the_same_model(tmp_path):
    """Its workers share the machine's CPU (their passes take longer) and reach its PS over loopback (a
    push takes no LAN's wire time: 4.8 MB at the shipped 1 Gbit/s would be 38 ms)."""
    import json
    import subprocess
    import sys

    from helpers import HAVE_MNIST

    if not HAVE_MNIST:
        pytest.skip("MNIST archives not found (set DTEMU_DATA)")
    sets = ["geo.rounds=3", "geo.eval_every=1000", "data.test_samples=200", "geo.workers_per_site=2"]
    out = {}
    for machines in ("nodes", "sites"):
        cmd = [sys.executable, "-m", "dtemu.emu.cli", "run", "scenarios/geo_hips.yaml", "--no-tui",
               "--out", str(tmp_path / machines), "--set", f"compute.machines={machines}"]
        subprocess.run(cmd + [a for s in sets for a in ("--set", s)], check=True, capture_output=True)
        events = [json.loads(line) for line in (tmp_path / machines / "events.jsonl").read_text().splitlines()]
        out[machines] = (json.loads((tmp_path / machines / "summary.json").read_text())["model_sha256"],
                         max(e["compute_s"] for e in events if e["kind"] == "geo_step"),
                         max(e["comm_s"] for e in events if e["kind"] == "deliver" and e["topic"] == "geo/push"
                             and e["node"] == "a-ps"))
    assert out["sites"][0] == out["nodes"][0]   # FSA: the same sums, at other times
    assert out["sites"][1] > out["nodes"][1]    # a pass shares its machine
    assert out["sites"][2] < 0.038 < out["nodes"][2]   # a push crosses loopback, not the LAN


def test_a_messages_cpu_shares_its_nodes_machine():
    """Decoding a message on a site's machine slows the training beside it (and is slowed by it),
    as the transport's threads share a testbed machine's quota; a node of its own pays it alone."""
    import types

    from dtemu.emu.world import EmuNode

    env = simpy.Environment()
    machine = SharedMachine(env)
    world = types.SimpleNamespace(env=env, machines={"a-w0": machine, "a-ps": machine},
                                  on_cpu=lambda s: (yield env.timeout(s)))
    ends = {}

    def run(name, work):
        yield from work
        ends[name] = env.now

    worker = EmuNode(world, "a-w0", 0, (), None, None)
    alone = EmuNode(world, "other", 1, (), None, None)
    env.process(run("decode", worker._on_cpu(1.0)))
    env.process(run("train", machine.run(1.0)))
    env.process(run("alone", alone._on_cpu(1.0)))
    env.run()
    assert ends == {"decode": pytest.approx(2.0), "train": pytest.approx(2.0), "alone": pytest.approx(1.0)}


def test_a_message_is_reassembled_while_its_bytes_come_in_on_its_nodes_machine():
    """The receive thread's CPU per MB (compute.recv_s_per_mb) is spent while the bytes arrive: up to
    the time from the send to the last byte, it delays nothing, and it runs on the receiver's machine
    beside its other jobs; only what is left after the last byte comes before the role has it."""
    import types

    from dtemu.core.runtime.requests import Message
    from dtemu.emu.world import EmuNode

    env = simpy.Environment()
    machine = SharedMachine(env)
    world = types.SimpleNamespace(env=env, machines={"ps": machine}, key=None,
                                  on_cpu=lambda s: (yield env.timeout(s)))
    timer = types.SimpleNamespace(recv_s_per_mb=0.5, decode_s_per_mb=0.0, recv_s_per_message=0.0)
    node = EmuNode(world, "ps", 0, ("t",), None, timer)
    node.up = True   # (as started)
    ends = {}

    def train():
        yield from machine.run(1.0)
        ends["train"] = env.now

    def take(name):
        msg = yield from node.recv(("t",), None)
        ends[name] = env.now, msg.data

    env.process(train())
    # 2 MB, sent at 0 and in at 0.4: 1.0 s of reassembly, 0.4 of it while it came in, 0.6 after its
    # last byte, before the role has it; both on the machine beside the training (three jobs at a
    # third each until the 0.4 ends at 1.2, then two at a half: the role's 0.6 ends at 1.6)
    node.deliver(Message("t", "w", b"x" * 2_000_000, sent_at=0.0, received_at=0.4))
    env.process(take("slow"))
    env.run()
    assert ends["slow"][0] == pytest.approx(1.6)
    assert ends["train"] == pytest.approx(1.0 + 0.4 + 0.6)
    # a transfer longer than its reassembly leaves none of it for after the last byte
    node.deliver(Message("t", "w", b"x" * 200_000, sent_at=0.0, received_at=2.0))
    before = env.now
    env.process(take("hidden"))
    env.run()
    assert ends["hidden"][0] == pytest.approx(before)


def test_a_message_within_a_machine_crosses_its_loopback_not_its_links():
    """On the testbed a site's nodes share one namespace, and their messages cross its loopback, which
    nothing shapes: no wire time and no link's bytes; between machines the links still carry them."""
    from dtemu.emu.links import Link
    from dtemu.emu.network import Network

    env = simpy.Environment()
    lan, wan = Link(up_bps=8e6, down_bps=8e6, latency_s=0.001), Link(up_bps=8e6, down_bps=8e6)
    a, b = SharedMachine(env), SharedMachine(env)
    network = Network(env, {"a-ps": lan, "a-w0": lan, "b-ps": lan}, sites={"a-ps": "a", "a-w0": "a", "b-ps": "b"},
                      wan={"a": wan, "b": wan}, machine_of={"a-ps": a, "a-w0": a, "b-ps": b})
    landed = {}
    for dst in ("a-ps", "b-ps"):
        network.send("a-w0", dst, 1_000_000, lambda dst=dst: landed.setdefault(dst, env.now))
    env.run()
    assert landed["a-ps"] == 0.0
    assert landed["b-ps"] > 1.0   # a MB at 1 MB/s, over the WAN
    assert network.wan_bytes["a"]["up"] == 1_000_000   # the loopback message crossed no link
    assert network.stats["a-w0"].bytes_sent == 2_000_000
    # a multicast loops back to its machine's nodes and crosses the links to the others
    landed.clear()
    network.multicast("a-w0", ["a-ps", "b-ps"], 1_000_000, lambda dst: landed.setdefault(dst, env.now))
    start = env.now
    env.run()
    assert landed["a-ps"] == start and landed["b-ps"] > start + 1.0   # (a MB over the WAN)
    assert network.wan_bytes == {"a": {"up": 2_000_000, "down": 0}, "b": {"up": 0, "down": 2_000_000}}


def test_a_message_from_its_own_machine_is_reassembled_on_it_before_the_role_has_it():
    """Over loopback no wire time hides the receive thread's CPU per MB: it is the transfer, on the
    machine beside its jobs, one message at a time in order; the message lands when it is done."""
    import types

    from dtemu.core.runtime.requests import Message
    from dtemu.emu.world import EmuNode

    env = simpy.Environment()
    machine = SharedMachine(env)
    world = types.SimpleNamespace(env=env, machines={"ps": machine, "w0": machine}, key=None,
                                  on_cpu=lambda s: (yield env.timeout(s)))
    timer = types.SimpleNamespace(recv_s_per_mb=0.5, decode_s_per_mb=0.0, recv_s_per_message=0.0)
    node = EmuNode(world, "ps", 0, ("t",), None, timer)
    node.up = True
    ends, taken = {}, []

    def train():
        yield from machine.run(1.0)
        ends["train"] = env.now

    def take():
        for _ in range(2):
            msg = yield from node.recv(("t",), None)
            taken.append((env.now, msg.data[:1], msg.received_at))

    env.process(train())
    env.process(take())
    # 1 MB then 0.2 MB from w0 at 0: 0.5 s and 0.1 s of reassembly, one after the other, each beside
    # the training at half speed: the first lands at 1.0, the second at 1.2; the training (0.6 done
    # by then) runs its last 0.4 s alone
    node.deliver(Message("t", "w0", b"a" * 1_000_000, sent_at=0.0, received_at=0.0))
    node.deliver(Message("t", "w0", b"b" * 200_000, sent_at=0.0, received_at=0.0))
    env.run()
    assert ends["train"] == pytest.approx(1.6)
    assert [(t, d) for t, d, _ in taken] == [(pytest.approx(1.0), b"a"), (pytest.approx(1.2), b"b")]
    assert [r for _, _, r in taken] == [pytest.approx(1.0), pytest.approx(1.2)]   # as the role had them
