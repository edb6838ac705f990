"""Typed errors.

Every kind of bad input has one exception class, so a caller can catch exactly
what it expects and count it.  All of them derive from ``DtemuError``; the ones
raised while decoding bytes from the network also derive from ``DecodeError``,
so a listener can catch one class for any malformed packet, frame or message.
"""


class DtemuError(Exception):
    """Base of every error dtemu raises on purpose."""


class DecodeError(DtemuError, ValueError):
    """Bytes that do not decode: truncated, wrong magic, sizes that disagree."""


class CodecError(DecodeError):
    """A malformed codec packet (fp32 / q8 / s4 / sq8)."""


class MessageError(DecodeError):
    """A malformed wire message (TrainCmd, ClientUpdate, ModelBlob, ...)."""


class StateMessageError(MessageError):
    """A malformed state-server message (ESync's RESET / REPORT / QUERY / RESPONSE): ``reason`` says
    which check failed (short, for counting: truncated, magic, version, type, action, status, ...)."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


class FrameError(DecodeError):
    """A malformed collective frame or gradient bucket (DDP)."""


class CheckpointError(DecodeError):
    """A checkpoint that is corrupt, truncated or belongs to another scenario."""


class ScenarioError(DtemuError, ValueError):
    """A scenario file that is invalid or cannot work.

    ``path`` is the dotted key path (``fl.codec``), ``msg`` what was wrong.
    """

    def __init__(self, path: str, msg: str):
        self.path = path
        self.msg = msg
        super().__init__(f"{path}: {msg}" if path else msg)


class DataError(DtemuError):
    """A data set that is missing, corrupt or fails its checksum."""


class RejectedUpdate(DtemuError):
    """A decoded update that must not be aggregated (NaN / Inf, wrong size)."""


class BarrierTimeout(DtemuError):
    """Peers did not all show up before the barrier's timeout."""

    def __init__(self, missing, waited_s: float):
        self.missing = sorted(missing)
        self.waited_s = waited_s
        super().__init__(
            f"barrier timed out after {waited_s:g}s; missing: {', '.join(self.missing)}"
        )


class AuthError(DecodeError):
    """A sealed message that must not be used: ``reason`` is unsigned, forged or replayed."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


class KeyFileError(DtemuError):
    """A shared key that cannot be used (unreadable file, too short)."""


class GeoPayloadError(DecodeError):
    """A malformed geo payload (core.geo.payload): wrong size, sparse indices out of range or repeated,
    counts that disagree with the bytes, values not finite."""


class CollectiveTimeout(DtemuError):
    def __init__(self, what: str, missing_ranks, waited_s: float):
        self.missing = sorted(missing_ranks)
        self.what = what
        super().__init__(f"{what} timed out after {waited_s:g}s; missing ranks: {self.missing}")


class LossNotice(DtemuError):
    """A peer's control message ended a wait: ``kind`` "alive" (rank ``rank`` began a
    regroup into generation ``group``) or "stop" (rank ``rank`` stopped, naming
    ``payload``).  ``what`` is the interrupted wait, ``missing`` the ranks it lacked."""

    def __init__(self, kind: str, rank: int, group: int, payload: bytes):
        self.kind, self.rank, self.group, self.payload = kind, rank, group, payload
        self.what, self.missing = "", []
        super().__init__(f"rank {rank} sent {kind} (generation {group})")


class AppError(DtemuError):
    """The user's app itself failed in a way that ends the run (a Flower ServerApp that raised);
    ``trace`` is its traceback.  Exit code 6 in emu and real."""

    def __init__(self, message: str, trace: str = ""):
        self.trace = trace
        super().__init__(message)
