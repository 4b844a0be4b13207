"""The consumer: claim -> perform -> fenced settle, bounded by ``concurrency``.

One loop owns all of the consumer's Redis traffic. Each turn sends one
pipeline: the outcomes gathered since the last turn (acks grouped per queue,
retries, failures) and a claim of as many tasks as there are free slots, from
the next queue in round-robin order, or weighted by ``queue_weights``
(``ack_claim.lua`` does the acks and the claim of one queue in one script;
priorities, rate limits and concurrency keys are decided there, and a queue
whose rate limit has no token is not claimed from until it has:
:mod:`fencekit.jobs.flow`, docs/guides/flow.md). Finished tasks only record their outcome
and wake the loop, so acks batch by themselves under load.

An idle consumer blocks in ``BLPOP`` on the queues' wake keys over a second
connection (:mod:`fencekit.consume._waker`), so it starts a task within about a
millisecond of its enqueue.

This module is the loop and the consumer's lifetime (start, stop, running
tasks). Every task of the consumer -- one per job, its turn loop, the waker,
the cancel listener, the paused-queue watch (:class:`~fencekit.consume._wake_claims.QueueHolds`),
the deadline watch -- is a task of its :class:`~fencekit._aio.scope.TaskScope`
(nested in its host's), closed when :meth:`Consumer.run` ends. Beside it, as
base classes: building a turn and absorbing its replies (:mod:`~fencekit.consume._turns`),
the idle side of the waker -- claims behind its ``BLPOP``, rate-limit and
operator pauses (:mod:`~fencekit.consume._wake_claims`) -- and giving back what
it holds at a stop (:mod:`~fencekit.consume._returns`).

Failures: a turn that fails keeps its outcomes for the next turn (an ack that
did land is refused the second time and counted as ``fenced_out``, never as
processed twice), reconnects, and backs off (100 ms -> 2 s, see
:mod:`fencekit._aio.loops`). Because a lost claim reply leaves tasks in this
consumer's in-flight hash that it does not know about, the next successful
turn first returns every in-flight task it is not running to its queue.

A stale delivery -- one reaped or returned while it ran -- settles as
*fenced out*: the scripts refuse it and nothing is counted twice (invariant I3).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import redis.asyncio

from fencekit._aio.loops import Backoff
from fencekit._aio.outage import OUTAGE
from fencekit._aio.scope import TaskScope
from fencekit._redis import scripts
from fencekit._redis.clients import watch_of
from fencekit._redis.keys import KeySpace
from fencekit._redis.link import Link, open_link
from fencekit._redis.run import Durability
from fencekit._redis.url import RedisTarget
from fencekit.consume._cancels import CancelListener
from fencekit.consume._observe import Observer
from fencekit.consume._outbox import Outbox
from fencekit.consume._perform import ConsumerStats, Performer
from fencekit.consume._refusals import Refusals
from fencekit.consume._returns import RETURN_WAIT, Returns
from fencekit.consume._settle import Retention, confirm_settled
from fencekit.consume._threads import DEFAULT_SYNC_CONCURRENCY
from fencekit.consume._turns import Turns
from fencekit.consume._wake_claims import QueueHolds, WakeClaims
from fencekit.consume._waker import IDLE_POLL, Waker
from fencekit.errors import ConfigError, StoreError
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.jobs.flow import flow_specs, weighted_order
from fencekit.jobs.worker import WorkerRegistry
from fencekit.produce.client import Client

__all__ = ["Consumer", "ConsumerStats"]

LEASE_RECHECK = 0.1
NODE_LOST_PAUSE = 0.05
"""After a turn that met a failed cluster node: the next turn waits this long unless a task ends first."""


class Consumer(Turns, WakeClaims, Returns):
    """Claims and performs tasks of ``queues`` for one consumer incarnation.

    ``settings`` are the resolved settings of its ``Server`` or pool
    (``concurrency``, ``link``, retention and durability are read from them).
    ``lease_ok`` says whether its heartbeat is recent enough to claim;
    ``resets`` how many times its heartbeat saw Redis lose its data (so a
    refused settlement of a task claimed before is worded as what it is);
    ``on_turn`` is called at every turn of the loop (a pool child ticks its
    liveness slot there).
    """

    def __init__(
        self,
        *,
        target: RedisTarget,
        keys: KeySpace,
        registry: WorkerRegistry,
        consumer_id: str,
        settings: Mapping[str, Any],
        redis_client: redis.asyncio.Redis,
        logger: logging.Logger,
        queues: Sequence[str] | None = None,
        lease_ok: Callable[[], bool] | None = None,
        resets: Callable[[], int] | None = None,
        on_turn: Callable[[], None] | None = None,
        hooks: FenceKitHooks | None = None,
        scope: TaskScope | None = None,
    ) -> None:
        self.target = target
        self.keys = keys
        self.registry = registry
        self.consumer_id = consumer_id
        self.concurrency: int = settings["concurrency"]
        self.max_claim: int = settings["max_claim"]
        self.logger = logger
        self.queues = list(queues if queues is not None else registry.queues)
        self._order = weighted_order(self.queues, settings.get("queue_weights"))  # queue.flow
        self.retention = Retention.of(settings)
        self.link_kind: str = settings["link"]
        self.durable = Durability.of(settings["durable_replicas"], settings["durable_timeout"])
        self.stats = ConsumerStats()
        self.claim_budget: int | None = None  # claims a child may make before it leaves (pool._recycle)
        self.budget_spent = asyncio.Event()
        self._lease_ok, self._on_turn = lease_ok or (lambda: True), on_turn
        self._qkeys = {q: keys.queue(q) for q in self.queues}
        # flow control (queue.flow): the claim spec of each queue with a rate-limited or keyed worker
        # (the others take the plain path), the queues waiting for a token (-> ms), those an operator
        # paused (_wake_claims.QueueHolds)
        self._flow = flow_specs(registry, self._qkeys)
        self._paused: dict[str, float] = {}  # queue -> loop time of its next look (parked tasks)
        self._held, self._holds = frozenset(), QueueHolds(redis_client, keys, self.queues, logger, self._hold)
        self._inflight = {q: k.inflight(consumer_id) for q, k in self._qkeys.items()}
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.outbox = Outbox(self.queues, self._ack_claim_call)
        self._empty: set[str] = set()
        self._rotation = 0
        self._event = asyncio.Event()
        self._watch = watch_of(redis_client)
        name = f"consumer {consumer_id}"
        self.scope = scope.child(name) if scope is not None else TaskScope(name, logger=logger)
        """Its tasks' owner (nested in ``scope``, the host's, when given)."""
        self.scope.close_wait = RETURN_WAIT  # a job that ignores its cancellation is left behind sooner
        self._spawn = self.scope.start
        self._event_loop: asyncio.AbstractEventLoop | None = None  # run()'s: a job's start needs it
        self._waker = Waker(
            target,
            watch=self._watch,
            link_kind=self.link_kind,
            name=consumer_id,
            wake_keys={k.wake: q for q, k in self._qkeys.items()},
            logger=logger,
            on_wake=self._woken,
            claims=self._wake_claims,
            on_claimed=self._claimed_on_wake,
            on_lost=self._wake_claims_lost,
            poll=min(IDLE_POLL, settings["heartbeat_ttl"] / 4),
            scope=self.scope,
        )
        self._reserved = 0  # tasks the waker's claims may bring (counted as taken slots)
        self._cancels = CancelListener(
            redis_client,
            {k.cancel_channel: k for k in self._qkeys.values()},
            name=consumer_id,
            logger=logger,
            on_cancel=self._cancel,
        )
        self._stopping = False
        self._hurried = False  # skip_grace(): no (more) waiting for running tasks at a stop
        self._hurry: asyncio.Future[None] | None = None
        self._stopped = asyncio.Event()
        self._turns: asyncio.Task[None] | None = None  # the loop, a task of the scope while run() runs
        self._deadline: float | None = None  # loop time by which a stop gives up on Redis
        self._cut_off = False  # the deadline passed: Redis did not answer a stopping consumer
        self._cutter: asyncio.TimerHandle | None = None
        self._reconcile = False
        self._reconcile_queues: set[str] = set()  # a cluster node's queues whose claim reply was lost
        self._node_lost = False  # the last turn met a failed cluster node (queue.turns)
        self._cluster = target.is_cluster  # one has_work call per queue (queue.turns)
        self._lease_blocked = False
        self._link: Link | None = None
        self._backoff = Backoff(logger, f"consumer {consumer_id}: claiming")
        self._refusals = Refusals(consumer_id, logger, self.stats, settings["heartbeat_ttl"], resets)
        checked = check_hooks(hooks)
        self._observer = Observer(checked) if checked is not None else None
        self._performer = Performer(
            keys=keys,
            registry=registry,
            retention=self.retention,
            consumer_id=consumer_id,
            inflight=self._inflight,
            outbox=self.outbox,
            stats=self.stats,
            logger=logger,
            run_call=self._call,
            client=Client.sharing(settings, redis_client, hooks),
            wake=self._event.set,
            max_payload=settings["max_payload"],
            observer=self._observer,
            sync_concurrency=settings.get("sync_concurrency", DEFAULT_SYNC_CONCURRENCY),
            scope=self.scope,
            cluster=target.is_cluster,
            stopping=lambda: self._stopping,
        )

    # public ---------------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self._running)

    async def connect(self) -> None:
        """Open the hot-path connection now (otherwise the first turn opens it)."""
        await self._connected()

    async def run(self) -> None:
        """Claim and perform until :meth:`stop`; then return unfinished tasks."""
        if not self.queues:
            raise ConfigError("consumer has no queues: register at least one worker")
        self._event_loop = asyncio.get_running_loop()
        await self._watch_holds()
        waker = self._spawn(self._waker.run(), name=f"fencekit-wake-{self.consumer_id}")
        cancels = self._spawn(self._cancels.run(), name=f"fencekit-cancels-{self.consumer_id}")
        self._turns = turns = self._spawn(
            self._loop(), name=f"fencekit-turns-{self.consumer_id}", awaited=True
        )
        # Redis answers again: claim now, not at the end of the back-off.
        stop_listening = OUTAGE.listen(self._event.set)
        try:
            try:
                await turns
            except asyncio.CancelledError:
                if not (self._cut_off and turns.cancelled()):
                    raise  # the consumer's own task is cancelled (not the deadline's cut)
        finally:
            stop_listening()
            await self._wind_down(waker, cancels)

    async def _wind_down(self, waker: asyncio.Task[None], cancels: asyncio.Task[None]) -> None:
        """After the loop: stop the waker and the listener, return what it holds, close its links.

        Each step is bounded (the stop's deadline, the scope's close) and runs
        even if the consumer's task is cancelled meanwhile (its owner's close
        cancels it again and again): the first error or cancellation is raised
        at the end, so no connection is left open and :meth:`stop` never waits
        forever.
        """
        deadline = self._give_up_at()
        self._cancels.stop()
        cancels.cancel()
        failure: BaseException | None = None

        async def step(what: Coroutine[Any, Any, object]) -> None:
            nonlocal failure
            try:
                await what
            except asyncio.TimeoutError:
                pass  # given up on at the deadline (the waker's claims: a later reconcile or a reaper)
            except BaseException as exc:  # a cancellation, or StoreError from the return
                failure = failure or exc

        left = deadline - asyncio.get_running_loop().time()
        waker_stop = self._waker.stop(waker, self._unblock)
        await step(self.scope.wait_for(waker_stop, left, name="fencekit-wake-stop"))
        await step(self.scope.aclose())  # the waker, the listener, the deadline watch, any job left
        self._backoff.rest()
        await step(self._cancels.aclose())
        self._performer.close()
        await step(self._return_inflight(deadline))  # StoreError: they stay in flight for the reaper
        await step(self._waker.aclose())
        if self._link is not None:
            await step(self._link.aclose())
        await step(self.scope.aclose())  # a step given up on at the deadline
        if self._cutter is not None:
            self._cutter.cancel()
        self._stopped.set()
        if failure is not None:
            raise failure

    async def stop(self, grace: float = 0.0) -> None:
        """Stop claiming; let running tasks finish within ``grace`` s; cancel the rest.

        Cancelled tasks and anything else still in flight go back to their
        queues (same attempt) when :meth:`run` returns, if Redis takes them
        within :data:`RETURN_WAIT` s; otherwise they stay in flight for a
        reaper and the stop ends anyway.
        """
        self._stopping = True
        self._event.set()
        tasks = list(self._running.values())
        if tasks and grace > 0 and not self._hurried:
            await self._within_grace(tasks, grace)
        for task in list(self._running.values()):
            task.cancel()
        self._give_up_at()
        await self._stopped.wait()

    async def _within_grace(self, tasks: list[asyncio.Task[None]], grace: float) -> None:
        """Wait until ``tasks`` finish, ``grace`` s pass, or :meth:`skip_grace` is called."""
        loop = asyncio.get_running_loop()
        self._hurry = hurry = loop.create_future()
        deadline = loop.time() + grace
        pending: set[asyncio.Future[Any]] = set(tasks)
        while pending and not hurry.done() and (left := deadline - loop.time()) > 0:
            _, pending = await asyncio.wait(
                {*pending, hurry}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(hurry)

    def skip_grace(self) -> None:
        """Cancel the running tasks now instead of at the end of the stop's grace (a second signal)."""
        self._hurried = True
        if self._hurry is not None and not self._hurry.done():
            self._hurry.set_result(None)

    # the loop ---------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            if self._on_turn is not None:
                self._on_turn()
            self._performer.lines.refresh()  # one log-level check per turn, not two per job
            if self._stopping and not self._running and not self.outbox:
                return
            self._refusals.check_reset(self._unsettled)
            turn = self._next_turn()
            self._refusals.lease(self._lease_blocked, self._stopping)
            if not turn.calls:
                if self._lease_blocked:
                    # No claims while our heartbeat is stale (peers may be reaping us): look again soon.
                    await self._sleep_or_stop(LEASE_RECHECK)
                    continue
                self._event.clear()
                self._want_wake_update()
                if self._backoff.failing:
                    self._backoff.rest()  # not trying while idle: the outage is the others' to end
                await self._event.wait()
                continue
            try:
                link = await self._connected()
                if self._reconcile or self._reconcile_queues:
                    await self._do_reconcile(link, turn)
                if self._observer is not None:
                    self._observer.claimed_ns = time.time_ns()
                replies = await link.pipeline(turn.calls)
            except asyncio.CancelledError:  # a stop's deadline (or the owner): keep the outcomes
                self.outbox.restore(turn)
                self._reconcile = self._reconcile or turn.claims
                raise
            except StoreError as exc:
                self.outbox.restore(turn)
                self._reconcile = self._reconcile or turn.claims
                await self._back_off(self._backoff.failed(exc))
                continue
            self._backoff.succeeded()
            self._absorb(turn, replies)
            if self.durable is not None and turn.settles:
                await confirm_settled(link, self.durable, self.logger)
            if self._node_lost:  # a cluster node is down: no busy loop over its outcomes while idle
                self._node_lost = False
                await self._sleep_or_stop(NODE_LOST_PAUSE)

    def _unsettled(self) -> set[tuple[str, int]]:
        return set(self._running) | self.outbox.outcomes()

    # performing -------------------------------------------------------------
    def _start(self, queue: str, token: int, raw: bytes) -> None:
        # Each task runs in its own copy of the context, so current_job() is per task.
        key = (queue, token)
        self._running[key] = self._spawn(
            self._performer.perform(queue, token, raw),
            then=functools.partial(self._finished, key),
            loop=self._event_loop,
        )

    def _cancel(self, queue: str, jid: str, token: int) -> None:
        """A cancel for delivery ``token`` of ``queue`` arrived: stop its coroutine if it runs here."""
        task = self._running.get((queue, token))
        if task is not None and not task.done():
            self._performer.cancelled.add((queue, token))
            task.cancel()

    def _finished(self, key: tuple[str, int], _task: object = None) -> None:
        self._running.pop(key, None)
        if self._performer.cancelled:
            self._performer.cancelled.discard(key)
        self._event.set()

    # connections, returning -----------------------------------------------
    async def _call(self, call: scripts.Call) -> Any:
        """One script call for a running job, on the hot-path connection."""
        return await (await self._connected()).call(call)

    async def _connected(self) -> Link:
        if self._link is None or self._link.closed:
            if self._link is not None:
                # Replies lost with the old connection may have been claims or acks that landed:
                # before the next turn, return what is in flight here but not running.
                self._reconcile = True
            self._link = await open_link(
                self.target, name=f"fk:{self.consumer_id}", kind=self.link_kind, watch=self._watch
            )
        return self._link

    async def _back_off(self, delay: float) -> None:
        """Wait a failed turn's back-off, cut short when Redis answers again (the outage sets
        ``_event``) or the lease came back (a heartbeat landed: in a pool, seen on the board)."""
        if not self._lease_blocked:
            await self._sleep_or_stop(delay)
            return
        end = time.monotonic() + delay
        while (left := end - time.monotonic()) > 0 and not self._lease_ok():
            await self._sleep_or_stop(min(LEASE_RECHECK, left))
            if self._event.is_set():
                return

    async def _sleep_or_stop(self, delay: float) -> None:
        self._event.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), delay)
