"""The scaling signal: how much work waits in each queue, and for how long.

Read by the pool's autoscaler (:mod:`fencekit.pool._autoscale`) with
:func:`read_backlog`, and for ``/metrics`` (``fencekit_queue_backlog``,
``fencekit_queue_oldest_age_seconds``) inside the admin snapshot's per-queue
batch (:meth:`Backlog.from_reply`).
One ``backlog.lua`` call per queue, all in one round trip: the pending lists
(priorities and parked tasks included), the scheduled tasks already due, and
the enqueue time of the oldest task next to be claimed -- each read O(1) or
O(log n) per list, never a scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import apipeline

__all__ = ["Backlog", "read_backlog"]


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits in one queue."""

    pending: int
    due: int
    """Scheduled tasks whose time has come (the scheduler moves them to pending next)."""
    oldest_ms: int | None
    """``enqueued_at`` (ms, Unix) of the oldest pending task next to be claimed; None when none."""
    now_ms: int = 0
    """The Redis clock when it was read (ms)."""

    @property
    def oldest_age(self) -> float:
        """Seconds the oldest pending task has waited (0 when none waits), on the Redis clock."""
        return max(0.0, (self.now_ms - self.oldest_ms) / 1000) if self.oldest_ms is not None else 0.0

    @property
    def total(self) -> int:
        """Tasks that could run now: pending plus due."""
        return self.pending + self.due

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Backlog:
        """The backlog of one ``backlog.lua`` reply (also read inside the admin snapshot's batch)."""
        pending, due, oldest, now_ms = reply
        text = as_text(oldest)
        return cls(int(pending), int(due), int(text) if text else None, int(now_ms))


async def read_backlog(
    client: redis.asyncio.Redis, keys: KeySpace, queues: Sequence[str]
) -> dict[str, Backlog]:
    """The backlog of each of ``queues``; raises StoreError (or the script's error) when Redis fails."""
    if not queues:
        return {}
    calls = [
        scripts.backlog(pending=keys.queue(q).pending, scheduled=keys.queue(q).scheduled) for q in queues
    ]
    replies = await apipeline(client, calls)
    out: dict[str, Backlog] = {}
    for queue, reply in zip(queues, replies, strict=True):
        if isinstance(reply, BaseException):
            raise reply
        out[queue] = Backlog.from_reply(reply)
    return out
