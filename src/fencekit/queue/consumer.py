"""The consumer: claim -> perform -> fenced settle, bounded by ``concurrency``.

One loop owns all of the consumer's Redis traffic. Each turn sends one
pipeline: the outcomes gathered since the last turn (acks grouped per queue,
retries, failures) and a claim of as many tasks as there are free slots, from
the next queue in round-robin order (``ack_claim.lua`` does the acks and the
claim of one queue in one script). Finished tasks only record their outcome
and wake the loop, so acks batch by themselves under load.

An idle consumer blocks in ``BLPOP`` on the queues' wake keys over a second
connection, so it starts a task within about a millisecond of its enqueue;
the ``BLPOP`` times out every :data:`IDLE_POLL` seconds as a safety poll.

Failures: a turn that fails keeps its outcomes for the next turn (an ack that
did land is refused the second time and counted as ``fenced_out``, never as
processed twice), reconnects, and backs off (100 ms -> 2 s, see
:mod:`fencekit.queue.loops`). Because a lost claim reply leaves tasks in this
consumer's in-flight hash that it does not know about, the next successful
turn first returns every in-flight task it is not running to its queue.

A stale delivery -- one reaped or returned while it ran -- settles as
*fenced out*: the scripts refuse it and nothing is counted twice (DESIGN I3).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace, QueueKeys
from fencekit._redis.link import Link, open_link
from fencekit._redis.store import RedisTarget, as_text
from fencekit.errors import FencedOutError, PayloadError, StoreError
from fencekit.primitives.fence import FenceRules
from fencekit.primitives.tokens import FenceToken
from fencekit.queue import codec, settle
from fencekit.queue.client import Client
from fencekit.queue.histogram import DurationHistogram
from fencekit.queue.job import Job, job_resource, set_current
from fencekit.queue.loops import Backoff
from fencekit.queue.settle import SettleSettings
from fencekit.queue.worker import RetryPolicy, WorkerRegistry

IDLE_POLL = 1.0
LEASE_RECHECK = 0.1
MAX_CLAIM = 512


@dataclass(slots=True)
class ConsumerStats:
    """Counters of this consumer incarnation (for logs, /admin and tests)."""

    claimed: int = 0
    processed: int = 0
    failed: int = 0
    retried: int = 0
    fenced_out: int = 0
    returned: int = 0
    durations: DurationHistogram = field(default_factory=DurationHistogram)


class Consumer:
    """Claims and performs tasks of ``queues`` for one consumer incarnation."""

    def __init__(
        self,
        *,
        target: RedisTarget,
        keys: KeySpace,
        registry: WorkerRegistry,
        consumer_id: str,
        concurrency: int,
        redis_client: redis.asyncio.Redis,
        logger: logging.Logger,
        queues: Sequence[str] | None = None,
        settings: SettleSettings | None = None,
        link_kind: str = "lean",
        lease_ok: Callable[[], bool] | None = None,
        on_turn: Callable[[], None] | None = None,
        durable: tuple[int, int] | None = None,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.target = target
        self.keys = keys
        self.registry = registry
        self.consumer_id = consumer_id
        self.concurrency = concurrency
        self.logger = logger
        self.queues = list(queues if queues is not None else registry.queues)
        self.settings = settings or SettleSettings()
        self.link_kind = link_kind
        self.stats = ConsumerStats()
        self._lease_ok = lease_ok or (lambda: True)
        self._on_turn = on_turn
        self.durable = durable
        self._fence_rules = FenceRules(keys.prefix, timedelta(milliseconds=self.settings.fence_ttl_ms))
        self._client = Client(redis=redis_client, prefix=keys.prefix)
        self._qkeys = {q: keys.queue(q) for q in self.queues}
        self._inflight = {q: k.inflight(consumer_id) for q, k in self._qkeys.items()}
        self._wake_keys = {k.wake: q for q, k in self._qkeys.items()}
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._acks: dict[str, list[int]] = {q: [] for q in self.queues}
        self._settles: list[tuple[str, int, scripts.Call]] = []  # (queue, token, call)
        self._jids: dict[tuple[str, int], str | None] = {}  # jid of each outcome not yet settled
        self._empty: set[str] = set()
        self._rotation = 0
        self._event = asyncio.Event()
        self._want_wake = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()
        self._reconcile = False
        self._lease_blocked = False
        self._link: Link | None = None
        self._wake_link: Link | None = None
        self._backoff = Backoff(logger, f"consumer {consumer_id}: claiming")
        self._info = logger.isEnabledFor(logging.INFO)

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
            raise ValueError("consumer has no queues: register at least one worker")
        waker = asyncio.create_task(self._wake_loop(), name=f"fencekit-wake-{self.consumer_id}")
        try:
            await self._loop()
        finally:
            waker.cancel()
            await asyncio.gather(waker, return_exceptions=True)
            await self._return_inflight()
            for link in (self._link, self._wake_link):
                if link is not None:
                    await link.aclose()
            self._stopped.set()

    async def stop(self, grace: float = 0.0) -> None:
        """Stop claiming; let running tasks finish within ``grace`` s; cancel the rest.

        Cancelled tasks and anything else still in flight go back to their
        queues (same attempt) when :meth:`run` returns.
        """
        self._stopping = True
        self._event.set()
        tasks = list(self._running.values())
        if tasks and grace > 0:
            await asyncio.wait(tasks, timeout=grace)
        for task in list(self._running.values()):
            task.cancel()
        await self._stopped.wait()

    # the loop ---------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            if self._on_turn is not None:
                self._on_turn()
            if self._stopping and not self._running and not self._has_outcomes():
                return
            calls, metas = self._build_turn()
            if not calls:
                if self._lease_blocked:
                    # No claims while our heartbeat is stale (peers may be reaping us): look again soon.
                    await self._sleep_or_stop(LEASE_RECHECK)
                    continue
                self._event.clear()
                self._want_wake_update()
                await self._event.wait()
                continue
            try:
                link = await self._connected()
                if self._reconcile:
                    await self._do_reconcile(link, metas)
                replies = await link.pipeline(calls)
            except StoreError as exc:
                self._restore(metas)
                self._reconcile = self._reconcile or any(m[0] == "claim" for m in metas)
                await self._sleep_or_stop(self._backoff.failed(exc))
                continue
            self._backoff.succeeded()
            self._absorb(metas, replies)
            if self.durable is not None and any(kind == "settle" or extra[1] for kind, _, extra in metas):
                await self._wait_replicas(link, self.durable)

    async def _wait_replicas(self, link: Link, durable: tuple[int, int]) -> None:
        """WAIT after a turn that settled tasks (scripts cannot WAIT themselves)."""
        replicas, timeout_ms = durable
        try:
            confirmed = int(await link.execute("WAIT", replicas, timeout_ms, timeout=timeout_ms / 1000 + 5))
        except StoreError as exc:
            self.logger.warning("could not wait for %d replica(s) after settling tasks: %s", replicas, exc)
            return
        if confirmed < replicas:
            self.logger.warning(
                "settlements confirmed by %d of %d replica(s) within %d ms: a failover now could undo them "
                "(those tasks would run again)",
                confirmed,
                replicas,
                timeout_ms,
            )

    def _has_outcomes(self) -> bool:
        return bool(self._settles) or any(self._acks.values())

    def _build_turn(self) -> tuple[list[scripts.Call], list[tuple[str, str, Any]]]:
        calls: list[scripts.Call] = []
        metas: list[tuple[str, str, Any]] = []
        for queue, token, call in self._settles:
            calls.append(call)
            metas.append(("settle", queue, (token, call)))
        self._settles = []
        claim_queue: str | None = None
        free = self.concurrency - len(self._running)
        self._lease_blocked = False
        if free > 0 and not self._stopping:
            if self._lease_ok():
                claim_queue = self._pick_queue()
            else:
                self._lease_blocked = True
        for queue in self.queues:
            acks = self._acks[queue]
            want = min(free, MAX_CLAIM) if queue == claim_queue else 0
            if not acks and not want:
                continue
            self._acks[queue] = []
            qk = self._qkeys[queue]
            calls.append(
                scripts.ack_claim(
                    pending=qk.pending,
                    inflight=self._inflight[queue],
                    token=qk.token,
                    stats=qk.stats,
                    wake=qk.wake,
                    want=want,
                    acks=acks,
                )
            )
            metas.append(("claim" if want else "ack", queue, (want, acks)))
        return calls, metas

    def _pick_queue(self) -> str | None:
        n = len(self.queues)
        for i in range(n):
            queue = self.queues[(self._rotation + i) % n]
            if queue not in self._empty:
                self._rotation = (self._rotation + i + 1) % n
                return queue
        return None

    def _restore(self, metas: list[tuple[str, str, Any]]) -> None:
        """Keep the outcomes of a failed turn for the next one (see module docstring)."""
        for kind, queue, extra in metas:
            if kind == "settle":
                token, call = extra
                self._settles.append((queue, token, call))
            else:
                _, acks = extra
                self._acks[queue][:0] = acks

    def _absorb(self, metas: list[tuple[str, str, Any]], replies: list[Any]) -> None:
        for (kind, queue, extra), reply in zip(metas, replies):
            if kind == "settle":
                self._absorb_settle(queue, extra[0], reply)
                continue
            if isinstance(reply, BaseException):
                # A script error here is a bug or a foreign key type: keep going, log it.
                self.logger.error("ack/claim on queue %s failed: %s", queue, reply)
                want, acks = extra
                self._acks[queue][:0] = acks
                self._empty.add(queue)
                continue
            fenced, first, *envelopes = reply
            if fenced:
                self.stats.fenced_out += len(fenced)
                for token in fenced:
                    self.logger.warning(
                        "task %s: ack of delivery %s on queue %s fenced out: the task was reaped or "
                        "returned while it ran, a newer delivery owns it",
                        self._jids.get((queue, int(token))),
                        as_text(token),
                        queue,
                    )
            want, acks = extra
            for token in acks:
                self._jids.pop((queue, token), None)
            self.stats.processed += len(acks) - len(fenced)
            if kind != "claim":
                continue
            if len(envelopes) < want:
                self._empty.add(queue)
            else:
                self._empty.discard(queue)
            first = int(first)
            for i, raw in enumerate(envelopes):
                self._start(queue, first + i, raw)
            self.stats.claimed += len(envelopes)

    def _absorb_settle(self, queue: str, token: int, reply: Any) -> None:
        jid = self._jids.pop((queue, token), None)
        if isinstance(reply, FencedOutError):
            self.stats.fenced_out += 1
            self.logger.warning(
                "task %s: settling delivery %s on queue %s fenced out: the task was reaped or returned "
                "while it ran",
                jid,
                token,
                queue,
            )
        elif isinstance(reply, BaseException):
            self.logger.error(
                "task %s: settling delivery %s on queue %s failed: %s", jid, token, queue, reply
            )

    # performing -------------------------------------------------------------
    def _start(self, queue: str, token: int, raw: bytes) -> None:
        # Each task runs in its own copy of the context, so current_job() is per task.
        task = asyncio.get_running_loop().create_task(self._perform(queue, token, raw))
        key = (queue, token)
        self._running[key] = task
        task.add_done_callback(functools.partial(self._finished, key))

    def _finished(self, key: tuple[str, int], _task: object = None) -> None:
        self._running.pop(key, None)
        self._event.set()

    async def _perform(self, queue: str, token: int, raw: bytes) -> None:
        qk = self._qkeys[queue]
        try:
            envelope = codec.decode(raw)
        except PayloadError as exc:
            jid = codec.peek_jid(raw)
            self.logger.error("task %s on queue %s is malformed, dead-lettered: %s", jid, queue, exc)
            self._settle(queue, token, self._fail(qk, token, jid, f"malformed payload: {exc}"), jid)
            return
        spec = self.registry.get(queue, envelope.operation)
        if spec is None:
            reason = f"no worker registered for operation {envelope.operation!r} on queue {queue!r}"
            self.logger.error("task %s dead-lettered: %s", envelope.jid, reason)
            self._settle(queue, token, self._fail(qk, token, envelope.jid, reason), envelope.jid)
            return
        job = Job(
            jid=envelope.jid,
            queue=queue,
            operation=envelope.operation,
            attempt=envelope.attempt,
            token=FenceToken(token, job_resource(queue, envelope.jid)),
            params=envelope.params,
            rules=self._fence_rules,
            run=self._call,
            client=self._client,
        )
        set_current(job)
        if self._info:
            self.logger.info(
                "task %s started: %s/%s attempt %d", envelope.jid, queue, envelope.operation, envelope.attempt
            )
        started = time.perf_counter()
        try:
            await spec.perform(envelope.params)
        except asyncio.CancelledError:
            raise  # stopping: the task goes back to its queue with the same attempt
        except Exception as exc:
            self._on_failure(qk, token, envelope, spec.policy, exc)
            return
        finally:
            self.stats.durations.observe(time.perf_counter() - started)
        if self._info:
            self.logger.info("task %s completed in %.3fs", envelope.jid, time.perf_counter() - started)
        self._jids[(queue, token)] = envelope.jid
        self._acks[queue].append(token)
        self._event.set()

    def _on_failure(
        self, qk: QueueKeys, token: int, envelope: codec.Envelope, policy: RetryPolicy, exc: Exception
    ) -> None:
        following = policy.next_attempt(envelope.attempt)
        if following is None:
            self.stats.failed += 1
            self.logger.error(
                "task %s failed permanently after %d attempt(s): %r", envelope.jid, envelope.attempt + 1, exc
            )
            self._settle(qk.name, token, self._fail(qk, token, envelope.jid, ""), envelope.jid)
            return
        delay = policy.delay(envelope.attempt)
        self.stats.retried += 1
        self.logger.warning(
            "task %s failed (attempt %d), retrying in %.1fs: %r",
            envelope.jid,
            envelope.attempt + 1,
            delay,
            exc,
        )
        self._settle(
            qk.name,
            token,
            settle.retry(self.keys, qk.name, self._inflight[qk.name], token, envelope, following),
            envelope.jid,
        )

    def _fail(self, qk: QueueKeys, token: int, jid: str | None, reason: str) -> scripts.Call:
        return settle.fail(
            self.keys,
            qk.name,
            self._inflight[qk.name],
            token,
            jid=jid,
            reason=reason,
            consumer=self.consumer_id,
            settings=self.settings,
        )

    def _settle(self, queue: str, token: int, call: scripts.Call, jid: str | None = None) -> None:
        self._jids[(queue, token)] = jid
        self._settles.append((queue, token, call))
        self._event.set()

    # connections, waking, returning ----------------------------------------
    async def _call(self, call: scripts.Call) -> Any:
        """One script call for a running job, on the hot-path connection."""
        return await (await self._connected()).call(call)

    async def _connected(self) -> Link:
        if self._link is None or self._link.closed:
            if self._link is not None:
                # Replies lost with the old connection may have been claims or acks that landed:
                # before the next turn, return what is in flight here but not running.
                self._reconcile = True
            self._link = await open_link(self.target, name=f"fk:{self.consumer_id}", kind=self.link_kind)
        return self._link

    def _want_wake_update(self) -> None:
        idle = (
            not self._stopping
            and len(self._running) < self.concurrency
            and all(q in self._empty for q in self.queues)
        )
        if idle:
            self._want_wake.set()
        else:
            self._want_wake.clear()

    async def _wake_loop(self) -> None:
        backoff = Backoff(self.logger, f"consumer {self.consumer_id}: waiting for work")
        keys = list(self._wake_keys)
        while True:
            await self._want_wake.wait()
            try:
                if self._wake_link is None or self._wake_link.closed:
                    self._wake_link = await open_link(
                        self.target, name=f"fk:{self.consumer_id}:wake", kind=self.link_kind
                    )
                reply = await self._wake_link.execute("BLPOP", *keys, IDLE_POLL, timeout=IDLE_POLL + 5.0)
            except StoreError as exc:
                await asyncio.sleep(backoff.failed(exc))
                self._empty.clear()
                self._event.set()
                continue
            backoff.succeeded()
            if reply:
                self._empty.discard(self._wake_keys[as_text(reply[0])])
            else:
                self._empty.clear()  # safety poll
            self._event.set()

    async def _sleep_or_stop(self, delay: float) -> None:
        self._event.clear()
        try:
            await asyncio.wait_for(self._event.wait(), delay)
        except asyncio.TimeoutError:
            pass

    async def _do_reconcile(self, link: Link, metas: list[tuple[str, str, Any]]) -> None:
        """Return in-flight tasks this consumer does not know it runs (lost claim replies).

        Known are the tasks running, and those whose outcome waits to be sent:
        in this turn (``metas``) or a later one.
        """
        for queue in self.queues:
            entries = await link.execute("HGETALL", self._inflight[queue])
            known = {t for (q, t) in self._running if q == queue} | set(self._acks[queue])
            known |= {t for (q, t, _) in self._settles if q == queue}
            for kind, q, extra in metas:
                if q == queue:
                    known |= {extra[0]} if kind == "settle" else set(extra[1])
            calls = [
                self._requeue(queue, int(token), raw, counter="")
                for token, raw in zip(entries[::2], entries[1::2])
                if int(token) not in known
            ]
            if calls:
                await link.pipeline(calls)
                self.logger.warning(
                    "returned %d task(s) of a lost claim reply to queue %s", len(calls), queue
                )
        self._reconcile = False

    def _requeue(self, queue: str, token: int, raw: bytes, counter: str) -> scripts.Call:
        return settle.requeue(
            self.keys,
            queue,
            self._inflight[queue],
            token,
            raw,
            jid=codec.peek_jid(raw),
            counter=counter,
            settings=self.settings,
        )

    async def _return_inflight(self) -> None:
        """On stop: return every task still in this consumer's in-flight hashes."""
        try:
            link = await self._connected()
            if self._has_outcomes():
                calls, metas = self._build_turn()
                self._absorb(metas, await link.pipeline(calls))
            returned = 0
            for queue in self.queues:
                entries = await link.execute("HGETALL", self._inflight[queue])
                calls = [
                    self._requeue(queue, int(token), raw, counter="")
                    for token, raw in zip(entries[::2], entries[1::2])
                ]
                if calls:
                    results = await link.pipeline(calls)
                    returned += sum(1 for r in results if not isinstance(r, BaseException))
            self.stats.returned += returned
            if returned:
                self.logger.info("returned %d unfinished task(s) to their queues", returned)
        except StoreError as exc:
            self.logger.error(
                "could not return unfinished tasks (they stay in flight until the reaper returns them): %s",
                exc,
            )
            raise
