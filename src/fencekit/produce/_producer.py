"""What ``Client`` and ``SyncClient`` share: settings, and the enqueue and read rules as steps.

:class:`Producer` holds what a producer resolved once (keys, payload limit,
retention, durability, hooks, the queue names it registered) and builds the
steps (:mod:`fencekit._redis.steps`) of an enqueue: :meth:`Producer.enqueue_steps`
validates and encodes every task (telling the hooks of each outcome),
registers queue names it has not seen, and yields a :class:`Send` -- the
caller's tasks, which the asyncio ``Client`` hands to its
:class:`~fencekit.produce._batching.Coalescer` (one plan per delay for the
calls made meanwhile) and ``SyncClient`` sends at once;
:meth:`Producer.send_steps` is one plan's round trip and what its replies
mean (each task's jid, or its call's error; ``DurabilityError`` when too few
replicas confirmed). No I/O here.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from fencekit._log import JobLines, default_logger
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import Durability
from fencekit._redis.steps import Batch, Steps
from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError, DurabilityError, PayloadError
from fencekit.hooks import FenceKitHooks, JobEvent, check_hooks
from fencekit.jobs import codec
from fencekit.jobs._registry import registering
from fencekit.jobs.codec import seconds_in
from fencekit.jobs.task import Task, unix_ms
from fencekit.produce._enqueue import Enqueued, EnqueuePlan, encode
from fencekit.settings import ClientSettings

__all__ = ["Producer", "Send", "delay_ms", "first_error"]


class Send(NamedTuple):
    """A request of :meth:`Producer.enqueue_steps`: send these encoded tasks (reply: their ``Enqueued``)."""

    tasks: list[Task]
    envelopes: list[bytes]
    delay_ms: int


class Producer:
    """The I/O-free half of a client (see the module docstring)."""

    hooks: FenceKitHooks | None
    settings: ClientSettings
    keys: KeySpace
    max_payload: int
    durable: Durability | None
    keep_result: float
    _known_queues: set[str]
    _lines: JobLines

    def _set_up_producer(self, settings: ClientSettings, hooks: FenceKitHooks | None) -> None:
        self.hooks = check_hooks(hooks)
        self.settings = settings
        self.target = parse_url(settings["redis_url"])
        self.keys = KeySpace(settings["prefix"])
        self.max_payload = settings["max_payload"]
        self.durable = Durability.of(settings["durable_replicas"], settings["durable_timeout"])
        self.keep_result = settings["keep_result"]
        self._known_queues = set()
        self.logger = default_logger("fencekit.client")

    @property
    def logger(self) -> logging.Logger:
        """Where the client logs (``fencekit.client`` by default); assign another logger to replace it."""
        return self._lines.logger

    @logger.setter
    def logger(self, logger: logging.Logger) -> None:
        self._lines = JobLines(logger)

    def _accepted(self, jid: str, task: Task) -> None:
        if self._lines.wanted():
            self._lines.info("task %s accepted: %s/%s", jid, task.queue, task.operation)

    @staticmethod
    def _check_unique(task: Task) -> None:
        if task.unique_key is None:
            raise ConfigError("enqueue_unique needs a Task with a unique_key")

    def prepare(self, tasks: list[Task], batch: str | None = None) -> tuple[list[bytes], list[str]]:
        """The tasks encoded (all or nothing; with the hooks' trace; children of ``batch``), the
        queue names not registered yet."""
        envelopes = encode(
            tasks, max_payload=self.max_payload, keep_result=self.keep_result, hooks=self.hooks, batch=batch
        )
        known = self._known_queues
        return envelopes, [q for q in dict.fromkeys(t.queue for t in tasks) if q not in known]

    def register(self, names: list[str]) -> Steps[None]:
        """Record queue names in the registry, then remember them (the next enqueue skips them)."""
        yield from registering(self.keys, names)
        self._known_queues.update(names)

    def enqueue_steps(
        self, tasks: list[Task], delay_ms: int, batch: str | None = None
    ) -> Steps[list[Enqueued]]:
        """:meth:`prepare`, :meth:`register` the new names, then :class:`Send` (hooks told of each task).

        ``Client`` runs these three steps inline when it has no hooks (its hot path).
        """
        hooks = self.hooks
        envelopes: list[bytes] = []
        error: BaseException | None = None
        try:
            envelopes, new = self.prepare(tasks, batch)
            if new:
                yield from self.register(new)
            enqueued: list[Enqueued] = yield Send(tasks, envelopes, delay_ms)
            return enqueued
        except BaseException as exc:
            error = exc
            raise
        finally:
            if hooks is not None:
                now = time.time_ns()
                for i, task in enumerate(tasks):
                    trace = codec.decode(envelopes[i]).trace if i < len(envelopes) else None
                    event = JobEvent(
                        task.queue,
                        task.operation,
                        task.jid,
                        codec.run_number(task.attempt),
                        None,
                        trace,
                        at_ns=now,
                    )
                    hooks.job("enqueued", event._replace(error=error))

    def send_steps(
        self, tasks: list[Task], envelopes: list[bytes], delay_ms: int
    ) -> Steps[list[Enqueued | BaseException]]:
        """Send tasks with one delay in one round trip: per task, its outcome or its call's error."""
        plan, batch = self.plan(tasks, envelopes, delay_ms)
        return self.outcomes(plan, tasks, (yield batch))

    def plan(self, tasks: list[Task], envelopes: list[bytes], delay_ms: int) -> tuple[EnqueuePlan, Batch]:
        """The :class:`EnqueuePlan` of tasks with one delay, and its batch (its ``WAIT`` when durable)."""
        plan = EnqueuePlan.of(self.keys, tasks, envelopes, keep_result=self.keep_result, delay_ms=delay_ms)
        return plan, Batch(plan.calls, slots=True, wait=self.durable)

    def outcomes(
        self, plan: EnqueuePlan, tasks: list[Task], results: list[Any]
    ) -> list[Enqueued | BaseException]:
        """What the replies of a :meth:`plan`'s batch mean (DurabilityError: too few replicas confirmed)."""
        durable = self.durable
        if durable is not None:
            reply = results.pop()
            if isinstance(reply, BaseException):
                raise reply
            confirmed = int(reply)
            if confirmed < durable.replicas:
                raise DurabilityError(
                    f"{len(tasks)} task(s) accepted by the master but confirmed by {confirmed} of "
                    f"{durable.replicas} replicas within {durable.timeout_ms} ms: "
                    "a failover now could lose them",
                    confirmed,
                )
        return plan.outcomes(tasks, results)


def first_error(outcomes: list[Enqueued | BaseException]) -> list[Enqueued] | BaseException:
    """One caller's outcome of a send: its tasks' ``Enqueued``, or the first error among them."""
    error = next((o for o in outcomes if isinstance(o, BaseException)), None)
    return error if error is not None else outcomes  # type: ignore[return-value]


def delay_ms(delay: float | timedelta | None, at: datetime | None = None) -> int:
    """The milliseconds until a task given ``delay`` or ``at`` is due (ConfigError for bad values)."""
    if at is not None:
        if delay is not None:
            raise ConfigError("give enqueue either delay= or at=, not both")
        if not isinstance(at, datetime):
            raise ConfigError(f"at must be a timezone-aware datetime, got {at!r}")
        try:
            due = unix_ms(at, "at")
        except PayloadError as exc:
            raise ConfigError(str(exc)) from None
        # The producer's clock: the script adds the delay to Redis's own clock.
        return max(0, due - time.time_ns() // 1_000_000)
    if delay is None:
        return 0
    try:
        return round(seconds_in(delay, "delay", zero=True) * 1000)
    except PayloadError as exc:  # the call's own argument, not the task's: a ConfigError
        raise ConfigError(str(exc)) from None
