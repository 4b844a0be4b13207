"""``SyncClient``: the :class:`~fencekit.produce.client.Client` API for synchronous code.

For WSGI apps, Django views, scripts and Celery tasks: the same methods,
settings (:func:`fencekit.settings.resolve` of ``ClientSettings``), hooks and
errors as ``Client``, over a ``redis.Redis`` with retries off
(:func:`fencekit._redis.clients.loopless_client`) and no event loop anywhere.
Every rule is the one ``Client`` runs: the enqueue and its hooks
(:class:`~fencekit.produce._producer.Producer`), the record reads, cancel and
result wait (:mod:`fencekit.produce._results`), the queue handle's reads and
actions (:mod:`fencekit.produce._handle_steps`), driven here by
:func:`fencekit._redis.steps.drive`.

- **Threads**: one instance serves any number of threads. Each call takes a
  connection from redis-py's pool (which blocks no other thread) for its own
  round trips; an enqueue is one round trip (two the first time a queue name
  is seen). There is no batching across threads (the asyncio ``Client``
  coalesces concurrent enqueues; here each thread's send is its own).
- **fork**: redis-py's pool notices the new pid and opens fresh connections
  in the child (gunicorn prefork, multiprocessing); nothing is shared.
- **Errors**: a lost connection is :class:`~fencekit.errors.StoreError`,
  never a re-send (invariant I4); the next call connects again.
- **result()**: each waiting call opens its own sharded subscription
  (``SSUBSCRIBE`` on the queue's ``P:{Q}:done``; one connection per waiting
  thread), confirmed before the record is read (no lost wake-up), re-reads
  on each message naming its jid and every :data:`~fencekit.produce._results.SAFETY_REREAD`
  seconds, and stops at ``timeout`` with the built-in ``TimeoutError``. On a
  Redis Cluster the subscription is on the node of the queue's slot; when
  that slot moves (the server unsubscribes it, or refuses it with
  ``MOVED``) the slot map is read again and the wait reads the record again
  and subscribes where the slot is now.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import redis
from redis.exceptions import RedisClusterException
from typing_extensions import Unpack

from fencekit._redis.clients import close_sync_client, loopless_client
from fencekit._redis.cluster.pubsub import channel_pubsub, read_slot_map_again
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, drive, run_batch
from fencekit.errors import StoreError
from fencekit.hooks import FenceKitHooks
from fencekit.jobs._registry import queue_names
from fencekit.jobs.records import JobInfo
from fencekit.jobs.task import Task
from fencekit.produce import _batch_steps as batch_steps
from fencekit.produce import _dep_steps as dep_steps
from fencekit.produce import _handle_steps as handle_steps
from fencekit.produce._enqueue import Enqueued
from fencekit.produce._handle_steps import QueueStats
from fencekit.produce._producer import Producer, Send, delay_ms, first_error
from fencekit.produce._results import SAFETY_REREAD, Pause, Subscribe, cancel_steps, job_steps, result_steps
from fencekit.produce.batch import BatchInfo, SyncBatch
from fencekit.produce.schedules import ScheduleInfo, schedules_steps
from fencekit.produce.sync_handle import SyncQueue
from fencekit.settings import ClientOptions, ClientSettings, resolve, resolve_connecting, with_url

__all__ = ["SyncClient"]


class SyncClient(Producer):
    """Enqueues tasks and inspects queues from synchronous code (a context manager too)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        redis: redis.Redis | None = None,
        hooks: FenceKitHooks | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        """``redis`` reuses a synchronous redis-py client instead of opening one (it is not closed here).

        ``hooks`` (:mod:`fencekit.hooks`) are told of every enqueue and may
        carry a trace context in each task. The settings are ``Client``'s.
        """
        settings: ClientSettings = (
            resolve_connecting(ClientSettings, redis_url, options, "SyncClient")
            if redis is None
            else resolve(ClientSettings, with_url(redis_url, options), owner="SyncClient")
        )
        self._set_up_producer(settings, hooks)
        self.redis = redis if redis is not None else loopless_client(self.target)
        self._owns_redis = redis is None

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (when this client created it)."""
        if self._owns_redis:
            close_sync_client(self.redis)

    def queue(self, name: str) -> SyncQueue:
        """The synchronous handle of queue ``name``."""
        return SyncQueue(self.redis, self.keys, name, producer=self)

    def enqueue(
        self, task: Task, *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> str:
        """Accept ``task`` and return its jid (``delay``: seconds or timedelta; ``at``: an aware datetime)."""
        (jid,) = self.enqueue_many((task,), delay=delay, at=at)
        self._accepted(jid, task)
        return jid

    def enqueue_many(
        self, tasks: Iterable[Task], *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> list[str]:
        """Accept many tasks in one round trip; all are validated before any is sent."""
        return [e.jid for e in self._enqueue(list(tasks), delay_ms(delay, at))]

    def enqueue_unique(
        self, task: Task, *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> Enqueued:
        """Enqueue ``task`` unless its ``unique_key`` is held: ``Enqueued(jid, created)``."""
        self._check_unique(task)
        (enqueued,) = self._enqueue([task], delay_ms(delay, at))
        return enqueued

    def _enqueue(self, tasks: list[Task], delay: int) -> list[Enqueued]:
        if not tasks:
            return []
        if any(task.depends_on is not None for task in tasks):  # held for their parents
            return drive(self.redis, dep_steps.enqueue_any_steps(self, tasks, delay), self._enqueue_request)
        return drive(self.redis, self.enqueue_steps(tasks, delay), self._enqueue_request)

    def _enqueue_request(self, request: Batch | Send) -> Any:
        if isinstance(request, Batch):
            return run_batch(self.redis, request)
        outcome = first_error(drive(self.redis, self.send_steps(*request)))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def job(self, jid: str, *, queue: str | None = None) -> JobInfo | None:
        """What happened to task ``jid`` (None: it keeps no record, or it was forgotten)."""
        return drive(self.redis, job_steps(self.keys, jid, queue))

    def result(self, jid: str, *, timeout: float | None = None, queue: str | None = None) -> Any:
        """Wait until task ``jid`` finishes and return what its ``perform`` returned.

        Woken by the finishing ack (no polling); the errors of
        :meth:`Client.result <fencekit.produce.client.Client.result>`
        (``JobFailed``, ``JobCancelled``, ``JobExpired``, ``JobNotFound``, the
        built-in ``TimeoutError`` after ``timeout`` seconds).
        """
        wait = _Wake(self.redis, self.keys.queue, self.logger)
        try:
            return drive(
                self.redis, result_steps(self.keys, jid, queue, timeout, time.monotonic), wait.answer
            )
        finally:
            wait.close()

    def cancel(self, jid: str, *, queue: str | None = None) -> bool:
        """Cancel task ``jid``: True if this call cancelled it, False if it had finished or is unknown."""
        return drive(self.redis, cancel_steps(self.keys, jid, queue, self.settings["keep_finished"]))

    def batch(
        self,
        tasks: Iterable[Task],
        *,
        on_complete: Task | None = None,
        on_success: Task | None = None,
        on_failure: Task | None = None,
        keep: float | None = None,
    ) -> SyncBatch:
        """:meth:`Client.batch <fencekit.produce.client.Client.batch>`: enqueue ``tasks`` as one
        armed batch (every child given at once)."""
        callbacks = {"complete": on_complete, "success": on_success, "failure": on_failure}
        bid = drive(self.redis, batch_steps.begin_steps(self, callbacks, keep=keep))
        keep_finished = self.settings["keep_finished"]
        try:
            jids = drive(self.redis, batch_steps.add_steps(self, bid, list(tasks)), self._enqueue_request)
        except BaseException:
            try:
                drive(self.redis, batch_steps.cancel_steps(self.keys, bid, keep_finished))
            except Exception as exc:  # the enqueue's error is the one raised
                self.logger.warning("batch %s: cancelling after a failed enqueue failed too: %s", bid, exc)
            raise
        drive(self.redis, batch_steps.arm_steps(self.keys, bid))
        return SyncBatch(self, bid, jids)

    def chain(self, tasks: Iterable[Task]) -> list[str]:
        """:meth:`Client.chain <fencekit.produce.client.Client.chain>`: each task starts once the
        one before succeeded; their jids."""
        return drive(self.redis, dep_steps.chain_steps(self, list(tasks)), self._enqueue_request)

    def batch_info(self, bid: str) -> BatchInfo | None:
        """Where batch ``bid`` is, None when unknown."""
        return drive(self.redis, batch_steps.info_steps(self.keys, bid))

    def batch_results(self, bid: str) -> dict[str, Any]:
        """The results of batch ``bid``'s children that succeeded and keep a record, by jid."""
        return drive(self.redis, batch_steps.results_steps(self.keys, bid))

    def queues(self) -> list[str]:
        """Every queue name ever used with this prefix."""
        return drive(self.redis, queue_names(self.keys))

    def stats(self) -> QueueStats:
        """Counters summed over every queue."""
        return drive(self.redis, handle_steps.total_stats(self.keys))

    def schedules(self) -> list[ScheduleInfo]:
        """The periodic schedules the running processes registered, with their last and next run."""
        return drive(self.redis, schedules_steps(self.keys, time.time_ns() // 1_000_000))


class _Wake:
    """One ``result()`` call's sharded subscription: answers its :class:`Subscribe` and :class:`Pause`."""

    def __init__(self, client: redis.Redis, queue_keys: Any, logger: logging.Logger) -> None:
        self._client = client
        self._queue_keys = queue_keys
        self._logger = logger
        self._pubsub: Any = None
        self._channel = ""
        self._jid = ""

    def answer(self, request: Any) -> Any:
        if isinstance(request, Batch):
            return run_batch(self._client, request)
        if isinstance(request, Subscribe):
            self._channel, self._jid = self._queue_keys(request.queue).done_channel, request.jid
            self._subscribe(time.monotonic() + SAFETY_REREAD)
            return None
        assert isinstance(request, Pause)
        self._pause(time.monotonic() + request.seconds)
        return None

    def _subscribe(self, until: float) -> None:
        """Subscribe and wait for the confirmation (a finish after it is seen), at most until ``until``."""
        try:
            self._pubsub = channel_pubsub(self._client, self._channel)
            self._pubsub.ssubscribe(self._channel)
            while (left := until - time.monotonic()) > 0:
                message = self._pubsub.get_message(timeout=left)
                if message is not None and as_text(message.get("type", b"")) == "ssubscribe":
                    return
        except (redis.RedisError, OSError, StoreError) as exc:
            self._logger.warning("result wait on %s is not subscribed (%s): re-reading", self._channel, exc)
            self._lost()
            return
        self._logger.warning("result wait on %s is not subscribed yet: re-reading", self._channel)

    def _pause(self, until: float) -> None:
        """Return when a message names the jid, the subscription fails, or ``until`` passes."""
        if self._pubsub is None:  # the subscription failed: subscribe again, or wait a little
            self._subscribe(until)
            if self._pubsub is None:
                time.sleep(max(0.0, min(1.0, until - time.monotonic())))
            return  # read again: a finish before the subscription is seen by the read
        try:
            while (left := until - time.monotonic()) > 0:
                message = self._pubsub.get_message(timeout=left)
                kind = None if message is None else as_text(message.get("type", b""))
                if kind == "sunsubscribe":  # the server's: the queue's slot moved to another node
                    self._lost()
                    return  # read again, then subscribe where the slot is now
                if message is None or kind != "smessage":
                    continue
                if self._jid in as_text(message["data"]).split():  # one message per ack: its jids
                    return
        except (redis.RedisError, OSError) as exc:
            self._logger.warning("result channel %s failed (%s): re-reading", self._channel, exc)
            self._lost()

    def _lost(self) -> None:
        """Drop the subscription; on a cluster read the slot map again (the slot moved, or a node failed)."""
        self.close()
        try:
            read_slot_map_again(self._client)
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            self._logger.warning("reading the Redis Cluster's slot map failed (%s)", exc)

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except (redis.RedisError, OSError):
                pass
            self._pubsub = None
