"""Giving back what a consumer holds: the deliveries of a lost claim reply, and all of them at a stop.

A claim reply lost with a connection leaves deliveries in the consumer's
in-flight hash that it does not know it runs: before its next turn it
returns them (:meth:`Returns._do_reconcile`; on a cluster, those of the
failed node's queues only). At a stop it returns every delivery still in
flight, after sending the outcomes not sent yet (:meth:`Returns._return_inflight`).

A stop gives Redis :data:`RETURN_WAIT` once the grace is over: past it
(:meth:`Returns._cut`) the consumer's turn loop is cancelled wherever it
waits -- a Redis that does not answer, or a job that ignores its
cancellation -- and what it holds stays in flight for a reaper.

:class:`Returns` is a base class of :class:`~fencekit.consume._consumer.Consumer`
(which owns the state named below).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from fencekit._aio.scope import TaskScope
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.link import Link
from fencekit._redis.run import NodeLost
from fencekit.consume import _settle as settle
from fencekit.consume._outbox import Outbox, Turn
from fencekit.consume._perform import ConsumerStats
from fencekit.consume._settle import Retention
from fencekit.errors import FencedOutError, StoreError

__all__ = ["RETURN_WAIT", "Returns"]

RETURN_WAIT = 2.0
"""Seconds a stopping consumer gives Redis, once its grace is over, to take back what it holds
(the outcomes not sent yet, its unfinished tasks). A Redis that has not answered by then is
treated as down: the loop is cancelled wherever it waits, and what it holds stays in flight
for a reaper (the pool's supervisor reaps a child at once; peers reap a ``Server`` after its
heartbeat TTL). A stop therefore ends within ``grace`` + this, whatever Redis does."""


class Returns:
    """The reconcile and the stop's return, within the stop's deadline (the consumer's state, for mypy)."""

    logger: logging.Logger
    consumer_id: str
    keys: KeySpace
    queues: list[str]
    retention: Retention
    stats: ConsumerStats
    outbox: Outbox
    scope: TaskScope
    _inflight: dict[str, str]
    _running: dict[tuple[str, int], asyncio.Task[None]]
    _reconcile: bool
    _reconcile_queues: set[str]
    _turns: asyncio.Task[None] | None
    _deadline: float | None
    _cut_off: bool
    _cutter: asyncio.TimerHandle | None

    if TYPE_CHECKING:

        async def _connected(self) -> Link: ...

        def _absorb(self, turn: Turn, replies: list[Any]) -> None: ...

    def _give_up_at(self) -> float:
        """The loop time by which a stop gives up on Redis (set at the first call: now + RETURN_WAIT);
        at that time a loop still running is cut (:meth:`_cut`)."""
        if self._deadline is None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.time() + RETURN_WAIT
            self._cutter = loop.call_at(self._deadline, self._cut)
        return self._deadline

    def _cut(self) -> None:
        """The deadline passed with the loop still running: it waits on a Redis that does not answer
        (or on a task that ignores its cancellation). Cancel it wherever it waits."""
        turns = self._turns
        if turns is not None and not turns.done():
            self._cut_off = True
            why = (
                f"{len(self._running)} task(s) still run after their cancellation"
                if self._running
                else "Redis does not answer"
            )
            self.logger.warning(
                "consumer %s: not stopped %.1fs after its grace (%s): stopping without returning "
                "what it holds (a reaper returns its tasks)",
                self.consumer_id,
                RETURN_WAIT,
                why,
            )
            turns.cancel()

    async def _do_reconcile(self, link: Link, turn: Turn) -> None:
        """Return in-flight tasks this consumer does not know it runs (lost claim replies).

        Known are the tasks running, and those whose outcome waits to be
        sent: in this turn or a later one. Every queue after a lost
        connection; on a cluster, after one node failed, that node's queues
        (a queue whose node still fails waits for the next turn).
        """
        queues = self.queues if self._reconcile else [q for q in self.queues if q in self._reconcile_queues]
        left: set[str] = set()
        for queue in queues:
            known = {t for (q, t) in self._running if q == queue}
            known |= self.outbox.waiting(queue) | turn.tokens(queue)
            try:
                calls = await self._unfinished_calls(link, queue, skip=known)
                replies = await link.pipeline(calls) if calls else []
            except NodeLost:
                left.add(queue)
                continue
            if any(isinstance(reply, NodeLost) for reply in replies):
                left.add(queue)
            returned = sum(1 for reply in replies if not isinstance(reply, BaseException))
            if returned:
                self.logger.warning("returned %d task(s) of a lost claim reply to queue %s", returned, queue)
        self._reconcile = False
        self._reconcile_queues = left

    async def _unfinished_calls(
        self, link: Link, queue: str, skip: Collection[int] = ()
    ) -> list[scripts.Call]:
        """Calls that take every entry of this consumer's in-flight hash of ``queue`` back (but ``skip``).

        A field that is not a delivery token (written by someone else) is
        taken out as a dead letter instead of being trusted.
        """
        inflight = self._inflight[queue]
        entries = await link.execute("HGETALL", inflight)
        return settle.returns(self.keys, queue, inflight, entries, retention=self.retention, skip=skip)

    async def _return_inflight(self, deadline: float) -> None:
        """On stop: return every task still in this consumer's in-flight hashes, by ``deadline``."""
        try:
            if self._cut_off:
                raise StoreError(f"Redis did not answer within {RETURN_WAIT:g}s of the stop")
            try:
                await self.scope.wait_for(self._return_all(), deadline - _now(), name="fencekit-return")
            except asyncio.TimeoutError:
                raise StoreError(f"Redis did not answer within {RETURN_WAIT:g}s of the stop") from None
        except StoreError as exc:
            self.logger.error(
                "could not return unfinished tasks (they stay in flight until the reaper returns them): %s",
                exc,
            )
            raise

    async def _return_all(self) -> None:
        """Send the outcomes not sent yet, then return every task in this consumer's in-flight hashes."""
        link = await self._connected()
        if self.outbox:
            turn = self.outbox.take(None, 0)
            self._absorb(turn, await link.pipeline(turn.calls))
        returned = 0
        unreachable: list[str] = []  # a cluster's queues whose node is down: the others are returned
        for queue in self.queues:
            try:
                calls = await self._unfinished_calls(link, queue)
                results = await link.pipeline(calls) if calls else []
            except StoreError as exc:  # its node lost, its slot moving: the other queues go on
                unreachable.append(f"queue {queue}: {exc}")
                continue
            returned += sum(1 for r in results if not isinstance(r, BaseException))
            # A refused return (FencedOutError: settled or reaped meanwhile) is someone else's now.
            failed = [
                r for r in results if isinstance(r, BaseException) and not isinstance(r, FencedOutError)
            ]
            if failed:
                unreachable.append(f"queue {queue}: {len(failed)} task(s) not returned: {failed[0]}")
        self.stats.returned += returned
        if returned:
            self.logger.info("returned %d unfinished task(s) to their queues", returned)
        if unreachable:
            raise StoreError("; ".join(unreachable))


def _now() -> float:
    return asyncio.get_running_loop().time()
