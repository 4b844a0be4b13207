"""Running one claimed task: decode it, find its worker, run ``perform``, record the outcome.

The outcome goes to the consumer's :class:`~fencekit.queue.outbox.Outbox`,
never straight to Redis: success is an ack; an exception is a retry after
the policy's delay or, once retries are spent, a failure; bad input (an
envelope that does not decode, an operation no worker handles) is a dead
letter with its reason (invariant I7). Inside ``perform``,
:func:`~fencekit.queue.job.current_job` returns this delivery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from fencekit._redis.keys import KeySpace
from fencekit._redis.scripts import Call
from fencekit.errors import PayloadError
from fencekit.primitives.fence import FenceRules
from fencekit.queue import codec, settle
from fencekit.queue.histogram import DurationHistogram
from fencekit.queue.job import Job, JobSite, set_current
from fencekit.queue.outbox import Outbox
from fencekit.queue.settle import Delivery, Retention
from fencekit.queue.worker import RetryPolicy, WorkerRegistry

if TYPE_CHECKING:
    from fencekit.queue.client import Client

__all__ = ["ConsumerStats", "Performer"]


@dataclass(slots=True)
class ConsumerStats:
    """Counters of one consumer incarnation (for logs, /admin and tests).

    They count what this consumer saw; the queue's own counters in Redis
    (:class:`~fencekit.queue.handle.QueueStats`) count what landed.
    """

    claimed: int = 0
    processed: int = 0
    failed: int = 0
    retried: int = 0
    fenced_out: int = 0
    returned: int = 0
    lost: int = 0
    """Settlements refused because Redis lost its data after the task was claimed."""
    durations: DurationHistogram = field(default_factory=DurationHistogram)


class Performer:
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
    ) -> None:
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
        rules = FenceRules(keys.prefix, timedelta(milliseconds=retention.fence_ttl_ms))
        self.sites = {q: JobSite(q, hash_key, rules, run_call, client) for q, hash_key in inflight.items()}
        self.info = logger.isEnabledFor(logging.INFO)

    def delivery(self, queue: str, token: int, raw: bytes = b"") -> Delivery:
        return Delivery(queue, self.inflight[queue], token, raw)

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
        site = self.sites[queue]
        set_current(Job(envelope.jid, envelope.operation, envelope.attempt, envelope.params, token, site))
        if self.info:
            self.logger.info(
                "task %s started: %s/%s attempt %d", envelope.jid, queue, envelope.operation, envelope.attempt
            )
        started = time.perf_counter()
        try:
            await spec.perform(envelope.params)
        except asyncio.CancelledError:
            raise  # stopping: the task goes back to its queue with the same attempt
        except Exception as exc:
            self._failed(queue, token, envelope, spec.policy, exc)
            return
        finally:
            self.stats.durations.observe(time.perf_counter() - started)
        if self.info:
            self.logger.info("task %s completed in %.3fs", envelope.jid, time.perf_counter() - started)
        self.outbox.ack(queue, token, envelope.jid)
        self.wake()

    def _failed(
        self, queue: str, token: int, envelope: codec.Envelope, policy: RetryPolicy, exc: Exception
    ) -> None:
        following = policy.next_attempt(envelope.attempt)
        delivery = self.delivery(queue, token)
        if following is None:
            self.stats.failed += 1
            self.logger.error(
                "task %s failed permanently after %d attempt(s): %r", envelope.jid, envelope.attempt + 1, exc
            )
            call = settle.fail(self.keys, delivery, jid=envelope.jid, retention=self.retention)
        else:
            delay = policy.delay(envelope.attempt)
            self.stats.retried += 1
            self.logger.warning(
                "task %s failed (attempt %d), retrying in %.1fs: %r",
                envelope.jid,
                envelope.attempt + 1,
                delay,
                exc,
            )
            call = settle.retry(self.keys, delivery, envelope, following, delay)
        self.outbox.settle(queue, token, call, envelope.jid)
        self.wake()

    def _dead(self, queue: str, token: int, jid: str | None, reason: str) -> None:
        call = settle.fail(
            self.keys,
            self.delivery(queue, token),
            jid=jid,
            reason=reason,
            consumer=self.consumer_id,
            retention=self.retention,
        )
        self.outbox.settle(queue, token, call, jid)
        self.wake()
