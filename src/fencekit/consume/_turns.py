"""The consumer's turns: what one pipeline sends, and what its replies change.

A turn (:class:`~fencekit.consume._outbox.Turn`) carries the outcomes waiting in
the outbox and one ``ack_claim.lua`` call for the next queue of the rotation
(round-robin, or weighted by ``queue_weights``: :mod:`fencekit.jobs.flow`),
claiming as many tasks as there are free slots. Absorbing its replies counts
the acks that landed, reports the refused ones (fenced out, I3), starts the
claimed tasks, marks a queue found empty and pauses a rate-limited one.

:class:`Turns` is a base class of :class:`~fencekit.consume._consumer.Consumer`
(which owns the state named below and runs the loop); it lives apart so the
consumer module keeps one job: the loop and its lifetime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fencekit._redis import scripts
from fencekit._redis.keys import QueueKeys
from fencekit._redis.run import NodeLost, Redirected, TryAgain
from fencekit.consume._observe import Observer
from fencekit.consume._outbox import AckClaim, Outbox, Settle, Turn
from fencekit.consume._perform import ConsumerStats
from fencekit.consume._refusals import Refusals
from fencekit.consume._settle import Retention
from fencekit.errors import FencedOutError

if TYPE_CHECKING:
    import logging


class Turns:
    """Building a turn and absorbing its replies (the consumer's state, declared for mypy)."""

    logger: logging.Logger
    concurrency: int
    max_claim: int
    retention: Retention
    stats: ConsumerStats
    claim_budget: int | None
    budget_spent: asyncio.Event
    outbox: Outbox
    _qkeys: dict[str, QueueKeys]
    _inflight: dict[str, str]
    _flow: dict[str, str]
    _order: list[str]
    _rotation: int
    _empty: set[str]
    _paused: dict[str, float]
    _held: frozenset[str]
    _running: dict[tuple[str, int], asyncio.Task[None]]
    _reserved: int
    _stopping: bool
    _lease_ok: Callable[[], bool]
    _lease_blocked: bool
    _refusals: Refusals
    _observer: Observer | None
    _reconcile_queues: set[str]
    _node_lost: bool
    _cluster: bool

    if TYPE_CHECKING:

        def _start(self, queue: str, token: int, raw: bytes) -> None: ...

        def _pause(self, queue: str, wait_ms: int) -> None: ...

    def _next_turn(self) -> Turn:
        free = self._free_slots()
        claim_queue: str | None = None
        self._lease_blocked = False
        if free > 0 and not self._stopping:
            if self._lease_ok():
                claim_queue = self._pick_queue()
            else:
                self._lease_blocked = True
        turn = self.outbox.take(claim_queue, free)
        if claim_queue is not None:
            self._ask_empty_queues(turn)
        return turn

    def _free_slots(self) -> int:
        """How many tasks one claim may take: free slots, ``max_claim``, half the concurrency,
        what is left of the budget.

        Half: the tasks of one claim run while Redis runs the turn that acks the other half's
        and claims again. A claim of every slot at once made the consumer and Redis take turns,
        each idle while the other worked (measured: docs/performance.md, "Two halves").
        """
        half = (self.concurrency + 1) // 2
        free = min(self.concurrency - len(self._running) - self._reserved, self.max_claim, half)
        if self.claim_budget is not None:
            free = min(free, self.claim_budget - self.stats.claimed)
        return free

    def _ask_empty_queues(self, turn: Turn) -> None:
        """Ask, in this claiming turn, whether the queues found empty have work again.

        The waker blocks only while every queue is empty; without this, a queue
        found empty while the others kept the consumer busy would wait until
        they were all drained (round-robin, docs/guides/flow.md). One read-only call
        (one per queue on a Redis Cluster, whose queues are in several slots).
        """
        empty = tuple(q for q in self._qkeys if q in self._empty and q not in self._held)
        if not empty:
            return
        groups = [(q,) for q in empty] if self._cluster else [empty]
        for queues in groups:
            turn.probes.append(queues)
            turn.calls.append(scripts.has_work([self._qkeys[q].pending for q in queues]))

    def _ack_claim_call(
        self,
        queue: str,
        want: int,
        acks: Sequence[int],
        recorded: Sequence[scripts.RecordedAck],
        writes: Sequence[scripts.StagedWrite] = (),
        /,
    ) -> scripts.Call:
        qk = self._qkeys[queue]
        return scripts.ack_claim(
            pending=qk.pending,
            inflight=self._inflight[queue],
            token_counter=qk.token_counter,
            stats=qk.stats,
            wake=qk.wake,
            want=want,
            acks=acks,
            recorded=recorded,
            finished=qk.finished,
            channel=qk.done_channel,
            keep_finished=self.retention.keep_finished,
            flow=self._flow.get(queue, ""),
            writes=writes,
        )

    def _pick_queue(self) -> str | None:
        order = self._order
        n = len(order)
        for i in range(n):
            queue = order[(self._rotation + i) % n]
            if queue not in self._empty and queue not in self._held:
                self._rotation = (self._rotation + i + 1) % n
                return queue
        return None

    def _absorb(self, turn: Turn, replies: list[Any]) -> None:
        for item, reply in zip(turn.items, replies):
            if isinstance(item, Settle):
                self._absorb_settle(item, reply)
            else:
                self._absorb_ack_claim(item, reply)
        for queues, reply in zip(turn.probes, replies[len(turn.items) :]):
            if isinstance(reply, list):  # else it did not run (a moving slot, ...): asked again next turn
                for index in reply:
                    self._empty.discard(queues[int(index) - 1])

    def _absorb_ack_claim(self, item: AckClaim, reply: Any) -> None:
        queue = item.queue
        if isinstance(reply, NodeLost):
            # Redis Cluster: this queue's node failed; the claim may have landed there, so this
            # queue is reconciled before its next claim (the other nodes' queues go on).
            self.logger.warning("ack/claim on queue %s: %s", queue, reply)
            self.outbox.restore_acks(item)
            self._reconcile_queues.add(queue)
            self._empty.add(queue)
            self._node_lost = True
            return
        if isinstance(reply, BaseException):
            # A script error here is a bug or a foreign key type (or, on a cluster, a slot that
            # is moving: the script did not run): keep going, log it.
            if isinstance(reply, (TryAgain, Redirected)):
                self.logger.warning(
                    "ack/claim on queue %s did not run (its slot is moving, or it was never sent): %s",
                    queue,
                    reply,
                )
            else:
                self.logger.error("ack/claim on queue %s failed: %s", queue, reply)
            self.outbox.restore_acks(item)
            self._empty.add(queue)
            return
        fenced, first, lost, *envelopes = reply
        if self._flow and queue in self._flow:
            wait = int(envelopes.pop(0))
            if wait > 0:
                self._pause(queue, wait)
        for raw in fenced:
            key = (queue, int(raw))
            if lost:
                self._refusals.lost(key)
            self._refusals.refused(key, self.outbox.jid(*key), "ack of")
        for token in item.acks:
            self.outbox.done(queue, token)
        if self._observer is not None:
            self._observed(item, fenced)
        self._refusals.settled((queue, token) for token in item.acks)
        self.stats.processed += len(item.acks) - len(fenced)
        if not item.want:
            return
        if len(envelopes) < item.want:
            self._empty.add(queue)
        else:
            self._empty.discard(queue)
        first = int(first)
        for i, raw in enumerate(envelopes):
            self._start(queue, first + i, raw)
        self.stats.claimed += len(envelopes)
        if self.claim_budget is not None and self.stats.claimed >= self.claim_budget:
            self.budget_spent.set()

    def _observed(self, item: AckClaim, fenced: Sequence[Any]) -> None:
        """Tell the hooks which acks of ``item`` landed and which Redis refused."""
        assert self._observer is not None
        refused = {int(raw) for raw in fenced}
        for token in item.acks:
            if token in refused:
                self._observer.refused(item.queue, token)
            else:
                self._observer.landed(item.queue, token)

    def _absorb_settle(self, item: Settle, reply: Any) -> None:
        key = (item.queue, item.token)
        if isinstance(reply, (TryAgain, Redirected, NodeLost)):
            # Redis Cluster: the slot is moving (the script did not run) or its node failed (it may
            # have run: sent again, a settle that landed is refused as stale): the next turn takes it.
            self.outbox.restore_settle(item)
            self._node_lost = self._node_lost or isinstance(reply, NodeLost)
            return
        if self._observer is not None:
            if isinstance(reply, FencedOutError):
                self._observer.refused(*key)
            elif not isinstance(reply, BaseException):
                self._observer.landed(*key)
            else:
                self._observer.forget(*key)
        if isinstance(reply, FencedOutError):
            self._refusals.refused(key, self.outbox.jid(*key), "settling")
        jid = self.outbox.done(*key)
        self._refusals.settled((key,))
        if isinstance(reply, BaseException) and not isinstance(reply, FencedOutError):
            self.logger.error(
                "task %s: settling delivery %s on queue %s failed: %s", jid, item.token, item.queue, reply
            )
