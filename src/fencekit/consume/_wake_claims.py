"""Waking the consumer's loop: the waker's callbacks, the claims written behind its ``BLPOP``, pauses.

An idle consumer (every queue found empty) blocks in ``BLPOP`` on its
queues' wake keys over a second connection (:mod:`fencekit.consume._waker`).
This part of the consumer decides when that wait is wanted, which
``ack_claim.lua`` calls the waker may write behind the ``BLPOP`` (so the
claimed tasks arrive with the wake-up: one round trip, "Idle latency" in
docs/design/hot-path.md), takes their replies, and makes the loop look at a queue
again: when the waker saw work, or when the token of a task parked by a
rate limit is due (:mod:`fencekit.jobs.flow`).

The safety rules live here: claims are offered only while idle, with a fresh
lease, not stopping, over the lean link and with at most
``WAKE_CLAIM_QUEUES`` queues; their slots stay reserved until the replies
are absorbed; a wake connection lost with claims written makes the consumer
reconcile (they may have run).

Paused queues: ``client.queue(name).pause()`` adds the name to the set
``P:{registry}:paused`` (kept across a Redis restart with an AOF, as every
key). :class:`QueueHolds` reads it when the consumer starts, before its first
claim, and every :data:`POLL` seconds; the consumer claims from no queue in it
(running tasks go on; enqueues are accepted), so a pause takes hold on every
host within about :data:`POLL` seconds at no cost on the claim path. A read
that fails keeps the last answer (the turns report Redis going away).

:class:`WakeClaims` is a base class of :class:`~fencekit.consume._consumer.Consumer`,
which owns the state named below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.link import Link
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, arun_batch, cmd
from fencekit.consume._observe import Observer
from fencekit.consume._outbox import AckClaim
from fencekit.consume._perform import ConsumerStats
from fencekit.consume._waker import WAKE_CLAIM_QUEUES, Waker
from fencekit.errors import StoreError


class WakeClaims:
    """The idle consumer's side of the waker (the consumer's state, declared for mypy)."""

    queues: list[str]
    concurrency: int
    max_claim: int
    link_kind: str
    stats: ConsumerStats
    _waker: Waker
    _event: asyncio.Event
    _rotation: int
    _empty: set[str]
    _paused: dict[str, float]
    _held: frozenset[str]
    _holds: QueueHolds
    consumer_id: str
    _spawn: Callable[..., asyncio.Task[Any]]
    _running: dict[tuple[str, int], asyncio.Task[None]]
    _reserved: int
    _stopping: bool
    _reconcile: bool
    _lease_ok: Callable[[], bool]
    _observer: Observer | None

    if TYPE_CHECKING:

        def _free_slots(self) -> int: ...

        def _ack_claim_call(
            self,
            queue: str,
            want: int,
            acks: Sequence[int],
            recorded: Sequence[scripts.RecordedAck],
            writes: Sequence[scripts.StagedWrite] = (),
            /,
        ) -> scripts.Call: ...

        def _absorb_ack_claim(self, item: AckClaim, reply: Any) -> None: ...

        async def _connected(self) -> Link: ...

    def _want_wake_update(self) -> None:
        idle = (
            not self._stopping
            and len(self._running) < self.concurrency
            and all(q in self._empty or q in self._held for q in self.queues)
        )
        if idle:
            self._waker.wanted.set()
        else:
            self._waker.wanted.clear()

    def _wake_claims(self) -> list[tuple[AckClaim, scripts.Call]] | None:
        """Claims the waker may write behind its BLPOP (:mod:`fencekit.consume._waker`), or None.

        Only while idle, lease fresh, not stopping, over the lean link and
        with at most ``WAKE_CLAIM_QUEUES`` queues; the free slots are shared
        out so that the claims together never exceed them, and they stay
        reserved until the replies are absorbed.
        """
        if self._stopping or self.link_kind != "lean" or len(self.queues) > WAKE_CLAIM_QUEUES:
            return None
        if not all(q in self._empty or q in self._held for q in self.queues):
            return None  # busy: the loop claims; the waker only waits
        if self._paused:
            return None  # a look at a queue is armed for a parked task's token: its timer wakes the loop
        free = self._free_slots()
        if free <= 0 or not self._lease_ok():
            return None
        open_queues = [q for q in self.queues if q not in self._held]  # a paused queue: no claims
        n = len(open_queues)
        if not n:
            return None
        per = max(1, free // n)
        items = [AckClaim(open_queues[(self._rotation + i) % n], [], per) for i in range(min(n, free))]
        self._reserved = per * len(items)
        return [(item, self._ack_claim_call(item.queue, item.want, (), ())) for item in items]

    def _claimed_on_wake(self, items: list[AckClaim], replies: list[Any]) -> None:
        """The replies of the claims written behind the wake-up: start what they claimed."""
        self._reserved = 0
        if self._stopping:
            return  # left in the in-flight hash: run() returns them at its end
        claimed = set()
        if self._observer is not None:
            self._observer.claimed_ns = time.time_ns()
        for item, reply in zip(items, replies, strict=True):
            if isinstance(reply, BaseException):
                continue  # (NOSCRIPT after a restart, ...): the loop claims it itself and reports
            before = self.stats.claimed
            self._absorb_ack_claim(item, reply)
            self.stats.claimed_on_wake += self.stats.claimed - before
            claimed.add(item.queue)
        for queue in self.queues:
            if queue not in claimed:
                self._empty.discard(queue)
        self._event.set()

    def _wake_claims_lost(self) -> None:
        """The wake connection failed with claims written: they may have run, so reconcile."""
        self._reserved = 0
        self._reconcile = True

    async def _unblock(self, client_id: int) -> None:
        await (await self._connected()).execute("CLIENT", "UNBLOCK", client_id)

    def _pause(self, queue: str, wait_ms: int) -> None:
        """Look at ``queue`` again in ``wait_ms``: tasks of a rate-limited operation are parked in
        Redis until their token comes then (the claims of its other tasks go on meanwhile)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + wait_ms / 1000
        armed = self._paused.get(queue)
        if armed is not None and armed <= due:
            return  # an earlier look is armed already
        self._paused[queue] = due
        loop.call_at(due, self._resume, queue, due)

    def _resume(self, queue: str, due: float) -> None:
        if self._paused.get(queue) == due:
            del self._paused[queue]
        self._woken(queue)

    async def _watch_holds(self) -> None:
        """Read the paused queues before the first claim, then watch them (QueueHolds, below)."""
        with contextlib.suppress(StoreError):  # Redis away: the turns report it
            await self._holds.read()
        self._spawn(self._holds.run(), name=f"fencekit-holds-{self.consumer_id}")

    def _hold(self, held: frozenset[str]) -> None:
        """The queues an operator paused are now ``held`` (QueueHolds, below): a resumed one is looked at."""
        resumed, paused = self._held - held, held - self._held
        self._held = held
        self._empty.difference_update(resumed)
        if resumed:
            self._event.set()
        if paused and self._waker.claiming:  # its claims were written before the pause was seen
            self._spawn(self._waker.interrupt(self._unblock), name=f"fencekit-rearm-{self.consumer_id}")

    def _woken(self, queue: str | None) -> None:
        """The waker saw work in ``queue`` (None: look at every queue again)."""
        if queue is None:
            self._empty.clear()
        else:
            self._empty.discard(queue)
        self._event.set()


