"""Running one claimed task: decode it, find its worker, run ``perform``, record the outcome.

The outcome goes to the consumer's :class:`~fencekit.consume._outbox.Outbox`,
never straight to Redis: success is an ack; an exception, or a run past its
``timeout``, is a retry after the policy's delay or, once retries are spent,
a failure (logged with its traceback); a task past its ``expires`` time is
dropped unrun; bad input (an envelope that does not decode, an operation no
worker handles, params that do not bind to a task function's signature) is
a dead letter with its reason (invariant I7). Inside ``perform``,
:func:`~fencekit.consume.job.current_job` returns this delivery.

A worker with a :class:`~fencekit.jobs.worker.Invocation` (a task function,
or a sync ``perform``) is run through it, sync code in the consumer's
:class:`~fencekit.consume._threads.SyncRunner`; an async class worker is awaited
directly, at the cost of one ``is None`` test.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from fencekit._aio.scope import TaskScope
from fencekit._log import JobLines
from fencekit._redis.cluster.routing import slot_of
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import translated
from fencekit._redis.scripts import Call
from fencekit.consume._observe import Observer
from fencekit.consume._outbox import Outbox
from fencekit.consume._outcomes import Outcomes, task_fields
from fencekit.consume._settle import Retention
from fencekit.consume._threads import DEFAULT_SYNC_CONCURRENCY, SyncRunner
from fencekit.consume.job import Job, JobSite, fenced_writes, set_current
from fencekit.errors import CrossSlotWrite, FencedOutError, Interrupted, PayloadError, StoreError
from fencekit.jobs import codec
from fencekit.jobs._binding import Unbound
from fencekit.jobs.histogram import DurationHistogram, QueueDurations
from fencekit.jobs.worker import WorkerRegistry, WorkerSpec
from fencekit.primitives.fence import FenceRules

if TYPE_CHECKING:
    from fencekit.produce.client import Client

__all__ = ["ConsumerStats", "Performer"]


@dataclass(slots=True)
class ConsumerStats:
    """Counters of one consumer incarnation (for logs, /admin and tests).

    They count what this consumer saw; the queue's own counters in Redis
    (:class:`~fencekit.produce.handle.QueueStats`) count what landed.
    """

    claimed: int = 0
    claimed_on_wake: int = 0
    """Of ``claimed``, those that came with a wake-up (claims written behind the BLPOP)."""
    processed: int = 0
    failed: int = 0
    retried: int = 0
    fenced_out: int = 0
    returned: int = 0
    lost: int = 0
    """Settlements refused because Redis lost its data after the task was claimed."""
    expired: int = 0
    """Tasks dropped unrun because their ``expires`` time had passed when claimed."""
    cancelled: int = 0
    """Running tasks stopped by a client's ``cancel()``."""
    by_queue: QueueDurations = field(default_factory=QueueDurations)
    """Job durations per queue (the history's p50/p95 come from these)."""

    @property
    def durations(self) -> DurationHistogram:
        """Job durations of every queue, summed."""
        return self.by_queue.total()


DEADLINE_TICK = 0.01
"""Seconds between two looks at the running tasks' deadlines (a timeout fires at most this late)."""


class _Deadline(NamedTuple):
    at: float  # time.monotonic()
    timeout: float
    envelope: codec.Envelope
    spec: WorkerSpec
    job: Job
    task: asyncio.Task[Any] | None


