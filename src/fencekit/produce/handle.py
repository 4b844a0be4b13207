"""Inspecting a queue: the ``Queue`` handle, its counters, scheduled tasks and dead letters.

``client.queue(name)`` returns a :class:`Queue` with the per-queue operations
of the kickdown API (``pending``, ``length``, ``scheduled``, ``stats``,
``purge``, ``schedule``) plus fencekit's dead-letter record (``dead_letters``, ``revive``)
and the failures it keeps (``failed``, ``retry_failed``); the operations over
all of them (``revive_all``, ``purge_dead``, ``retry_all_failed``) run in
pipelined batches (:mod:`fencekit.produce._bulk`). Each method drives
one steps function of :mod:`fencekit.produce._handle_steps` on the client's
asyncio connection; ``SyncClient.queue(name)`` drives the same ones
synchronously (:class:`~fencekit.produce.sync_handle.SyncQueue`).
Every read goes to the keys of ``fencekit._redis.keys``; nothing is cached.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import redis.asyncio

from fencekit._redis.keys import KeySpace, validate_queue
from fencekit._redis.run import KeysMoving, TryAgain
from fencekit._redis.steps import Steps, adrive
from fencekit.errors import ConfigError
from fencekit.jobs.history import History
from fencekit.jobs.records import JobInfo
from fencekit.jobs.task import Task
from fencekit.produce import _bulk as bulk
from fencekit.produce import _handle_steps as steps
from fencekit.produce._handle_steps import DeadLetter, QueueStats, ScheduledTask

if TYPE_CHECKING:
    from fencekit.produce.client import Client

__all__ = ["DeadLetter", "Queue", "QueueStats", "ScheduledTask", "check_schedule"]

T = TypeVar("T")


def check_schedule(producer: object | None, name: str, task: Task) -> None:
    """Why ``schedule(task)`` through the handle of ``name`` is refused (ConfigError), if it is."""
    if producer is None:
        raise ConfigError(f"this handle of {name!r} cannot enqueue: get it from Client.queue()")
    if task.queue != name:
        raise ConfigError(f"task of queue {task.queue!r} scheduled through the handle of {name!r}")


class Queue:
    """Operations on one queue; get one from :meth:`Client.queue`."""

    def __init__(
        self, client: redis.asyncio.Redis, keys: KeySpace, name: str, *, producer: Client | None = None
    ) -> None:
        self.name = validate_queue(name)
        self._client = client
        self._keys = keys
        self._qk = keys.queue(name)
        self._producer = producer

    async def _run(self, work: Steps[T]) -> T:
        return await adrive(self._client, work)

    async def _read(self, work: Steps[T]) -> T:
        """:meth:`_run` for a read: keys moved under it by a migration are a TryAgain (it changed nothing)."""
        try:
            return await adrive(self._client, work)
        except KeysMoving as exc:
            raise TryAgain(f"{exc}; a read, it changed nothing: call again") from None

    async def schedule(self, task: Task, run_at: datetime) -> str:
        """Enqueue ``task`` (of this queue) to start at ``run_at``, an aware datetime; returns its jid.

        The kickdown 0.5 spelling of ``client.enqueue(task, at=run_at)``.
        """
        check_schedule(self._producer, self.name, task)
        assert self._producer is not None
        return await self._producer.enqueue(task, at=run_at)

    async def pending(self) -> list[Task]:
        """Tasks waiting to be claimed, oldest first (non-destructive).

        Entries that are not valid envelopes are left out here (they are
        counted by :meth:`length` and dead-lettered when claimed).
        """
        return await self._read(steps.pending(self._qk))

    async def length(self) -> int:
        """How many tasks are physically waiting in the queue."""
        return await self._read(steps.length(self._qk))

    async def scheduled(self, limit: int | None = None) -> list[ScheduledTask]:
        """Tasks waiting for a retry delay (or a delayed start), earliest first (the first ``limit``)."""
        return await self._run(steps.scheduled(self._qk, limit))

    async def stats(self) -> QueueStats:
        """The queue's cumulative counters."""
        return await self._run(steps.stats(self._qk))

    async def history(self, window: str = "1h") -> History:
        """What each minute of ``window`` saw (``"1h"``, ``"24h"``, ``"48h"``; ``"90d"``: each hour).

        The buckets the ``Server`` or pool supervisor book every few seconds
        (:mod:`fencekit.jobs.history`); ConfigError for another window.
        """
        return await self._run(steps.history(self._keys, [self.name], window))

    async def purge(self) -> int:
        """Drop every waiting task (not scheduled ones, not counters); return how many."""
        return await self._run(steps.purge(self._qk))

    async def pause(self) -> bool:
        """Stop every consumer on every host from claiming from this queue, within about a second
        (running tasks go on; enqueues are accepted; it holds across restarts). True if it was
        not paused."""
        return await self._run(steps.pause(self._keys, self.name, True))

    async def resume(self) -> bool:
        """Let consumers claim from this queue again; True if it was paused."""
        return await self._run(steps.pause(self._keys, self.name, False))

    async def paused(self) -> bool:
        """True while the queue is paused (:meth:`pause`)."""
        return await self._run(steps.is_paused(self._keys, self.name))

    async def in_flight(self) -> int:
        """How many tasks of this queue registered consumers are running now."""
        return await self._run(steps.in_flight(self._keys, self._qk))

    async def dead_letters(self, limit: int = 50) -> list[DeadLetter]:
        """The newest dead letters first, with their reasons."""
        return await self._run(steps.dead_letters(self._qk, self.name, limit))

    async def dead_count(self) -> int:
        return await self._run(steps.dead_count(self._qk))

    async def run_now(self, jid: str) -> bool:
        """Start scheduled task ``jid`` now (at the head of the queue); False if none has that jid."""
        return await self._run(steps.run_now(self._qk, jid))

    async def failed(self, limit: int = 50) -> list[JobInfo]:
        """The tasks kept after they failed for good, newest first, with their errors."""
        return await self._run(steps.failed(self._qk, self.name, limit))

    async def failed_count(self) -> int:
        return await self._run(steps.failed_count(self._qk))

    async def retry_failed(self, jid: str | None = None) -> int:
        """Run kept failures again, from the first attempt: ``jid``, or all (``None``); returns how many.

        The new attempt keeps a record for the producer's retention of the
        first one (else the client's ``keep_result``).
        """
        keep = self._producer.keep_result if self._producer is not None else None
        return await self._run(steps.retry_failed(self._qk, jid, keep))

    async def retry_all_failed(
        self, *, batch: int = bulk.DEFAULT_BATCH, progress: bulk.Progress | None = None
    ) -> int:
        """:meth:`retry_failed` of every kept failure, in pipelined batches; returns how many.

        ``progress(handled, total)`` is called after each batch.
        """
        return await self._run(
            bulk.retry_all_failed(
                self._qk, default_keep_ms=self._default_keep_ms(), batch=batch, progress=progress
            )
        )

    def _default_keep_ms(self) -> int:
        """The producer's ``keep_result`` in ms (0 without a producer, or with no records)."""
        return round(self._producer.keep_result * 1000) if self._producer is not None else 0

    async def revive_all(
        self, *, batch: int = bulk.DEFAULT_BATCH, progress: bulk.Progress | None = None
    ) -> int:
        """Enqueue every dead letter again as stored, oldest first, in pipelined batches; returns how many.

        Letters that die while it runs are left for the next run.
        ``progress(handled, total)`` is called after each batch.
        """
        return await self._run(bulk.revive_all(self._qk, batch=batch, progress=progress))

    async def purge_dead(self) -> int:
        """Drop every dead letter (the counters are kept); returns how many there were."""
        return await self._run(bulk.purge_dead(self._qk))

    async def revive(self, dead_id: str, task: Task | None = None) -> bool:
        """Enqueue a dead letter again (as stored, or as ``task``); False if it is gone."""
        producer = self._producer
        if producer is None:
            return await self._run(steps.revive(self._qk, dead_id, task))
        return await self._run(
            steps.revive(self._qk, dead_id, task, producer.keep_result, producer.max_payload)
        )
