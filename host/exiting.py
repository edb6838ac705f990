"""A command's exit without the interpreter's tear-down of the modules it imported.

A process that imported torch spends 0.4 s at exit tearing its modules down (0.8 s with
torch._dynamo, as a Flower app's calls import it), after its work is done and written:
0.34 s, about 3%, of a 50-client Flower run under ``emu run`` (docs/notebook/, entry 45), and
a rank of ``real launch`` imports torch too.  ``exit_now`` does what
that exit owes its user, and skips the rest:

- the threads that are not daemons are joined, as the interpreter would;
- the ``atexit`` handlers run (logging's flush, multiprocessing's finalizers, coverage);
- stdout and stderr are flushed;
- then ``os._exit``.  Files a command opened are its own to close before (a run folder is
  closed by then).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_now(code: int | None) -> None:
    """End the process with ``code`` (None: 0), as ``sys.exit`` would, without module tear-down."""
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader went
            pass
    os._exit(0 if code is None else int(code))
