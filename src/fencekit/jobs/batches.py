"""A batch's bookkeeping as read from its slot, and the one rule of which callbacks it fires.

The protocol is in ``docs/design/batches.md``: each child is counted once, by
the note its final settle left, applied in the batch's slot by
``batch_note.lua``; the call that makes an armed batch complete moves it to
``completing`` and receives its callbacks, once. Which of them run is decided
here, by :func:`callbacks_due`, for whoever enqueues them (the note mover or
the reconciler that finishes what a crash left).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from fencekit.errors import PayloadError

__all__ = ["CALLBACK_KINDS", "BatchMeta", "BatchState", "callbacks_due", "parse_meta"]

CALLBACK_KINDS = ("complete", "success", "failure")
"""``on_complete`` (every child final), ``on_success`` (all succeeded), ``on_failure`` (any failed)."""


class BatchState(str, enum.Enum):
    """Where a batch is: children may join (open), counting (armed), firing (completing), done."""

    OPEN = "open"
    ARMED = "armed"
    COMPLETING = "completing"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class BatchMeta:
    """The batch's bookkeeping hash (``P:{b:<bid>}:batch``), decoded."""

    bid: str
    state: BatchState
    total: int
    final: int
    succeeded: int
    failed: int
    cancelled: int
    created_ms: int
    finished_ms: int | None
    callbacks: dict[str, bytes]
    """The callbacks' envelopes by kind (of :data:`CALLBACK_KINDS`), those set."""
    parent: str | None


def parse_meta(bid: str, fields: Mapping[bytes | str, bytes | str]) -> BatchMeta | None:
    """The batch's bookkeeping from its HGETALL, or None when it does not exist (or expired)."""
    if not fields:
        return None
    text = {_text(k): _text(v) for k, v in fields.items()}
    try:
        callbacks = orjson.loads(text.get("callbacks") or "{}")
        if not isinstance(callbacks, dict) or not set(callbacks) <= set(CALLBACK_KINDS):
            raise PayloadError(f"batch {bid}: callbacks must be an object of {CALLBACK_KINDS}")
        finished = text.get("finished")
        return BatchMeta(
            bid=bid,
            state=BatchState(text["state"]),
            total=int(text["total"]),
            final=int(text["final"]),
            succeeded=int(text["succeeded"]),
            failed=int(text["failed"]),
            cancelled=int(text["cancelled"]),
            created_ms=int(text["created"]),
            finished_ms=int(finished) if finished else None,
            callbacks={kind: orjson.dumps(envelope) for kind, envelope in callbacks.items()},
            parent=text.get("parent") or None,
        )
    except (KeyError, ValueError, orjson.JSONDecodeError) as exc:
        raise PayloadError(f"batch {bid}: unreadable bookkeeping ({exc!r})") from exc


def callbacks_due(meta: BatchMeta) -> list[str]:
    """The kinds of callback a complete batch runs: complete always, success when every child
    succeeded, failure when any failed for good (a cancelled child is neither)."""
    due = ["complete"]
    if meta.succeeded == meta.total:
        due.append("success")
    if meta.failed > 0:
        due.append("failure")
    return [kind for kind in due if kind in meta.callbacks]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
