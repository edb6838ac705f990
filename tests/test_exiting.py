"""host.exiting: a command's fast exit still does what an exit owes (threads, atexit, output, code)."""

import subprocess
import sys
import textwrap


def test_exit_now_joins_threads_runs_atexit_flushes_and_keeps_the_code(tmp_path):
    done = tmp_path / "thread"
    script = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from dtemu.host.exiting import exit_now
        atexit.register(lambda: print("atexit ran"))
        def work():
            time.sleep(0.2)
            open({str(done)!r}, "w").write("finished")
        threading.Thread(target=work).start()
        sys.stdout.write("buffered, not flushed")
        exit_now(3)
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "buffered, not flushedatexit ran\n"
    assert done.read_text() == "finished"


def test_the_commands_exit_through_it():
    """The console scripts name ``entry`` (pyproject.toml), which ends in exit_now."""
    text = open("pyproject.toml").read()
    assert 'emu = "dtemu.emu.cli:entry"' in text and 'real = "dtemu.real.cli:entry"' in text
