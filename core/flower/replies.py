"""What dtemu reads out of a Flower Message for its own records: the round, the examples a reply
reports, and an evaluate round's accuracy.  Flower's conventions (its strategies' keys), with the
scenario's keys where they differ."""

from __future__ import annotations


def round_of(message) -> int:
    """The round a message belongs to: its group id where that is a number, else the "server-round" of
    its config record (as Flower's strategies send it), else 0."""
    group = message.metadata.group_id
    if group.isdigit() and len(group) < 10:
        return int(group)
    if message.has_content():
        for record in message.content.config_records.values():
            value = record.get("server-round")
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32:
                return value
    return 0


def array_bytes(messages) -> int:
    """The bytes of the arrays in ``messages``, each content counted once (an app that sends one
    ArrayRecord to every node builds it once): what a ServerApp's own work is priced by."""
    seen, total = set(), 0
    for message in messages:
        if not message.has_content() or id(message.content) in seen:
            continue
        seen.add(id(message.content))
        total += sum(len(array.data) for record in message.content.array_records.values()
                     for array in record.values())
    return total


def is_train(message_type: str) -> bool:
    """Is a message of this type a training instruction (Flower's "train" or "train.<action>")?"""
    return message_type.split(".")[0] == "train"


def _metrics(reply) -> dict:
    out: dict = {}
    if reply.has_content():
        for record in reply.content.metric_records.values():
            out.update(record)
    return out


def examples_of(reply, key: str) -> int:
    """The examples a reply reports under ``key`` (0 if none, or not a count)."""
    value = _metrics(reply).get(key, 0)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0


def accuracy_of(replies, key: str | None, examples_key: str) -> float | None:
    """The replies' mean of metric ``key`` (None: the first whose name has "acc" in it), weighted by
    their examples; None if no reply reports it."""
    total = weight = 0.0
    for reply in replies:
        metrics = _metrics(reply)
        name = key or next((k for k in metrics if "acc" in k.lower()), None)
        value = metrics.get(name) if name else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        w = max(examples_of(reply, examples_key), 1)
        total += float(value) * w
        weight += w
    return total / weight if weight else None
