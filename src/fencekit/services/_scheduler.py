"""The scheduler: moves due retries and delayed tasks into their queues.

Every :data:`INTERVAL` it runs ``schedule.lua`` for each queue it serves (one
pipeline), moving at most :data:`BATCH` due tasks per queue per call and
calling again at once while a batch came back full. A server only sweeps the
queues it has workers for, which is also the only place its own retries land.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.steps import apipeline

__all__ = ["BATCH", "INTERVAL", "Scheduler"]

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

    def loop(self) -> Loop:
        """Sweep every :data:`INTERVAL`, and again at once while batches come back full."""
        return Loop(
            "scheduler", self.sweep, lambda: INTERVAL, Backoff(self.logger, "scheduler", INTERVAL, 2.0)
        )

    async def sweep(self) -> None:
        """Move everything due now, :data:`BATCH` per queue and call."""
        while await self.tick() >= BATCH:
            pass

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
