"""The outbox relay: committed outbox rows become tasks in Redis, each exactly once.

``enqueue_in`` (:mod:`fencekit.produce.outbox`) writes a task as a row inside
the caller's SQL transaction. The relay -- a loop of a pool's supervisor or a
``Server`` given ``outbox_url``, or ``fencekit relay`` alone -- moves committed
rows to Redis in batches, each one SQL transaction (:mod:`._relay_sql`):

1. take the oldest rows no other relay holds (``FOR UPDATE SKIP LOCKED``:
   relays on several hosts share the work);
2. push them, one ``outbox_push.lua`` call per queue in one round trip, each
   task with its jid as the dedupe key: a marker ``P:{Q}:relayed:<jid>`` is
   set as the task is created, and a task whose marker exists is skipped --
   even when its first run finished long ago and kept no record;
3. delete the rows and commit; then remove the markers (nothing can push
   those rows again).

A relay killed between 2 and 3 leaves its rows; the next batch (of any relay)
pushes them again and the markers make that a no-op, so a committed task is
enqueued once. A marker a crash left behind expires after
:data:`MARKER_TTL_MS`. Rows whose transaction rolled back were never visible.

Between batches the relay waits for a PostgreSQL ``NOTIFY`` (sent by the
writer's commit) or ``outbox_poll`` seconds; while batches come back full it
goes on at once. A database or Redis failure backs off and is logged once, as
the other loops' failures are (:class:`~fencekit._aio.loops.Loop`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.steps import apipeline
from fencekit.errors import StoreError
from fencekit.services._relay_sql import OutboxSql, OutboxUnavailable, Taken

__all__ = ["BACKLOG_EVERY", "MARKER_TTL_MS", "OutboxUnavailable", "Relay", "RelayStats"]

T = TypeVar("T")

MARKER_TTL_MS = 7 * 24 * 3600 * 1000
"""How long a relayed task's marker outlives a relay that died before its rows' delete committed."""

BACKLOG_EVERY = 5.0
"""Seconds between two counts of the rows waiting (for ``/metrics``)."""


class RelayStats:
    """What one relay did and saw (``/metrics``: ``fencekit_outbox_*``)."""

    __slots__ = ("backlog", "batches", "deduped", "lag", "read_at", "relayed")

    def __init__(self) -> None:
        self.relayed = 0
        """Tasks this relay created in Redis."""
        self.deduped = 0
        """Rows it pushed that had been pushed before (a relay died before their delete)."""
        self.batches = 0
        self.backlog: int | None = None
        """Rows waiting at the last count (capped), None before the first."""
        self.lag = 0.0
        """Seconds the oldest waiting row had waited at the last count (the database's clock)."""
        self.read_at = 0.0


class Relay:
    """One relay of the outbox of ``sql_url`` into the Redis of ``client`` (module docstring).

    ``after_push`` (for tests and tracing) is called with a batch's rows after
    their push and before their delete -- the one moment a crash must not
    enqueue twice.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        sql_url: str,
        *,
        table: str,
        batch: int = 500,
        poll: float = 0.2,
        logger: logging.Logger,
        after_push: Callable[[Sequence[Taken]], None] | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.db = OutboxSql(sql_url, table)  # ConfigError for a bad URL or dialect, before any thread
        self.batch = batch
        self.poll = poll
        self.logger = logger
        self.after_push = after_push
        self.stats = RelayStats()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fencekit-relay")
        self._listen = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fencekit-relay-listen")
        self._full = False  # the last batch was full: more rows wait, go on at once

    def loop(self) -> Loop:
        """The relay as a periodic loop of its host (its failures back off and are logged once)."""
        backoff = Backoff(
            self.logger, "outbox relay", cap=5.0, expected=(OutboxUnavailable,), unreachable=(StoreError,)
        )
        return Loop("outbox relay", self.step, lambda: 0.0, backoff, retry=(StoreError, OutboxUnavailable))

    async def step(self) -> None:
        """Wait for rows (unless the last batch was full), then move batches until one is short."""
        if not self._full:
            await self._wait()
        self._full = False
        if time.monotonic() - self.stats.read_at >= BACKLOG_EVERY:
            await self.read_backlog()
        for _ in range(100):  # then the loop's turn ends: a stop is seen between two turns
            moved = await self.relay_batch()
            if moved < self.batch:
                return
        self._full = True

    async def read_backlog(self) -> None:
        """Count the waiting rows and the oldest one's age into :attr:`stats`."""
        self.stats.read_at = time.monotonic()
        self.stats.backlog, self.stats.lag = await self._sql(self.db.backlog)

    async def relay_batch(self) -> int:
        """Move one batch (module docstring); returns the rows it took."""
        rows = await self._sql(self.db.take, self.batch)
        if not rows:
            return 0
        try:
            created = await self._push(rows)
            if self.after_push is not None:
                self.after_push(rows)
            await self._sql(self.db.delete, [row.id for row in rows])
        except BaseException:
            self._thread.submit(self.db.abandon)  # after any statement still running on the thread
            raise
        self.stats.relayed += created
        self.stats.deduped += len(rows) - created
        self.stats.batches += 1
        if created < len(rows):
            self.logger.info(
                "outbox relay: %d of %d rows had been pushed before (a relay stopped before deleting "
                "them): enqueued once",
                len(rows) - created,
                len(rows),
            )
        await self._forget(rows)
        return len(rows)

    async def _push(self, rows: Sequence[Taken]) -> int:
        now_ms = time.time_ns() // 1_000_000
        by_queue: dict[str, list[tuple[str, str, int, int, bytes | str]]] = {}
        for row in rows:
            qk = self.keys.queue(row.queue)
            delay = max(0, row.due_ms - now_ms) if row.due_ms else 0
            by_queue.setdefault(row.queue, []).append(
                (qk.job(row.jid), qk.relayed(row.jid), delay, row.keep_ms, row.envelope)
            )
        calls = []
        for queue, tasks in by_queue.items():
            qk = self.keys.queue(queue)
            calls.append(
                scripts.outbox_push(
                    pending=qk.pending,
                    scheduled=qk.scheduled,
                    stats=qk.stats,
                    wake=qk.wake,
                    marker_ms=MARKER_TTL_MS,
                    tasks=tasks,
                )
            )
        created = 0
        for reply in await apipeline(self.redis, calls):
            if isinstance(reply, BaseException):
                raise reply
            created += int(reply)
        return created

    async def _forget(self, rows: Sequence[Taken]) -> None:
        by_queue: dict[str, list[str]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(self.keys.queue(row.queue).relayed(row.jid))
        try:
            await apipeline(self.redis, [scripts.outbox_forget(markers=m) for m in by_queue.values()])
        except StoreError as exc:  # the rows are gone: a marker left only waits for its expiry
            self.logger.debug("outbox relay: markers left to expire (%s)", exc)

    async def _wait(self) -> None:
        if not self.db.can_listen:
            await asyncio.sleep(self.poll)
            return
        await asyncio.get_running_loop().run_in_executor(self._listen, self.db.wait, self.poll)

    async def _sql(self, action: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, action, *args)

    async def close(self) -> None:
        """Abandon a batch in hand and close the database connections, once the threads are done
        (a wait for a NOTIFY ends within ``outbox_poll``, a statement when it ends)."""

        def close() -> None:
            self._listen.shutdown(wait=True)
            self._thread.submit(self.db.close)
            self._thread.shutdown(wait=True)

        await asyncio.to_thread(close)
