"""What the batch page shows: a batch's :class:`~fencekit.jobs.batches.BatchInfo` and its children
by state, read as ``client.batch_info`` reads it (:func:`~fencekit.produce._batch_steps.info_steps`).

The children hash (``P:{b:<bid>}:children``: jid -> "" while not final, then ``s``, ``f`` or
``c``) is read with ``HSCAN``, :data:`CHUNK` entries a round trip, until every state holds
:data:`SHOWN` jids, the hash ends, or :data:`SCAN_LIMIT` entries were read: a page of a batch
of a million children stays a few round trips. How many more each state holds is told by the
batch's own counts, not by the scan. A child that is a nested batch (its id names a batch that
exists) is linked to its batch page instead of a task page.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import redis.asyncio

from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, adrive, arun_batch, cmd
from fencekit.errors import StoreError
from fencekit.jobs.batches import BatchInfo
from fencekit.produce._batch_steps import info_steps

__all__ = ["CHUNK", "GROUPS", "SCAN_LIMIT", "SHOWN", "BatchView", "bounded", "count_open", "read_batch"]

T = TypeVar("T")

SHOWN = 200
"""Children listed per state; the page says how many more there are."""
CHUNK = 1000
SCAN_LIMIT = 20_000
"""Entries of the children hash read at most for one page."""

GROUPS = (("", "pending or running"), ("s", "succeeded"), ("f", "failed"), ("c", "cancelled"))
"""The children's states as the children hash spells them, and as the page names them."""


@dataclass(frozen=True, slots=True)
class BatchView:
    """One batch as its page shows it."""

    info: BatchInfo
    children: dict[str, tuple[str, ...]]
    """Per state of :data:`GROUPS` (its letter), up to :data:`SHOWN` jids, sorted."""
    more: dict[str, int]
    """Per state, how many children it holds beyond those listed."""
    nested: frozenset[str]
    """The listed children that are batches of their own."""

    @property
    def final(self) -> int:
        return self.info.succeeded + self.info.failed + self.info.cancelled


async def read_batch(client: redis.asyncio.Redis, keys: KeySpace, bid: str) -> BatchView | None:
    """The page of batch ``bid`` (None: unknown, or expired); ConfigError for a malformed id."""
    info = await adrive(client, info_steps(keys, bid))
    if info is None:
        return None
    counts = {
        "": info.pending + info.running,
        "s": info.succeeded,
        "f": info.failed,
        "c": info.cancelled,
    }
    found: dict[str, list[str]] = {state: [] for state, _ in GROUPS}
    children_key, cursor, scanned = keys.batch(bid).children, 0, 0
    while True:
        ((cursor, entries),) = await arun_batch(
            client, Batch([cmd("hscan", children_key, cursor, count=CHUNK)])
        )
        for jid, state in entries.items():
            listed = found.get(as_text(state))
            if listed is not None and len(listed) < SHOWN:
                listed.append(as_text(jid))
        scanned += len(entries)
        full = all(len(found[s]) >= min(SHOWN, counts[s]) for s in counts)
        if int(cursor) == 0 or full or scanned >= SCAN_LIMIT:
            break
    shown = sorted(jid for listed in found.values() for jid in listed)
    nested: frozenset[str] = frozenset()
    if shown:
        exists = await arun_batch(client, Batch([cmd("exists", keys.batch(jid).meta) for jid in shown]))
        nested = frozenset(jid for jid, n in zip(shown, exists, strict=True) if int(n))
    return BatchView(
        info=info,
        children={s: tuple(sorted(found[s])) for s in counts},
        more={s: max(0, counts[s] - len(found[s])) for s in counts},
        nested=nested,
    )


async def count_open(client: redis.asyncio.Redis, keys: KeySpace) -> int:
    """How many batches are not finished yet: the size of their index (``P:{batches}:index``)."""
    (count,) = await arun_batch(client, Batch([cmd("zcard", keys.batches)]))
    return int(count)


async def bounded(read: Awaitable[T], timeout: float) -> T:
    """``await read`` within ``timeout`` seconds, else :class:`StoreError` (as the snapshot's)."""
    try:
        return await asyncio.wait_for(read, timeout)
    except asyncio.TimeoutError:
        raise StoreError(f"Redis did not answer within {timeout:g}s") from None
