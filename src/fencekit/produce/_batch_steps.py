"""A batch's rules as steps (:mod:`fencekit._redis.steps`): written once for ``Client``,
``SyncClient`` and the services' note mover and reconciler.

The protocol is in ``docs/design/batches.md``. In short: :func:`begin_steps`
opens the batch (its bookkeeping in its own slot, indexed in
``P:{batches}:index``) and :func:`add_steps` registers children *before* it
enqueues them, each child an ordinary task whose envelope names the batch
and which always keeps a record; the script that makes a child final
leaves a note in the child's queue; the note mover (:mod:`fencekit.services._batches`)
applies the notes, each child counted once; :func:`arm_steps` says no more
children come. Whoever completes an armed batch (the note mover, or
:func:`arm_steps` when every child was final already) runs
:func:`finish_steps`: the due callbacks enqueued with the unique key
``batch:<bid>:<kind>`` (a second run enqueues nothing), the batch closed, its
parent told. The reconciler runs :func:`finish_steps` again for a batch a
crash left half done.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Sleep, Steps, cmd
from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs import codec
from fencekit.jobs._ids import uuid7
from fencekit.jobs._registry import registering
from fencekit.jobs.batches import (
    CALLBACK_KINDS,
    BatchInfo,
    BatchMeta,
    BatchState,
    callbacks_due,
    outcome_of,
    parse_meta,
)
from fencekit.jobs.task import Task
from fencekit.produce._dep_steps import enqueue_any_steps
from fencekit.produce._enqueue import Enqueued
from fencekit.produce._producer import Producer
from fencekit.produce._results import cancel_call

__all__ = [
    "CALLBACK_KEEP",
    "CHILD_KEEP",
    "add_steps",
    "arm_steps",
    "begin_steps",
    "cancel_steps",
    "finish_steps",
    "info_steps",
    "results_steps",
    "wait_steps",
]

CHILD_KEEP = 3600.0
"""Seconds a child's record is kept when neither the task nor the client keeps one: a batch
child always has a record (``batch_results`` reads it)."""

CALLBACK_KEEP = 600.0
"""The least a callback's record is kept: its unique key ``batch:<bid>:<kind>`` lives as long,
so a reconciler finishing the batch again enqueues it no second time."""

WAIT_FIRST, WAIT_MAX = 0.02, 0.25
"""``wait`` reads the batch again after this long, doubling up to the most."""


def begin_steps(
    producer: Producer,
    callbacks: Mapping[str, Task | None],
    *,
    parent: str | None = None,
    keep: float | None = None,
) -> Steps[str]:
    """Open a batch (no child yet, not armed) and return its id.

    ``callbacks`` maps ``complete``, ``success`` and ``failure`` to the task
    to run then (None: none); ``parent``: the open batch this one is a child of;
    ``keep``: seconds the finished batch stays readable.
    """
    keys = producer.keys
    bid = uuid7()
    bk = keys.batch(bid)
    encoded = _callbacks(producer, bid, callbacks)
    keep_ms = round(codec.seconds_in(keep if keep is not None else 86_400.0, "keep", zero=False) * 1000)
    now = time.time_ns() // 1_000_000
    ops: list[Any] = [cmd("zadd", keys.batches, {bid: now})]
    if parent is not None:
        pk = keys.batch(parent)
        ops.append(scripts.batch_add(meta=pk.meta, children=pk.children, jids=[bid]))
    ops.append(
        scripts.batch_open(
            meta=bk.meta,
            children=bk.children,
            callbacks=encoded,
            armed=False,
            parent=parent or "",
            jids=(),
            keep_ms=keep_ms,
        )
    )
    # the index first (a crash then leaves an entry the reconciler drops), the parent's
    # registration before the batch exists (a note never arrives for an unknown child)
    yield Batch(ops)
    queues = [t.queue for t in callbacks.values() if t is not None]
    if queues:
        yield from registering(keys, dict.fromkeys(queues))
    return bid


def add_steps(producer: Producer, bid: str, tasks: Sequence[Task], delay_ms: int = 0) -> Steps[list[str]]:
    """Register ``tasks`` as children of open batch ``bid``, then enqueue them; their jids.

    A child that could not be enqueued is cancelled in the batch (and any of
    its siblings of this call that did land are cancelled too) before the
    error is raised, so the batch still completes.
    """
    keys = producer.keys
    bk = keys.batch(bid)
    children = _children(producer, tasks)
    if not children:
        return []
    jids = [str(t.jid) for t in children]
    queues = list(dict.fromkeys(t.queue for t in children))
    yield Batch((scripts.batch_add(meta=bk.meta, children=bk.children, jids=jids, queues=queues),))
    try:
        enqueued: list[Enqueued] = yield from enqueue_any_steps(producer, children, delay_ms, batch=bid)
    except BaseException:
        yield from _abandon(keys, bid, children, producer.settings["keep_finished"])
        raise
    return [e.jid for e in enqueued]


def arm_steps(keys: KeySpace, bid: str) -> Steps[None]:
    """No more children: the callbacks fire once every child is final (now, if they all are)."""
    (fire,) = yield Batch((scripts.batch_arm(meta=keys.batch(bid).meta),))
    if as_text(fire):
        yield from finish_steps(keys, bid)


def finish_steps(keys: KeySpace, bid: str) -> Steps[BatchMeta | None]:
    """Finish a complete batch: enqueue its due callbacks (once each, by their unique key),
    close it, count it in its parent, drop it from the index. Safe to run again at any point.

    Returns the batch's bookkeeping as it was read (None: it is gone).
    """
    bk = keys.batch(bid)
    (fields,) = yield Batch((cmd("hgetall", bk.meta),))
    meta = parse_meta(bid, fields)
    if meta is None:
        yield Batch((cmd("zrem", keys.batches, bid),))
        return None
    if meta.state in (BatchState.OPEN, BatchState.ARMED):
        return meta  # not complete: nothing to finish
    if meta.state is BatchState.COMPLETING:
        due = callbacks_due(meta)
        if due:
            calls = [_callback_call(keys, meta.callbacks[kind]) for kind in due]
            yield Batch(calls)
        yield Batch((scripts.batch_done(meta=bk.meta, children=bk.children, keep_ms=meta.keep_ms),))
    if meta.parent is not None:
        pk = keys.batch(meta.parent)
        ((_, _, fire),) = yield Batch(
            (scripts.batch_note(meta=pk.meta, children=pk.children, notes=[(bid, outcome_of(meta))]),)
        )
        if as_text(fire):
            yield from finish_steps(keys, meta.parent)
    yield Batch((cmd("zrem", keys.batches, bid),))
    return meta


def info_steps(keys: KeySpace, bid: str) -> Steps[BatchInfo | None]:
    """What :class:`BatchInfo` says of batch ``bid`` now (None: unknown, or expired)."""
    bk = keys.batch(bid)
    (fields, consumers) = yield Batch((cmd("hgetall", bk.meta), cmd("hkeys", keys.consumers)))
    meta = parse_meta(bid, fields)
    if meta is None:
        return None
    running = 0
    if meta.state in (BatchState.OPEN, BatchState.ARMED) and meta.final < meta.total:
        running = yield from _running(keys, meta, [as_text(c) for c in consumers])
    return BatchInfo.of(meta, running)


def wait_steps(keys: KeySpace, bid: str, timeout: float | None) -> Steps[BatchInfo]:
    """Read the batch until it is done; ``TimeoutError`` after ``timeout`` s, ``ConfigError`` if unknown."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = WAIT_FIRST
    while True:
        info = yield from info_steps(keys, bid)
        if info is None:
            raise ConfigError(f"batch {bid} does not exist (or it finished longer ago than it is kept)")
        if info.done:
            return info
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"batch {bid} not done after {timeout}s: {info.succeeded + info.failed + info.cancelled}"
                    f" of {info.total} children final ({info.state.value})"
                )
            pause = min(pause, left)
        yield Sleep(pause)
        pause = min(pause * 2, WAIT_MAX)


