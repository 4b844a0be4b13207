"""``SyncQueue``: the :class:`~fencekit.produce.handle.Queue` handle for synchronous code.

Every method drives the same steps as ``Queue``'s (:mod:`fencekit.produce._handle_steps`)
on a ``redis.Redis`` (:func:`fencekit._redis.steps.drive`): same reads, same
scripts, same errors, no event loop. Thread-safe as its client is: each
call takes a connection from redis-py's pool for its round trips.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import redis

from fencekit._redis.keys import KeySpace, validate_queue
from fencekit._redis.run import KeysMoving, TryAgain
from fencekit._redis.steps import Steps, drive
from fencekit.jobs.history import History
from fencekit.jobs.records import JobInfo
from fencekit.jobs.task import Task
from fencekit.produce import _bulk as bulk
from fencekit.produce import _handle_steps as steps
from fencekit.produce._handle_steps import DeadLetter, QueueStats, ScheduledTask
from fencekit.produce.handle import check_schedule

if TYPE_CHECKING:
    from fencekit.produce.sync_client import SyncClient

__all__ = ["SyncQueue"]

T = TypeVar("T")


class SyncQueue:
    """Operations on one queue, synchronously; get one from :meth:`SyncClient.queue`.

    The methods are those of :class:`~fencekit.produce.handle.Queue`, with the
    same arguments, results and errors.
    """

    def __init__(
        self, client: redis.Redis, keys: KeySpace, name: str, *, producer: SyncClient | None = None
    ) -> None:
        self.name = validate_queue(name)
        self._client = client
        self._keys = keys
        self._qk = keys.queue(name)
        self._producer = producer

    def _run(self, work: Steps[T]) -> T:
        return drive(self._client, work)

    def _read(self, work: Steps[T]) -> T:
        """:meth:`_run` for a read: keys moved under it by a migration are a TryAgain (it changed nothing)."""
        try:
            return drive(self._client, work)
        except KeysMoving as exc:
            raise TryAgain(f"{exc}; a read, it changed nothing: call again") from None

    def schedule(self, task: Task, run_at: datetime) -> str:
        """Enqueue ``task`` (of this queue) to start at ``run_at``, an aware datetime; returns its jid."""
        check_schedule(self._producer, self.name, task)
        assert self._producer is not None
        return self._producer.enqueue(task, at=run_at)

    def pending(self) -> list[Task]:
        """Tasks waiting to be claimed, oldest first (entries that are no envelope left out)."""
        return self._read(steps.pending(self._qk))

    def length(self) -> int:
        """How many tasks are physically waiting in the queue."""
        return self._read(steps.length(self._qk))

    def scheduled(self, limit: int | None = None) -> list[ScheduledTask]:
        """Tasks waiting for a retry delay (or a delayed start), earliest first (the first ``limit``)."""
        return self._run(steps.scheduled(self._qk, limit))

    def stats(self) -> QueueStats:
        """The queue's cumulative counters."""
        return self._run(steps.stats(self._qk))

    def history(self, window: str = "1h") -> History:
        """What each minute of ``window`` saw (``"1h"``, ``"24h"``, ``"48h"``; ``"90d"``: each hour)."""
        return self._run(steps.history(self._keys, [self.name], window))

    def purge(self) -> int:
        """Drop every waiting task (not scheduled ones, not counters); return how many."""
        return self._run(steps.purge(self._qk))

    def pause(self) -> bool:
        """:meth:`Queue.pause <fencekit.produce.handle.Queue.pause>`: no claims from it on any host."""
        return self._run(steps.pause(self._keys, self.name, True))

    def resume(self) -> bool:
        """:meth:`Queue.resume <fencekit.produce.handle.Queue.resume>`."""
        return self._run(steps.pause(self._keys, self.name, False))

    def paused(self) -> bool:
        return self._run(steps.is_paused(self._keys, self.name))

    def in_flight(self) -> int:
        """How many tasks of this queue registered consumers are running now."""
        return self._run(steps.in_flight(self._keys, self._qk))

    def dead_letters(self, limit: int = 50) -> list[DeadLetter]:
        """The newest dead letters first, with their reasons."""
        return self._run(steps.dead_letters(self._qk, self.name, limit))

    def dead_count(self) -> int:
        """How many dead letters the queue keeps."""
        return self._run(steps.dead_count(self._qk))

    def run_now(self, jid: str) -> bool:
        """Start scheduled task ``jid`` now (at the head of the queue); False if none has that jid."""
        return self._run(steps.run_now(self._qk, jid))

    def failed(self, limit: int = 50) -> list[JobInfo]:
        """The tasks kept after they failed for good, newest first, with their errors."""
        return self._run(steps.failed(self._qk, self.name, limit))

    def failed_count(self) -> int:
        """How many failures the queue keeps."""
        return self._run(steps.failed_count(self._qk))

    def retry_failed(self, jid: str | None = None) -> int:
        """Run kept failures again, from the first attempt: ``jid``, or all (``None``); returns how many."""
        keep = self._producer.keep_result if self._producer is not None else None
        return self._run(steps.retry_failed(self._qk, jid, keep))

    def retry_all_failed(
        self, *, batch: int = bulk.DEFAULT_BATCH, progress: bulk.Progress | None = None
    ) -> int:
        """:meth:`retry_failed` of every kept failure, in pipelined batches; returns how many."""
        keep = round(self._producer.keep_result * 1000) if self._producer is not None else 0
        return self._run(
            bulk.retry_all_failed(self._qk, default_keep_ms=keep, batch=batch, progress=progress)
        )

    def revive_all(self, *, batch: int = bulk.DEFAULT_BATCH, progress: bulk.Progress | None = None) -> int:
        """Enqueue every dead letter again as stored, oldest first, in pipelined batches; returns how many."""
        return self._run(bulk.revive_all(self._qk, batch=batch, progress=progress))

    def purge_dead(self) -> int:
        """Drop every dead letter (the counters are kept); returns how many there were."""
        return self._run(bulk.purge_dead(self._qk))

    def revive(self, dead_id: str, task: Task | None = None) -> bool:
        """Enqueue a dead letter again (as stored, or as ``task``); False if it is gone."""
        producer = self._producer
        if producer is None:
            return self._run(steps.revive(self._qk, dead_id, task))
        return self._run(steps.revive(self._qk, dead_id, task, producer.keep_result, producer.max_payload))
