"""What the parameter server's inbox (core.runtime.inbox, every server's) needs of ps: a worker's
update (or its report that the update was not finite) answers the worker's question, tagged by the
model version it trained from; a JOIN (a worker that starts or restarts) is a note.  Versions are
ordered: an update from an older model is late, one from a model not yet sent is refused as future.
"""

from __future__ import annotations

from dtemu.core.errors import DecodeError, NotFiniteError
from dtemu.core.ps import messages as pm
from dtemu.core.runtime.inbox import Answer, Inbox, Note
from dtemu.core.runtime.verdict import ACCEPTED, JOIN, NOT_FINITE, Verdict
from dtemu.core.wire.topics import PS_UPDATE


class WorkerReader:
    def __init__(self, dim: int, name_of: dict[int, str]):
        self.dim, self.name_of = dim, name_of   # rank -> node name, for every worker of the run

    def read(self, src: str, sealed) -> Answer | Note:
        """An update, a JOIN or a not-finite report from the worker that sent it (an update whose
        vector is not finite is its not-finite report)."""
        try:
            m = pm.decode_ps(sealed.data, self.dim)
        except NotFiniteError as err:
            if err.report is None:
                raise
            m = err.report
        if not isinstance(m, (pm.Update, pm.Join, pm.NotFinite)):
            raise DecodeError(f"{type(m).__name__} is not for the parameter server")
        if self.name_of.get(m.worker) != src:
            raise DecodeError(f"names rank {m.worker}, came from {src!r}")
        return Note(JOIN, m) if isinstance(m, pm.Join) else Answer(m.worker, m.version, m)

    def check(self, answer: Answer, question) -> Verdict:
        return Verdict(NOT_FINITE if isinstance(answer.body, pm.NotFinite) else ACCEPTED, item=answer.body)


def worker_inbox(sealer, dim: int, name_of: dict[int, str]) -> Inbox:
    """The server's inbox; a round asks its workers with ``ask_round(workers, version)``."""
    return Inbox(sealer, PS_UPDATE, WorkerReader(dim, name_of), order=lambda a, b: a - b,
                 note=lambda src, note: Verdict(JOIN, message=note.body))
