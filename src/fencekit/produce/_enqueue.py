"""How a batch of tasks becomes script calls: the plan ``Client.enqueue_many`` sends.

Tasks are validated and encoded first (:func:`encode`, all or nothing),
then grouped: one
``enqueue.lua`` call per queue for tasks that keep no record, one
``enqueue_tracked.lua`` call per queue and retention for those that do, and
one ``enqueue_unique.lua`` call per task with a ``unique_key`` (the dedupe
is decided in Redis, per key), one ``enqueue_debounce.lua`` call per task
with a ``debounce_key`` (which may take the place of the task its key holds).
:meth:`EnqueuePlan.jids` reads the replies back into the jid of each task, in
order: a duplicate's is the jid of the task that holds its key, a debounced
one's that of the task it replaced. No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace, is_jid
from fencekit._redis.run import as_text
from fencekit.errors import PayloadError
from fencekit.hooks import FenceKitHooks
from fencekit.jobs._ids import uuid7
from fencekit.jobs.task import Task

__all__ = ["EnqueuePlan", "Enqueued", "encode"]


def encode(
    tasks: Sequence[Task],
    *,
    max_payload: int,
    keep_result: float,
    hooks: FenceKitHooks | None = None,
    batch: str | None = None,
) -> list[bytes]:
    """Validate and encode every task (all or nothing: the first bad one raises); ``batch``: the
    id of the batch they are children of."""
    envelopes: list[bytes] = []
    for task in tasks:
        if not isinstance(task, Task):
            raise PayloadError(f"enqueue takes Task objects, got {type(task).__name__}")
        if hooks is None:
            envelopes.append(task.envelope(max_payload, keep_result, None, batch))
            continue
        if task.jid is None:
            task.jid = uuid7()  # the trace hook is told the jid
        trace = hooks.trace_of(task.queue, task.operation, task.jid) if is_jid(task.jid) else None
        envelopes.append(task.envelope(max_payload, keep_result, trace, batch))
    return envelopes


class Enqueued(NamedTuple):
    """What ``enqueue_unique`` did: the task's jid, and whether this call created it."""

    jid: str
    created: bool


@dataclass(slots=True)
class EnqueuePlan:
    """The calls of one ``enqueue_many``, and which tasks each call carries."""

    calls: list[scripts.Call] = field(default_factory=list)
    carried: list[list[int]] = field(default_factory=list)  # per call, the indexes of its tasks
    unique: list[bool] = field(default_factory=list)  # per call: an enqueue_unique reply
    queues: list[str] = field(default_factory=list)
    size: int = 0

    @classmethod
    def of(
        cls,
        keys: KeySpace,
        tasks: Sequence[Task],
        envelopes: Sequence[bytes],
        *,
        keep_result: float,
        delay_ms: int,
    ) -> EnqueuePlan:
        """Group tasks and their :func:`encode` d envelopes into calls."""
        plan = cls(size=len(tasks))
        groups: dict[tuple[str, int | None], list[int]] = {}
        for index, task in enumerate(tasks):
            if task.unique_key is None and task.debounce_key is None:
                groups.setdefault((task.queue, task.keep_ms(keep_result)), []).append(index)
        for index, task in enumerate(tasks):
            if task.unique_key is not None:
                plan._add_unique(keys, task, envelopes[index], index, keep_result, delay_ms)
            elif task.debounce_key is not None:
                if delay_ms:
                    raise PayloadError(
                        f"task {task.jid}: a debounced task's delay is its window (no delay or at)"
                    )
                plan._add_debounce(keys, task, envelopes[index], index, keep_result)
        for (queue, keep_ms), indexes in groups.items():
            qk = keys.queue(queue)
            raws = [envelopes[i] for i in indexes]
            if keep_ms is None:
                call = scripts.enqueue(
                    pending=qk.pending,
                    scheduled=qk.scheduled,
                    stats=qk.stats,
                    wake=qk.wake,
                    delay_ms=delay_ms,
                    envelopes=raws,
                )
            else:
                call = scripts.enqueue_tracked(
                    pending=qk.pending,
                    scheduled=qk.scheduled,
                    stats=qk.stats,
                    wake=qk.wake,
                    delay_ms=delay_ms,
                    keep_ms=keep_ms,
                    envelopes=raws,
                    records=[qk.job(str(tasks[i].jid)) for i in indexes],
                )
            plan.calls.append(call)
            plan.carried.append(indexes)
            plan.unique.append(False)
        plan.queues = list(dict.fromkeys(t.queue for t in tasks))
        return plan

    def _add_unique(
        self, keys: KeySpace, task: Task, envelope: bytes, index: int, keep_result: float, delay_ms: int
    ) -> None:
        qk = keys.queue(task.queue)
        assert task.unique_key is not None
        assert task.jid is not None  # envelope() filled it in
        self.calls.append(
            scripts.enqueue_unique(
                pending=qk.pending,
                scheduled=qk.scheduled,
                stats=qk.stats,
                wake=qk.wake,
                record=qk.job(task.jid),
                unique=qk.unique(task.unique_key),
                delay_ms=delay_ms,
                keep_ms=task.keep_ms(keep_result) or 1,  # a unique task always keeps a record
                envelope=envelope,
                jid=task.jid,
                record_prefix=qk.job(""),
                unique_for_ms=task.unique_ms(),
            )
        )
        self.carried.append([index])
        self.unique.append(True)

    def _add_debounce(
        self, keys: KeySpace, task: Task, envelope: bytes, index: int, keep_result: float
    ) -> None:
        qk = keys.queue(task.queue)
        assert task.debounce_key is not None
        assert task.jid is not None  # envelope() filled it in
        window_ms, max_ms = task.debounce_ms()
        self.calls.append(
            scripts.enqueue_debounce(
                scheduled=qk.scheduled,
                stats=qk.stats,
                record=qk.job(task.jid),
                debounce=qk.debounce(task.debounce_key),
                window_ms=window_ms,
                max_ms=max_ms,
                envelope=envelope,
                jid=task.jid,
                record_prefix=qk.job(""),
                keep_ms=task.keep_ms(keep_result) or 0,
            )
        )
        self.carried.append([index])
        self.unique.append(True)  # the same reply: {created, jid}

    def outcomes(self, tasks: Sequence[Task], replies: Sequence[Any]) -> list[Enqueued | BaseException]:
        """Each task's jid and whether it was created, in the order of ``tasks``.

        A call whose reply is an exception (its error) gives that exception
        to each task it carried.
        """
        out: list[Enqueued | BaseException | None] = [None] * self.size
        for indexes, unique, reply in zip(self.carried, self.unique, replies, strict=True):
            if isinstance(reply, BaseException):
                for i in indexes:
                    out[i] = reply
            elif unique:
                created, jid = reply
                out[indexes[0]] = Enqueued(as_text(jid), bool(int(created)))
            else:
                for i in indexes:
                    out[i] = Enqueued(str(tasks[i].jid), True)
        return [e for e in out if e is not None]
