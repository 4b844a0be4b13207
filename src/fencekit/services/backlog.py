"""The scaling signal: how much work waits in each queue, and for how long.

Read by the pool's autoscaler (:mod:`fencekit.pool._autoscale`) with
:func:`read_backlog`, and for ``/metrics`` (``fencekit_queue_backlog``,
``fencekit_queue_oldest_age_seconds``) inside the admin snapshot's per-queue
batch (:meth:`Backlog.from_reply`).
One ``backlog.lua`` call per queue, all in one round trip: the pending lists
(priorities and parked tasks included), the scheduled tasks already due, the
enqueue time of the oldest task next to be claimed, and the tasks parked for a
concurrency slot or a rate token (per operation for a token, with when it is
due; per operation and key for a per-key rate limit), and the fair-share keys
with work (how many, and the next 50 in turn with their backlog) -- each read
O(1) or O(log n) per list, never a scan. Parked tasks wait
but cannot run now, so the scaling signal (:attr:`Backlog.total`) leaves them out.
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
    parked: int = 0
    """Of ``pending``, the tasks parked for a concurrency slot or a rate limit's token: waiting,
    but not runnable now (more workers would not run them sooner)."""
    parked_ops: tuple[tuple[str, int, int], ...] = ()
    """(operation, tasks parked for its token, Unix ms its next token is due) per operation (its
    keys' together for a per-key rate limit: the most tasks, the soonest token)."""
    parked_keys: tuple[tuple[str, str, int, int], ...] = ()
    """(operation, rate key, tasks parked, Unix ms the key's next token is due) per key of a
    per-key rate limit (``rate_key``) with parked tasks."""
    fair_keys: int = 0
    """How many fair-share keys (``fair_key``) have tasks waiting."""
    fair: tuple[tuple[str, int], ...] = ()
    """(fair key, tasks waiting) of the next keys in turn (at most 50)."""

    @property
    def oldest_age(self) -> float:
        """Seconds the oldest pending task has waited (0 when none waits), on the Redis clock."""
        return max(0.0, (self.now_ms - self.oldest_ms) / 1000) if self.oldest_ms is not None else 0.0

    @property
    def total(self) -> int:
        """Tasks that could run now: pending (parked ones aside) plus due."""
        return self.pending - self.parked + self.due

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Backlog:
        """The backlog of one ``backlog.lua`` reply (also read inside the admin snapshot's batch)."""
        pending, due, oldest, now_ms, parked, ops, fair = reply
        text = as_text(oldest)
        by_op: dict[str, tuple[int, int]] = {}
        keyed = []
        for i in range(0, len(ops), 3):
            operation, _, key = as_text(ops[i]).partition("\x1f")
            count, due_ms = int(ops[i + 1]), int(float(as_text(ops[i + 2])))
            if key:
                keyed.append((operation, key, count, due_ms))
            seen = by_op.get(operation)
            by_op[operation] = (count, due_ms) if seen is None else (seen[0] + count, min(seen[1], due_ms))
        return cls(
            int(pending),
            int(due),
            int(text) if text else None,
            int(now_ms),
            int(parked),
            tuple((op, count, due_ms) for op, (count, due_ms) in by_op.items()),
            tuple(keyed),
            int(fair[0]),
            tuple((as_text(fair[i]), int(fair[i + 1])) for i in range(1, len(fair), 2)),
        )


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
