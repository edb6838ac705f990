"""The ``faults`` section of a scenario: nodes offline, crashes at a protocol point, partitions, and
messages lost, doubled, reordered or damaged (core.runtime.faults and the driver apply them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtemu.core.schema import check, non_negative, positive, probability


@dataclass(frozen=True)
class OfflineWindow:
    node: str
    start_s: float = field(metadata=check(non_negative))
    # None: the node never comes back.
    end_s: float | None = None


@dataclass(frozen=True)
class CrashSpec:
    """A crash at a point of the protocol rather than at a time, so that it
    hits the same step of the same round in emu and for real."""

    node: str
    round: int = field(metadata=check(positive))
    # Clients: before_train (the command arrived), during_train, mid_upload
    # (half of the update's bytes sent), after_upload.  Controller: mid_round
    # (the command is out, no update in yet), before_checkpoint (aggregated,
    # not saved: the round must be done again), after_checkpoint (saved, the
    # new model not yet published).
    at: Literal["before_train", "during_train", "mid_upload", "after_upload",
                "mid_round", "before_checkpoint", "after_checkpoint"] = "during_train"
    # Restart (from scratch; the controller from its latest checkpoint) this
    # long after the crash; None: the node stays down.
    restart_after_s: float | None = field(default=None, metadata=check(non_negative))


@dataclass(frozen=True)
class PartitionSpec:
    """``nodes`` can reach one another but no one else from start_s to end_s;
    messages that cross the cut meanwhile are lost (a partition is not a
    restart: nothing is replayed when it heals)."""

    nodes: list[str]
    start_s: float = field(metadata=check(non_negative))
    end_s: float = field(metadata=check(positive))


@dataclass(frozen=True)
class CorruptSpec:
    """A faulty (or hostile) client whose updates go out damaged."""

    node: str
    # nan / inf: some values replaced; scale: every value times `scale` (caught
    # by fl.max_update_norm); garbage: the codec packet overwritten with noise;
    # stale: the update claims the previous round.
    kind: Literal["nan", "inf", "scale", "garbage", "stale"] = "nan"
    # The rounds in which it misbehaves (empty: every round).
    rounds: list[int] = field(default_factory=list)
    scale: float = field(default=1e6, metadata=check(positive))


@dataclass(frozen=True)
class FaultSpec:
    # Each client sits out each round with this probability (decided from the seed).
    dropout_p: float = field(default=0.0, metadata=check(probability))
    # Crashes: the node loses its state, misses what is sent meanwhile, and
    # (if end_s is set) restarts from scratch.
    offline: list[OfflineWindow] = field(default_factory=list)
    crashes: list[CrashSpec] = field(default_factory=list)
    partitions: list[PartitionSpec] = field(default_factory=list)
    # Per delivered message (decided from the seed): lost outright (beyond the
    # link's packet loss, which reliable delivery repairs), delivered twice,
    # or held back by up to reorder_s so that later messages overtake it.
    message_loss: float = field(default=0.0, metadata=check(probability))
    duplicate_p: float = field(default=0.0, metadata=check(probability))
    reorder_s: float = field(default=0.0, metadata=check(non_negative))
    corrupt: list[CorruptSpec] = field(default_factory=list)

    @property
    def perturbs_delivery(self) -> bool:
        return bool(self.partitions or self.message_loss or self.duplicate_p or self.reorder_s)
