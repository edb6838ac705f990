"""The threads a Flower app runs in (core.flower's roles ask for them through the app, host.flower_app,
as core runs no threads of its own): the ServerApp one step at a time beside the server's role, and
each ClientApp call under a wall-clock limit.

A Flower ServerApp is a blocking function (``main(grid, context)``) whose grid calls wait for the
network; dtemu's roles are generators whose waits are requests to the runtime.  So the app runs in a
thread of its own and every grid call is handed to the role, which carries it out with requests
(sends, receives, deadlines on the runtime's clock) and hands the answer back.  Exactly one of the two
runs at any moment: the role waits while the app computes, the app waits while the role's requests
take their (virtual or real) time.  That keeps an emulated run deterministic for its seed.  The app's
own time between two grid calls (its aggregation, a central evaluation) is measured here (``gap``);
the role charges it to the server node by the compute model (compute.app_s_per_mb), which
``emu calibrate`` fits to these measurements: real mode spends what it spends.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any, Callable

from dtemu.core.flower.app import Call, Finished, Outcome


class Cancelled(BaseException):
    """Raised at the app's grid call when the role is gone (its node crashed, or the run ended).
    A BaseException, so that an app's ``except Exception`` does not swallow it."""


_CANCEL = object()


class AppThread:
    def __init__(self, main: Callable[[Any], None], name: str = "flower-serverapp"):
        """``main(grid)`` runs the app; its grid calls ``ask``."""
        self._main = main
        self._calls: queue.Queue = queue.Queue()  # (call, the slot its answer goes to), or Finished
        self._serving: queue.Queue | None = None  # the slot of the call the role carries out now
        self._thread = threading.Thread(target=self._body, name=name, daemon=True)
        self._started = False
        self.done = False
        self.gap = 0.0  # wall seconds the app ran before its last call
        # and the CPU seconds its thread spent meanwhile (set in the app's thread).  The thread's, not the
        # process's: an emulated run's other threads spent 60% more beside its evaluate calls, which then
        # priced the testbed's 40-60% over (notebook entry 39); an app training on several torch threads
        # is priced short by what the others spend
        self.cpu_gap = 0.0
        # where each asking thread's CPU clock stood at its last answer: a thread's clock is its own (an
        # app may ask from several), and starts at 0 with it
        self._cpu_marks = threading.local()

    def _body(self) -> None:
        self._cpu_marks.at = time.thread_time()   # (its first gap holds the app's start)
        try:
            self._main(self)
            self._calls.put(Finished())
        except Cancelled:
            self._calls.put(Finished(Cancelled()))
        except BaseException as err:  # the app's own failure, whatever it is: the role reports it
            self._calls.put(Finished(err, traceback.format_exc()))

    # --- the app's side (its thread) ------------------------------------
    def ask(self, call: Call) -> Any:
        """Hand ``call`` to the role and wait for its answer.  (Each call has its own slot: an app that
        asks from several threads gets each answer in the thread that asked; the role serves them one
        at a time, in the order asked.)"""
        slot: queue.Queue = queue.Queue(1)
        self.cpu_gap = time.thread_time() - getattr(self._cpu_marks, "at", 0.0)   # (the role reads it once queued)
        self._calls.put((call, slot))
        answer = slot.get()
        self._cpu_marks.at = time.thread_time()
        if answer is _CANCEL:
            raise Cancelled()
        return answer

    # --- the role's side ------------------------------------------------
    def next(self) -> Call | Finished:
        """Run the app until its next grid call (or its end), and return it."""
        started = time.perf_counter()
        if not self._started:
            self._started = True
            self._thread.start()
        item = self._calls.get()
        self.gap = time.perf_counter() - started
        if isinstance(item, Finished):
            self.done = True
            self._thread.join()
            return item
        call, self._serving = item
        return call

    def answer(self, value: Any) -> None:
        self._serving.put(value)

    def cancel(self) -> None:
        """End the app, which waits at a grid call whenever the role runs (it raises Cancelled there),
        and wait for its thread."""
        if self.done or not self._started:
            return
        self._serving.put(_CANCEL)
        while not isinstance(item := self._calls.get(), Finished):  # other threads' calls, or one that asked again
            item[1].put(_CANCEL)
        self.done = True
        self._thread.join()


# --- a ClientApp call -------------------------------------------------------------------
def call(client_app, instruction, context, limit_s: float) -> Outcome:
    """Call the ClientApp on ``instruction`` in a thread of its own, waiting ``limit_s`` wall seconds
    at most (the wall clock, not the runtime's: a hung call hangs in wall time in either runtime)."""
    from flwr.app import Message

    box: dict = {}

    def body() -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            box["reply"] = client_app(instruction, context)
        except BaseException as err:  # the app's own code: anything it raises is its failure
            box["error"] = f"{type(err).__name__}: {err}"
            box["trace"] = traceback.format_exc()
        box["wall_s"], box["cpu_s"] = time.perf_counter() - started, time.thread_time() - cpu

    worker = threading.Thread(target=body, name="flower-clientapp", daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        return Outcome(None, f"the ClientApp did not return within flower.call_limit_s ({limit_s:g} s)", limit_s)
    error, reply = box.get("error"), box.get("reply")
    if error is None and not (isinstance(reply, Message)
                              and reply.metadata.reply_to_message_id == instruction.metadata.message_id):
        error = f"the ClientApp returned {type(reply).__name__}, not a reply to its message"
    if error is not None:
        return failed(instruction, error, box["wall_s"], box["cpu_s"])
    return Outcome(reply, "", box["wall_s"], box["cpu_s"])


def failed(instruction, error: str, wall_s: float = 0.0, cpu_s: float = 0.0) -> Outcome:
    """The error reply a client answers ``instruction`` with when its ClientApp failed (as Flower's
    own runtime answers: the strategy counts it as a failure)."""
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode

    reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=error[:1000]), reply_to=instruction)
    return Outcome(reply, error, wall_s, cpu_s)