def results_steps(keys: KeySpace, bid: str) -> Steps[dict[str, Any]]:
    """The results of the children that succeeded and still keep a record, by jid (in jid order)."""
    bk = keys.batch(bid)
    (fields, children) = yield Batch((cmd("hgetall", bk.meta), cmd("hkeys", bk.children)))
    meta = parse_meta(bid, fields)
    if meta is None:
        raise ConfigError(f"batch {bid} does not exist (or it finished longer ago than it is kept)")
    jids = sorted(as_text(j) for j in children)
    if not jids or not meta.queues:
        return {}
    ops = [cmd("hmget", keys.queue(q).job(jid), "state", "result") for jid in jids for q in meta.queues]
    replies = yield Batch(ops)
    out: dict[str, Any] = {}
    for i, (state, result) in enumerate(replies):
        if state is not None and as_text(state) == "done" and result is not None:
            out[jids[i // len(meta.queues)]] = orjson.loads(result)
    return out


def cancel_steps(keys: KeySpace, bid: str, keep_finished: int) -> Steps[int]:
    """Cancel every child not final yet (nested batches too) and arm the batch, so it completes
    with them cancelled; returns how many were cancelled."""
    bk = keys.batch(bid)
    (fields, children, consumers) = yield Batch(
        (cmd("hgetall", bk.meta), cmd("hgetall", bk.children), cmd("hkeys", keys.consumers))
    )
    meta = parse_meta(bid, fields)
    if meta is None:
        raise ConfigError(f"batch {bid} does not exist (or it finished longer ago than it is kept)")
    open_jids = sorted(as_text(j) for j, v in children.items() if not v)
    cancelled: list[str] = []
    if open_jids and meta.queues:
        inflight = [as_text(c) for c in consumers]
        calls = [cancel_call(keys, q, jid, inflight, keep_finished) for jid in open_jids for q in meta.queues]
        replies = yield Batch(calls, slots=True)
        found: set[str] = set()
        for i, reply in enumerate(replies):
            jid = open_jids[i // len(meta.queues)]
            if isinstance(reply, BaseException):
                raise reply
            done, where = reply
            if int(done):
                cancelled.append(jid)
            if int(done) or as_text(where):
                found.add(jid)
        for jid in open_jids:  # not a task of its queues: a nested batch, or none at all
            if jid not in found:
                (nested,) = yield Batch((cmd("exists", keys.batch(jid).meta),))
                if int(nested):
                    yield from cancel_steps(keys, jid, keep_finished)
    if cancelled:  # count them now rather than when the mover reads their notes
        yield from _note_all(keys, bid, cancelled, "c")
    if meta.state is BatchState.OPEN:
        yield from arm_steps(keys, bid)
    return len(cancelled)


# -- helpers ----------------------------------------------------------------


def _children(producer: Producer, tasks: Sequence[Task]) -> list[Task]:
    """Copies of ``tasks`` as children: a jid each (distinct), a record kept, no unique key."""
    children: list[Task] = []
    seen: set[str] = set()
    for task in tasks:
        if not isinstance(task, Task):
            raise PayloadError(f"a batch's children are Task objects, got {type(task).__name__}")
        if task.unique_key is not None:
            raise PayloadError(
                f"a batch child cannot have a unique_key ({task.unique_key!r}): a duplicate would be "
                "another task's, counted in no batch"
            )
        child = replace(task, jid=task.jid if task.jid is not None else uuid7())
        if child.jid in seen:
            raise PayloadError(f"task {child.jid} is twice in one batch")
        seen.add(str(child.jid))
        if not child.keep_ms(producer.keep_result):
            child.keep_result = CHILD_KEEP
        task.jid = child.jid  # as enqueue fills in a Task's jid
        children.append(child)
    return children


def _callbacks(producer: Producer, bid: str, callbacks: Mapping[str, Task | None]) -> bytes:
    """The callbacks' envelopes as the JSON object ``batch_open.lua`` keeps (by kind)."""
    out: dict[str, orjson.Fragment] = {}
    for kind, task in callbacks.items():
        if kind not in CALLBACK_KINDS:
            raise ConfigError(f"unknown batch callback {kind!r}: one of {', '.join(CALLBACK_KINDS)}")
        if task is None:
            continue
        if not isinstance(task, Task):
            raise PayloadError(f"on_{kind} must be a Task, got {type(task).__name__}")
        keep = max(CALLBACK_KEEP, task.keep_result if isinstance(task.keep_result, (int, float)) else 0.0)
        callback = replace(task, unique_key=f"batch:{bid}:{kind}", unique_for=None, keep_result=keep)
        raw = callback.envelope(producer.max_payload, producer.keep_result, None, bid)
        task.jid = callback.jid
        out[kind] = orjson.Fragment(raw)
    return orjson.dumps(out)


def _callback_call(keys: KeySpace, raw: bytes) -> scripts.Call:
    """``enqueue_unique.lua`` of a callback's envelope, made fresh (its wait starts now)."""
    envelope = codec.decode(raw)
    envelope = envelope._replace(enqueued_at=time.time_ns() // 1_000_000)
    if envelope.unique is None:
        raise PayloadError(f"batch callback {envelope.jid} lacks its unique key")
    qk = keys.queue(envelope.queue)
    return scripts.enqueue_unique(
        pending=qk.pending,
        scheduled=qk.scheduled,
        stats=qk.stats,
        wake=qk.wake,
        record=qk.job(envelope.jid),
        unique=qk.unique(envelope.unique),
        delay_ms=0,
        keep_ms=envelope.keep or 1,
        envelope=envelope.encode(),
        jid=envelope.jid,
        record_prefix=qk.job(""),
        unique_for_ms=0,
    )


def _abandon(keys: KeySpace, bid: str, children: list[Task], keep_finished: int) -> Steps[None]:
    """Children whose enqueue failed: cancel those that landed, count every one cancelled."""
    try:
        (consumers,) = yield Batch((cmd("hkeys", keys.consumers),))
        inflight = [as_text(c) for c in consumers]
        yield Batch(
            [cancel_call(keys, t.queue, str(t.jid), inflight, keep_finished) for t in children], slots=True
        )
        yield from _note_all(keys, bid, [str(t.jid) for t in children], "c")
    except Exception:  # Redis went away too: the enqueue's own error is what the caller sees
        return


def _note_all(keys: KeySpace, bid: str, jids: list[str], outcome: str) -> Steps[None]:
    bk = keys.batch(bid)
    ((_, _, fire),) = yield Batch(
        (scripts.batch_note(meta=bk.meta, children=bk.children, notes=[(j, outcome) for j in jids]),)
    )
    if as_text(fire):
        yield from finish_steps(keys, bid)


def _running(keys: KeySpace, meta: BatchMeta, consumers: list[str]) -> Steps[int]:
    """How many of the batch's children are in flight now (read from the in-flight hashes)."""
    if not consumers or not meta.queues:
        return 0
    needle = b'"batch":"' + meta.bid.encode() + b'"'
    callbacks = {orjson.loads(raw).get("jid") for raw in meta.callbacks.values()}
    ops = [cmd("hvals", keys.queue(q).inflight(c)) for q in meta.queues for c in consumers]
    running = 0
    for values in (yield Batch(ops)):
        for raw in values:
            if needle in raw and orjson.loads(raw).get("jid") not in callbacks:
                running += 1
    return running
