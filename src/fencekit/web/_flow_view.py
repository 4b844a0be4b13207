"""What the queue page's "Flow" section shows: the tasks waiting on flow control, and the fair share.

A queue's tasks can wait in its pending lists without being runnable: parked for a concurrency
slot, or for a rate limit's token (per operation, and per key of a per-key rate limit); and
fair-share keys (``Task(fair_key=...)``) take turns. An operator looking at a queue that does not
drain needs to see which: :func:`flow_view` turns the queue's
:class:`~fencekit.services.backlog.Backlog` (one ``backlog.lua`` call: O(1) or O(log n) per list,
the next 50 fair keys at most) into the rows the page shows, with the seconds to each next
token measured on the Redis clock that set it. :func:`read_flow` reads it for one queue.
Keys are user data: the template escapes them like any string (autoescape).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio

from fencekit._redis.keys import KeySpace
from fencekit.services.backlog import Backlog, read_backlog

__all__ = ["KEYS_SHOWN", "FlowView", "TokenRow", "flow_view", "read_flow"]

KEYS_SHOWN = 50
"""Rows of per-key parked tasks shown at most (the page says how many more keys there are)."""


@dataclass(frozen=True, slots=True)
class TokenRow:
    """Tasks parked for one rate limit's token: an operation's (``key`` None: its keys together)
    or one key's of a per-key rate limit."""

    operation: str
    key: str | None
    count: int
    seconds: float
    """Seconds until the next token is due (Redis clock; 0: due now)."""
    keys: int = 0
    """On an operation's row, how many of its keys have parked tasks (0: a rate limit without keys)."""


@dataclass(frozen=True, slots=True)
class FlowView:
    """The queue's tasks waiting on flow control, and its fair-share keys with work."""

    tokens: tuple[TokenRow, ...]
    """Per operation, then that operation's keys (soonest token first), at most :data:`KEYS_SHOWN` keys."""
    more_keys: int
    """Per-key rows left out."""
    for_token: int
    for_slot: int
    """Tasks parked for a concurrency slot (parked, less those parked for a token)."""
    fair_keys: int
    fair: tuple[tuple[str, int], ...]
    """(fair key, tasks waiting) of the next keys in turn."""


def flow_view(read: Backlog) -> FlowView | None:
    """The Flow section of a queue with this backlog; None when nothing is parked and no fair key has work."""
    if not read.parked and not read.fair_keys:
        return None

    def seconds(due_ms: int) -> float:
        return max(0.0, (due_ms - read.now_ms) / 1000)

    rows: list[TokenRow] = []
    shown = 0
    for operation, count, due_ms in read.parked_ops:
        keyed = [(key, n, key_due) for op, key, n, key_due in read.parked_keys if op == operation]
        rows.append(TokenRow(operation, None, count, seconds(due_ms), len(keyed)))
        for key, n, key_due in keyed[: max(0, KEYS_SHOWN - shown)]:
            rows.append(TokenRow(operation, key, n, seconds(key_due)))
            shown += 1
    for_token = sum(count for _, count, _ in read.parked_ops)
    return FlowView(
        tokens=tuple(rows),
        more_keys=len(read.parked_keys) - shown,
        for_token=for_token,
        for_slot=max(0, read.parked - for_token),
        fair_keys=read.fair_keys,
        fair=read.fair,
    )


async def read_flow(client: redis.asyncio.Redis, keys: KeySpace, queue: str) -> FlowView | None:
    """The Flow section of ``queue`` (one round trip); raises StoreError when Redis fails."""
    return flow_view((await read_backlog(client, keys, [queue]))[queue])
