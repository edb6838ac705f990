"""Work beside a rank's role, at the lowest CPU priority: the evaluations of ``core.runtime.requests.Evaluate``.

Evaluation is the experimenter's instrument and takes no time in emu.  For real
a rank's clock is the wall's: a controller that evaluated between two rounds
started every later round the evaluation's seconds late (fl_straggler: 0.2 s of
scenario time a round, 3.6 s over 20 rounds), so client3's offline window and
the straggler's deadlines fell on other rounds than emu's.  Here one thread per
rank runs them, one after another in the order asked, at nice 19 (Linux gives a
thread its own nice value): it takes the cores the training leaves idle, which
in a round with a timeout is most of the round.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable

from dtemu.host.thread_name import name_this_thread

NICE = 19


class Aside:
    """One background thread that runs ``fn`` and hands ``done(value, error)`` the outcome."""

    def __init__(self, name: str = "aside"):
        self._name = name
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any], done: Callable[..., None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((fn, done))

    def join(self) -> None:
        """Until everything submitted so far has been done."""
        self._jobs.join()

    def _work(self) -> None:
        name_this_thread("dtemu-aside")
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (OSError, AttributeError):  # not allowed, or not Linux: it runs at the rank's priority
            pass
        while True:
            fn, done = self._jobs.get()
            try:
                try:
                    value = fn()
                except Exception as err:  # the role's to see, in its log: never this thread's end
                    done(None, err)
                else:
                    done(value)
            except Exception:  # done itself failed (a full disk): the next job still runs
                pass
            finally:
                self._jobs.task_done()