class Performer(Outcomes):
    """Performs the tasks of one consumer (see the module docstring)."""

    def __init__(
        self,
        *,
        keys: KeySpace,
        registry: WorkerRegistry,
        retention: Retention,
        consumer_id: str,
        inflight: Mapping[str, str],
        outbox: Outbox,
        stats: ConsumerStats,
        logger: logging.Logger,
        run_call: Callable[[Call], Awaitable[Any]],
        client: Client,
        wake: Callable[[], None],
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        observer: Observer | None = None,
        sync_concurrency: int = DEFAULT_SYNC_CONCURRENCY,
        scope: TaskScope | None = None,
        cluster: bool = False,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """``scope``: the consumer's task scope (the deadline watch runs in it); ``cluster``: on a
        Redis Cluster (a job's fenced write must then share its queue's slot)."""
        self.keys = keys
        self.registry = registry
        self.retention = retention
        self.consumer_id = consumer_id
        self.inflight = inflight
        self.outbox = outbox
        self.stats = stats
        self.logger = logger
        self.run_call = run_call
        self.client = client
        self.wake = wake
        self.max_payload = max_payload
        self.observer = observer
        self.threads = SyncRunner(sync_concurrency)
        """Where sync ``perform`` code runs (its pool is made at the first sync run)."""
        rules = FenceRules(keys.prefix, timedelta(milliseconds=retention.fence_ttl_ms))
        # One batcher of fenced writes per queue: a batch is one script, whose keys must share
        # the queue's hash tag (I5; on a cluster, one slot).
        self.sites = {
            q: JobSite(
                q,
                hash_key,
                rules,
                run_call,
                client,
                keys.queue(q),
                fenced_writes(run_call),
                slot_of(hash_key) if cluster else None,
                stopping,
            )
            for q, hash_key in inflight.items()
        }
        self.lines = JobLines(logger)
        self.timed_out: dict[tuple[str, int], float] = {}
        """Deliveries settled by their timeout whose coroutine has not ended yet (and since when)."""
        self._deadlines: dict[tuple[str, int], _Deadline] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._scope = scope if scope is not None else TaskScope(f"performer {consumer_id}", logger=logger)
        self.cancelled: set[tuple[str, int]] = set()
        """Deliveries whose cancellation is a client's ``cancel()``, not a stop (cancel.lua settled them)."""

    async def perform(self, queue: str, token: int, raw: bytes) -> None:
        """Run the task of delivery ``token``; its outcome goes to the outbox."""
        try:
            envelope = codec.decode(raw)
        except PayloadError as exc:
            jid = codec.peek_jid(raw)
            self.logger.error("task %s on queue %s is malformed, dead-lettered: %s", jid, queue, exc)
            self._dead(queue, token, jid, f"malformed payload: {exc}")
            return
        spec = self.registry.get(queue, envelope.operation)
        if spec is None:
            reason = f"no worker registered for operation {envelope.operation!r} on queue {queue!r}"
            self.logger.error("task %s dead-lettered: %s", envelope.jid, reason)
            self._dead(queue, token, envelope.jid, reason)
            return
        # plain: neither the task nor its worker sets a timeout, an expiry or a record (the hot path)
        plain = spec.plain and type(envelope) is codec.PlainEnvelope
        if not plain and envelope.expires_at is not None and time.time_ns() // 1000000 > envelope.expires_at:
            self._expired(queue, token, envelope)
            return
        state = None
        if not plain and envelope.ckpt:  # it checkpointed in an earlier delivery: resume from there
            try:
                state = await self._state_of(queue, envelope.jid)
            except StoreError as exc:
                self._failed(queue, token, envelope, spec, exc)
                return
        job = Job(
            envelope.jid,
            envelope.operation,
            envelope.attempt,
            envelope.params,
            token,
            self.sites[queue],
            envelope.batch,
            envelope.parents,
            state,
            spec.pace,
        )
        set_current(job)
        if self.observer is not None:
            self.observer.started(queue, token, envelope)
        if self.lines.on:
            self.lines.info(
                "task %s started: %s/%s attempt %d of %d",
                envelope.jid,
                queue,
                envelope.operation,
                codec.run_number(envelope.attempt),
                spec.policy.runs(),
                fields=task_fields(envelope, queue, token) if self.lines.structured else None,
            )
        timeout = None if plain else envelope.timeout if envelope.timeout is not None else spec.timeout
        if timeout is not None:
            self._deadlines[(queue, token)] = _Deadline(
                time.monotonic() + timeout, timeout, envelope, spec, job, asyncio.current_task()
            )
            if self._watchdog is None or self._watchdog.done():
                self._watchdog = self._scope.start(self._watch_deadlines(), name="fencekit-deadlines")
        started = time.perf_counter()
        try:
            call = spec.call
            if call is None:
                result = await spec.perform(envelope.params)
            else:
                result = await call.run(envelope.params, self.threads)
        except Interrupted:  # a stop, at a checkpoint: back to the queue, no attempt counted
            if self._settled_elsewhere(queue, token, envelope, job, returned=False):
                return
            self._interrupted(queue, token, envelope)
            return
        except asyncio.CancelledError:
            if self._settled_elsewhere(queue, token, envelope, job, returned=False):
                return
            if self.observer is not None:
                self.observer.ended_here(queue, token, "returned")
            raise  # stopping: the task goes back to its queue with the same attempt
        except Exception as exc:
            if job._interrupted:
                self._swallowed(envelope.jid)
            if self._settled_elsewhere(queue, token, envelope, job, returned=False):
                return
            if type(exc) is Unbound:  # the params do not fit the function: bad input, not a failure
                self.logger.error("task %s dead-lettered: %s", envelope.jid, exc)
                self._dead(queue, token, envelope.jid, str(exc))
            else:
                fenced = job.fenced_out if isinstance(exc, FencedOutError) else None
                self._failed(
                    queue, token, envelope, spec, exc, final=isinstance(exc, CrossSlotWrite), fenced=fenced
                )
            return
        finally:
            if timeout is not None:
                self._deadlines.pop((queue, token), None)
            self.stats.by_queue.observe(queue, time.perf_counter() - started)
        if (self.cancelled or self.timed_out) and self._settled_elsewhere(
            queue, token, envelope, job, returned=True
        ):
            return
        if self.lines.on:
            took = time.perf_counter() - started
            fields = task_fields(envelope, queue, token, round(took, 6)) if self.lines.structured else None
            self.lines.info("task %s completed in %.3fs", envelope.jid, took, fields=fields)
        if self.observer is not None:
            self.observer.decided(queue, token, "succeeded")
        if plain and not job._checkpointed:
            self.outbox.ack(queue, token, envelope.jid, None, job._staged)
        else:
            if job._interrupted:
                self._swallowed(envelope.jid)
            keep = spec.keep_ms if spec.keep_ms is not None else envelope.keep
            checkpointed = job.checkpointed or envelope.ckpt
            if keep or envelope.keep or checkpointed:  # a state goes with the record (lua/_ckpt.lua)
                self._ack_recorded(
                    queue, token, raw, envelope, spec, result, keep or 1, checkpointed, job._staged
                )
            else:
                self.outbox.ack(queue, token, envelope.jid, None, job._staged)
        self.wake()

    async def _watch_deadlines(self) -> None:
        """Every :data:`DEADLINE_TICK` s while runs with a timeout exist: time out the late ones.

        One loop per consumer instead of a timer per task: a task's timeout
        costs a dict entry on the hot path, and fires at most one tick late.
        """
        while self._deadlines:
            await asyncio.sleep(DEADLINE_TICK)
            now = time.monotonic()
            late = [key for key, d in self._deadlines.items() if d.at <= now]
            for key in late:
                try:
                    self._time_out(key, self._deadlines.pop(key))
                except Exception:  # a bug here must not stop the other timeouts
                    self.logger.exception("timing out delivery %s of queue %s failed", key[1], key[0])

    def close(self) -> None:
        """Stop watching deadlines and the sync threads, without waiting (the consumer stopped)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.threads.close()

    async def _state_of(self, queue: str, jid: str) -> Any:
        """The state task ``jid`` checkpointed (None: none, or it expired): one GET, made only for a
        task whose envelope says it checkpointed."""
        site = self.sites[queue]
        with translated():
            raw = await site.client.redis.get(site.keys.state(jid))
        return None if raw is None else orjson.loads(raw)

    def _time_out(self, key: tuple[str, int], late: _Deadline) -> None:
        """The run of ``key`` is past its timeout: settle it now, then cancel its coroutine.

        The settle does not wait for the coroutine: one that swallows the
        cancellation runs on, but its writes are refused (here at once, in
        Redis once the settle lands) and nothing it returns is acknowledged.
        """
        queue, token = key
        self.timed_out[key] = time.monotonic()
        late.job.time_out(late.timeout)
        self._failed(queue, token, late.envelope, late.spec, None, late.timeout)
        if late.task is not None:
            late.task.cancel()

    def _settled_elsewhere(
        self, queue: str, token: int, envelope: codec.Envelope, job: Job, *, returned: bool
    ) -> bool:
        """True if the delivery was settled while it ran: it timed out, or a client cancelled it.

        Its outcome then is not this run's: a timeout settled it as a failed
        attempt already, ``cancel.lua`` took it out of flight.
        """
        key = (queue, token)
        since = self.timed_out.pop(key, None)
        if since is not None:
            if returned:
                self.logger.warning(
                    "task %s (%s/%s) ignored the cancellation of its timeout and ran %.3fs more; "
                    "its writes after the timeout were refused",
                    envelope.jid,
                    queue,
                    envelope.operation,
                    time.monotonic() - since,
                )
            return True
        if key in self.cancelled:
            self.cancelled.discard(key)
            job.fence_locally("was cancelled")
            self.stats.cancelled += 1
            if self.observer is not None:
                self.observer.ended_here(queue, token, "cancelled")
            self.logger.info(
                "task %s (%s/%s) cancelled while running", envelope.jid, queue, envelope.operation
            )
            return True
        return False
