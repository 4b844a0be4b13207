"""Dependencies and chains as steps: a task held until its parents succeed.

``Task(depends_on=[jid, ...])`` is not queued: :func:`enqueue_steps` checks
that every parent exists (it keeps a record: its state is how the
dependency loop learns it finished), that none of them waits on this task
(a cycle), and holds the task in its queue's waiting hash (``dep_wait.lua``),
status ``waiting``. The dependency loop (:mod:`fencekit.services._deps`)
releases it once every parent succeeded, with their results in its envelope
(``current_job().parent_results``), or cancels it, naming the parent, when one
failed for good, was cancelled or is gone -- unless
``on_parent_failure="run"``, which releases it once every parent is final
whatever the outcome. Everything stays in the task's own slot and each
parent's (Redis Cluster: no script touches two).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import orjson

from fencekit._redis import scripts
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Steps, cmd
from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs._registry import queue_names
from fencekit.jobs.task import Task
from fencekit.produce._enqueue import Enqueued
from fencekit.produce._producer import Producer

__all__ = ["DEPENDANT_KEEP", "chain_steps", "enqueue_any_steps", "enqueue_steps"]

DEPENDANT_KEEP = 3600.0
"""Seconds a parent's or a dependant's record is kept when neither the task nor the client keeps
one: a chain's links need their records (status, results)."""


def enqueue_any_steps(
    producer: Producer, tasks: list[Task], delay_ms: int, batch: str | None = None
) -> Steps[list[Enqueued]]:
    """Enqueue ``tasks``: those with ``depends_on`` held for their parents, the others queued
    as usual (in one round trip); each task's ``Enqueued`` in order."""
    held = [i for i, t in enumerate(tasks) if t.depends_on is not None]
    if held and delay_ms:
        raise ConfigError("a task with depends_on starts when its parents succeed: give it no delay or at")
    plain = [t for t in tasks if t.depends_on is None]
    out: list[Enqueued | None] = [None] * len(tasks)
    if plain:
        done: list[Enqueued] = yield from producer.enqueue_steps(plain, delay_ms, batch)
        for i, enqueued in zip((i for i, t in enumerate(tasks) if t.depends_on is None), done, strict=True):
            out[i] = enqueued
    for i in held:
        jid = yield from enqueue_steps(producer, tasks[i], batch=batch)
        out[i] = Enqueued(jid, True)
    return [e for e in out if e is not None]


def enqueue_steps(
    producer: Producer, task: Task, *, batch: str | None = None, known: Mapping[str, str] | None = None
) -> Steps[str]:
    """Hold ``task`` until its parents succeed; its jid. ``known``: parents' queues by jid, as
    a chain knows them (the others are looked for in every known queue)."""
    keys = producer.keys
    parents = task.parents()
    if not parents:
        raise PayloadError("depends_on needs at least one parent jid")
    where = {p: q for p, q in (known or {}).items() if p in parents}
    unknown = [p for p in parents if p not in where]
    if unknown:
        names = yield from queue_names(keys)
        states = yield Batch([cmd("hget", keys.queue(q).job(p), "state") for p in unknown for q in names])
        waiting: list[tuple[str, str]] = []
        for n, parent in enumerate(unknown):
            found = [(q, s) for q, s in zip(names, states[n * len(names) : (n + 1) * len(names)]) if s]
            if not found:
                raise PayloadError(
                    f"parent {parent} is unknown or its record expired: a parent must be enqueued first "
                    "and keep a record (keep_result > 0)"
                )
            queue, state = found[0]
            where[parent] = queue
            if as_text(state) == "waiting":
                waiting.append((parent, queue))
        if waiting and task.jid is not None:  # a parent waiting on this task: a cycle
            entries = yield Batch([cmd("hget", keys.queue(q).waiting(), p) for p, q in waiting])
            for (parent, _), entry in zip(waiting, entries, strict=True):
                if entry and task.jid in {jid for _, jid in orjson.loads(entry)["parents"]}:
                    raise PayloadError(
                        f"task {task.jid} and its parent {parent} depend on each other (a cycle)"
                    )
    held = task if task.keep_ms(producer.keep_result) else replace(task, keep_result=DEPENDANT_KEEP)
    (envelope,), new = producer.prepare([held], batch)
    task.jid = held.jid
    if new:
        yield from producer.register(new)
    entry = orjson.dumps(
        {
            "env": envelope.decode(),
            "parents": [[where[p], p] for p in parents],
            "run": task.on_parent_failure == "run",
        }
    )
    qk = keys.queue(held.queue)
    call = scripts.dep_wait(
        waiting=qk.waiting(),
        stats=qk.stats,
        record=qk.job(str(held.jid)),
        jid=str(held.jid),
        entry=entry,
        envelope=envelope,
        keep_ms=held.keep_ms(producer.keep_result) or round(DEPENDANT_KEEP * 1000),
    )
    (accepted,) = yield Batch((call,))
    if not int(accepted):
        raise PayloadError(f"task {held.jid} waits for its parents already")
    return str(held.jid)


def chain_steps(producer: Producer, tasks: Sequence[Task]) -> Steps[list[str]]:
    """Enqueue ``tasks`` so each waits for the one before; their jids."""
    if not tasks:
        raise PayloadError("a chain needs at least one task")
    jids: list[str] = []
    previous: Task | None = None
    for task in tasks:
        if not isinstance(task, Task):
            raise PayloadError(f"a chain's links are Task objects, got {type(task).__name__}")
        if task.depends_on is not None:
            raise PayloadError("a chain links its tasks itself: give them no depends_on")
        if previous is None:
            link = task if task.keep_ms(producer.keep_result) else replace(task, keep_result=DEPENDANT_KEEP)
            (enqueued,) = yield from producer.enqueue_steps([link], 0)
            task.jid = link.jid
            jid = enqueued.jid
        else:
            link = replace(task, depends_on=[str(previous.jid)])
            jid = yield from enqueue_steps(producer, link, known={str(previous.jid): previous.queue})
            task.jid = link.jid
        jids.append(jid)
        previous = task
    return jids