# paused queues ---------------------------------------------------------------------------

POLL = 0.5
"""Seconds between two reads of the paused set by one consumer."""


class QueueHolds:
    """The paused ones among ``queues`` (see the module docstring); ``on_change`` is told the new set."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        queues: Sequence[str],
        logger: logging.Logger,
        on_change: Callable[[frozenset[str]], None],
    ) -> None:
        self.client = client
        self.keys = keys
        self.queues = frozenset(queues)
        self.logger = logger
        self.on_change = on_change
        self.held: frozenset[str] = frozenset()

    async def read(self) -> frozenset[str]:
        """Read the set once and tell ``on_change`` if it changed; raises StoreError."""
        (names,) = await arun_batch(self.client, Batch([cmd("smembers", self.keys.paused)]))
        held = frozenset(as_text(n) for n in names) & self.queues
        if held != self.held:
            for queue in sorted(held - self.held):
                self.logger.warning("queue %s is paused: no claims from it until it is resumed", queue)
            for queue in sorted(self.held - held):
                self.logger.info("queue %s is resumed", queue)
            self.held = held
            self.on_change(held)
        return held

    async def run(self) -> None:
        """Read every :data:`POLL` s until cancelled."""
        while True:
            await asyncio.sleep(POLL)
            try:
                await self.read()
            except StoreError:
                pass  # Redis away: the turns say so; the last answer stands
            except Exception:  # a bug must not end the watch silently
                self.logger.exception("reading the paused queues failed (trying again)")
