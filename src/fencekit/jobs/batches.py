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
from datetime import datetime, timezone
from typing import NamedTuple

import orjson

from fencekit._redis.keys import is_jid
from fencekit.errors import PayloadError

__all__ = [
    "CALLBACK_KINDS",
    "DEFAULT_BATCH_KEEP",
    "BatchInfo",
    "BatchMeta",
    "BatchState",
    "Note",
    "callbacks_due",
    "outcome_of",
    "parse_meta",
    "parse_note",
]

DEFAULT_BATCH_KEEP = 86_400.0
"""Seconds a finished batch stays readable (``batch_info``, ``batch_results``) unless ``keep=`` says."""

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
    keep_ms: int = int(DEFAULT_BATCH_KEEP * 1000)
    """How long the batch stays readable once done."""
    queues: tuple[str, ...] = ()
    """The queues its children live in."""


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What ``client.batch_info(bid)`` says of a batch.

    ``pending`` + ``running`` + ``succeeded`` + ``failed`` + ``cancelled`` is
    ``total``; ``running`` counts the children in flight on a worker now.
    ``state`` is ``open`` (children may still be added), ``armed`` (counting),
    ``completing`` (every child final, callbacks being enqueued) or ``done``.
    ``callbacks`` maps each callback kind set (``complete``, ``success``,
    ``failure``) to its jid.
    """

    bid: str
    total: int
    pending: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    state: BatchState
    created_at: datetime
    finished_at: datetime | None
    callbacks: dict[str, str]
    parent: str | None

    @property
    def done(self) -> bool:
        """True once every child is final and the callbacks are enqueued."""
        return self.state is BatchState.DONE

    @classmethod
    def of(cls, meta: BatchMeta, running: int) -> BatchInfo:
        """The info of ``meta``, with ``running`` of its children in flight."""
        running = min(running, meta.total - meta.final)
        callbacks = {kind: _jid_of(envelope) for kind, envelope in meta.callbacks.items()}
        return cls(
            bid=meta.bid,
            total=meta.total,
            pending=meta.total - meta.final - running,
            running=running,
            succeeded=meta.succeeded,
            failed=meta.failed,
            cancelled=meta.cancelled,
            state=meta.state,
            created_at=_when(meta.created_ms),
            finished_at=_when(meta.finished_ms) if meta.finished_ms is not None else None,
            callbacks=callbacks,
            parent=meta.parent,
        )


class Note(NamedTuple):
    """One line of a queue's notes list: child ``jid`` of batch ``bid`` became final with ``outcome``."""

    bid: str
    jid: str
    outcome: str


def parse_note(line: bytes | str) -> Note | None:
    """The note a settle left (``"<bid> <jid> <outcome>"``), None for a malformed line."""
    parts = _text(line).split(" ")
    if len(parts) != 3 or parts[2] not in ("s", "f", "c") or not is_jid(parts[0]) or not is_jid(parts[1]):
        return None
    return Note(parts[0], parts[1], parts[2])


def outcome_of(meta: BatchMeta) -> str:
    """How a finished nested batch counts in its parent: ``s`` when every child succeeded, ``f``
    when any failed for good, else ``c``."""
    if meta.succeeded == meta.total:
        return "s"
    return "f" if meta.failed > 0 else "c"


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
            keep_ms=int(text.get("keep") or DEFAULT_BATCH_KEEP * 1000),
            queues=tuple(text.get("queues", "").split()),
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


def _jid_of(envelope: bytes) -> str:
    jid = orjson.loads(envelope).get("jid")
    return jid if isinstance(jid, str) else ""


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
