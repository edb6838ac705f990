"""Processes that share the cores wait passively; one alone keeps the runtime's spinning."""

import os

from dtemu.host import cores


def test_processes_beyond_the_cores_wait_passively(monkeypatch):
    monkeypatch.delenv(cores.WAIT, raising=False)
    assert cores.wait_policy(4, 2, cores=2) == {cores.WAIT: "PASSIVE"}
    assert cores.wait_policy(5, 1, cores=2) == {cores.WAIT: "PASSIVE"}
    assert cores.wait_policy(2, 1, cores=2) == {} and cores.wait_policy(1, 2, cores=2) == {}
    monkeypatch.setenv(cores.WAIT, "ACTIVE")  # the user's choice wins
    assert cores.wait_policy(4, 2, cores=2) == {}


def test_the_default_pool_holds_as_many_workers_as_the_cores_fit():
    assert cores.fitting(1, cores=2) == 2 and cores.fitting(2, cores=2) == 1 and cores.fitting(4, cores=2) == 1
    assert cores.fitting(1) == cores.available() and cores.fitting(10**6) == 1


def test_the_policy_reaches_started_processes_and_leaves_this_one_as_it_was(monkeypatch):
    import subprocess
    import sys

    monkeypatch.delenv(cores.WAIT, raising=False)
    with cores.spawn_env({cores.WAIT: "PASSIVE"}):
        seen = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({cores.WAIT!r}))"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert seen == "PASSIVE" and cores.WAIT not in os.environ
