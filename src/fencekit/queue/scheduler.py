"""The scheduler: moves due retries and delayed tasks into their queues.

Every :data:`INTERVAL` it runs ``schedule.lua`` for each queue it serves (one
pipeline), moving at most :data:`BATCH` due tasks per queue per call and
calling again at once while a batch came back full. A server only sweeps the
queues it has workers for, which is also the only place its own retries land.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.store import apipeline
from fencekit.errors import StoreError
from fencekit.queue.loops import Backoff

INTERVAL = 0.2
BATCH = 1000


class Scheduler:
    """Moves due scheduled tasks of ``queues`` (see the module docstring)."""

    def __init__(
        self, client: redis.asyncio.Redis, keys: KeySpace, queues: Sequence[str], logger: logging.Logger
    ) -> None:
        self.client = client
        self.keys = keys
        self.queues = list(queues)
        self.logger = logger
        self.moved = 0
        self._backoff = Backoff(logger, "scheduler", base=INTERVAL, cap=2.0)

    async def run(self) -> None:
        while True:
            try:
                while await self.tick() >= BATCH:
                    pass
            except StoreError as exc:
                await asyncio.sleep(self._backoff.failed(exc))
                continue
            self._backoff.succeeded()
            await asyncio.sleep(INTERVAL)

    async def tick(self) -> int:
        """One sweep of every queue; returns the largest batch moved."""
        calls = []
        for queue in self.queues:
            qk = self.keys.queue(queue)
            calls.append(
                scripts.schedule(scheduled=qk.scheduled, pending=qk.pending, wake=qk.wake, limit=BATCH)
            )
        results = await apipeline(self.client, calls)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        self.moved += sum(int(r) for r in results)
        return max((int(r) for r in results), default=0)
