"""The two loops of batches (docs/design/batches.md): the note mover and the reconciler.

The **note mover** reads the oldest notes of each served queue's
``P:{Q}:notes`` list (one round trip for all queues), applies them per batch
with ``batch_note.lua`` (a child already final counts nothing, so a note
applied twice -- by two movers, or again after a crash -- counts once),
removes each applied line (``LREM`` of that exact line: a copy another mover
removed first is no loss, the copies say the same), and finishes the batches
whose last child it counted (:func:`~fencekit.produce._batch_steps.finish_steps`).
It runs every :data:`BUSY` s while notes arrive, every :data:`IDLE` s otherwise,
over the queues this process serves; the notes of the other registered queues
(a child cancelled or purged where no one here works) are moved by the reconciler.

The **reconciler** moves those notes, then walks the index of unfinished batches (``P:{batches}:index``)
every :data:`RECONCILE_EVERY` s, a page at a time: a batch found ``completing``
on two walks in a row (its finisher died between handing out the callbacks and
closing it) or ``done`` but still indexed (died before telling its parent) is
finished again -- the callbacks' unique keys make that enqueue nothing twice;
an entry whose batch does not exist (a producer died before opening it, or it
expired) is dropped once it is older than :data:`ORPHAN_AGE` s.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, adrive, arun_batch, cmd
from fencekit.errors import FenceKitError, StoreError
from fencekit.jobs._registry import queue_names
from fencekit.jobs.batches import BatchState, parse_note
from fencekit.produce._batch_steps import finish_steps

__all__ = ["BUSY", "CHUNK", "IDLE", "ORPHAN_AGE", "RECONCILE_EVERY", "BatchLoops"]

CHUNK = 1000
"""Notes read per queue per round."""
BUSY, IDLE = 0.005, 0.2
"""Seconds between two rounds of the mover: after one that moved notes, after one that found none."""
RECONCILE_EVERY = 5.0
PAGE = 1000
"""Index entries the reconciler reads per walk."""
ORPHAN_AGE = 60.0
"""Seconds an index entry without a batch is kept (its producer may be about to open it)."""


class BatchLoops:
    """The note mover and the reconciler of ``queues`` (see the module docstring)."""

    def __init__(
        self, client: redis.asyncio.Redis, keys: KeySpace, queues: Sequence[str], logger: logging.Logger
    ) -> None:
        self.client = client
        self.keys = keys
        self.queues = list(queues)
        self.logger = logger
        self.applied = 0
        """Notes that counted a child (each child once)."""
        self.malformed = 0
        self.finished = 0
        """Batches this process finished (callbacks enqueued, closed)."""
        self._moved_last = False
        self._completing: set[str] = set()  # seen completing on the previous walk
        self._cursor = "-inf"

    def loops(self) -> list[Loop]:
        mover = Loop(
            "batch-notes",
            self.move,
            lambda: BUSY if self._moved_last else IDLE,
            Backoff(self.logger, "batch note mover"),
        )
        reconciler = Loop(
            "batch-reconciler",
            self.reconcile,
            lambda: RECONCILE_EVERY,
            Backoff(self.logger, "batch reconciler", base=1.0, cap=RECONCILE_EVERY),
        )
        return [mover, reconciler]

    async def move(self) -> int:
        """One round: apply the oldest notes of every served queue; how many lines it consumed."""
        moved = await self._move(self.queues)
        self._moved_last = moved > 0
        return moved

    async def _move(self, queues: Sequence[str]) -> int:
        notes_keys = [self.keys.queue(q).notes() for q in queues]
        if not notes_keys:
            return 0
        lines = await arun_batch(self.client, Batch([cmd("lrange", key, -CHUNK, -1) for key in notes_keys]))
        by_bid: dict[str, list[tuple[str, str]]] = defaultdict(list)
        # bid -> (its line's distance from the list's tail, notes key, line)
        where: dict[str, list[tuple[int, str, bytes]]] = defaultdict(list)
        bad: list[tuple[int, str, bytes]] = []
        for key, found in zip(notes_keys, lines, strict=True):
            for at, line in enumerate(found):
                note = parse_note(line)
                if note is None:
                    bad.append((len(found) - 1 - at, key, line))
                    continue
                by_bid[note.bid].append((note.jid, note.outcome))
                where[note.bid].append((len(found) - 1 - at, key, line))
        for _, key, line in bad:
            self.malformed += 1
            self.logger.error("batch note %r in %s is malformed: dropped (it counts no child)", line, key)
        bids = list(by_bid)
        done: list[tuple[int, str, bytes]] = list(bad)
        fired: list[str] = []
        if bids:
            calls = [
                scripts.batch_note(
                    meta=self.keys.batch(bid).meta, children=self.keys.batch(bid).children, notes=by_bid[bid]
                )
                for bid in bids
            ]
            replies = await arun_batch(self.client, Batch(calls, slots=True))
            for bid, reply in zip(bids, replies, strict=True):
                if isinstance(reply, BaseException):
                    self.logger.error(
                        "batch %s: applying %d note(s) failed: %s", bid, len(by_bid[bid]), reply
                    )
                    continue
                counted, _, fire = reply
                self.applied += int(counted)
                done.extend(where[bid])
                if as_text(fire):
                    fired.append(bid)
        if done:
            # tail first: each LREM from the tail (-1) then finds its line at the tail, not a
            # chunk's length away (one scan per note instead of a chunk's)
            done.sort(key=lambda entry: entry[0])
            await arun_batch(self.client, Batch([cmd("lrem", key, -1, line) for _, key, line in done]))
        for bid in fired:
            await self._finish(bid)
        return len(done)

    async def reconcile(self) -> int:
        """Move the notes of the queues no one here serves (a child cancelled or purged there),
        then walk a page of the index; how many batches it finished again."""
        registered = await adrive(self.client, queue_names(self.keys))  # poison names left out
        served = set(self.queues)
        others = [name for name in registered if name not in served]
        while await self._move(others) >= CHUNK:
            pass
        now_ms = time.time_ns() // 1_000_000
        (entries,) = await arun_batch(
            self.client,
            Batch(
                [
                    cmd(
                        "zrangebyscore",
                        self.keys.batches,
                        self._cursor,
                        now_ms - 2000,
                        start=0,
                        num=PAGE,
                        withscores=True,
                    )
                ]
            ),
        )
        self._cursor = f"({int(entries[-1][1])}" if len(entries) == PAGE else "-inf"
        if not entries:
            self._completing = set()
            return 0
        bids = [as_text(bid) for bid, _ in entries]
        states = await arun_batch(
            self.client, Batch([cmd("hget", self.keys.batch(b).meta, "state") for b in bids])
        )
        completing: set[str] = set()
        redo: list[str] = []
        orphans: list[str] = []
        for (bid, created), state in zip(
            zip(bids, (s for _, s in entries), strict=True), states, strict=True
        ):
            text = as_text(state) if state is not None else None
            if text is None:
                if now_ms - created > ORPHAN_AGE * 1000:
                    orphans.append(bid)
            elif text == "completing":
                completing.add(bid)
                if bid in self._completing:
                    redo.append(bid)
            elif text == "done":
                redo.append(bid)
        self._completing = completing
        if orphans:
            await arun_batch(self.client, Batch([cmd("zrem", self.keys.batches, *orphans)]))
        for bid in redo:
            self.logger.warning("batch %s: finishing what an earlier finisher left undone", bid)
            await self._finish(bid)
        return len(redo)

    async def _finish(self, bid: str) -> None:
        try:
            meta = await adrive(self.client, finish_steps(self.keys, bid))
        except StoreError:
            raise  # the loop's back-off; the reconciler finishes it later
        except FenceKitError as exc:
            # a bad callback (it was checked at enqueue, so this is a bug or a tampered key): logged,
            # left "completing" for the reconciler, the other batches go on
            self.logger.error("batch %s: finishing failed: %s", bid, exc)
            return
        if meta is not None and meta.state is BatchState.COMPLETING:
            self.finished += 1
            self.logger.info(
                "batch %s done: %d succeeded, %d failed, %d cancelled of %d",
                bid,
                meta.succeeded,
                meta.failed,
                meta.cancelled,
                meta.total,
            )
