"""The scripts of a batch's bookkeeping, in the batch's own slot (docs/design/batches.md)."""

from __future__ import annotations

from collections.abc import Sequence

from fencekit._redis.scripts._load import Call, call

OUTCOMES = ("s", "f", "c")
"""A child's final outcome in a note: succeeded, failed for good, cancelled."""


def batch_open(
    *,
    meta: str,
    children: str,
    callbacks: bytes,
    armed: bool,
    parent: str,
    jids: Sequence[str],
    queues: Sequence[str] = (),
    keep_ms: int = 86_400_000,
) -> Call:
    """Open a batch with ``jids`` (living in ``queues``) registered, readable ``keep_ms`` once
    done; reply how many (``batch_open.lua``)."""
    args = (callbacks, 1 if armed else 0, parent, " ".join(queues), keep_ms, *jids)
    return call("batch_open", (meta, children), args)


def batch_add(*, meta: str, children: str, jids: Sequence[str], queues: Sequence[str] = ()) -> Call:
    """Register more children (living in ``queues``) of an open batch; reply how many were new
    (``batch_add.lua``)."""
    return call("batch_add", (meta, children), (" ".join(queues), *jids))


def batch_arm(*, meta: str) -> Call:
    """Arm an open batch; reply its callbacks if that completed it, else "" (``batch_arm.lua``)."""
    return call("batch_arm", (meta,), ())


def batch_note(*, meta: str, children: str, notes: Sequence[tuple[str, str]]) -> Call:
    """Count final children, each once: ``notes`` are (jid, outcome); reply
    ``[counted, ignored, callbacks or ""]`` (``batch_note.lua``)."""
    return call("batch_note", (meta, children), tuple(arg for note in notes for arg in note))


def batch_done(*, meta: str, children: str, keep_ms: int) -> Call:
    """Close a completing batch, kept ``keep_ms``; reply 1 when this call closed it (``batch_done.lua``)."""
    return call("batch_done", (meta, children), (keep_ms,))
