"""Reading a task's record by jid, and waiting for it to finish without polling.

:func:`job_steps` finds the queue of a jid (the one given, else every known
queue: one ``EXISTS`` each, in one round trip) and runs ``job_info.lua``,
which reads the record and, while the task is unfinished, the in-flight
hashes of the registered consumers. It, :func:`cancel_steps` and
:func:`result_steps` (the waiting rule) are steps
(:mod:`fencekit._redis.steps`): ``Client`` and ``SyncClient`` run the same
ones (:func:`read_job`, :func:`cancel_job`: on an asyncio client).

:class:`ResultWaiter` is one sharded pub/sub connection per ``Client``:
the ack that finishes a recorded task publishes its jid on the queue's
``P:{Q}:done`` channel (``SPUBLISH``, so on Redis Cluster it stays on the
queue's node), and every ``Client.result()`` waiting on that queue is woken
by it (on a Redis Cluster over one subscription per node:
:func:`fencekit._redis.cluster.pubsub.sharded_pubsub`). A wait subscribes
first, then reads the record, so a finish between the two is never missed;
if the connection drops, every waiter is woken to read again, and a slow
safety re-read covers a message lost anyway. Its listener is a task of the
waiter's :class:`~fencekit._aio.scope.TaskScope`, ended by :meth:`ResultWaiter.aclose`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import redis.asyncio

from fencekit._aio.closing import aclose_all
from fencekit._aio.scope import TaskScope
from fencekit._redis import scripts
from fencekit._redis.cluster.pubsub import sharded_pubsub
from fencekit._redis.keys import KeySpace, jid_error
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Steps, adrive, cmd
from fencekit.errors import ConfigError, JobCancelled, JobExpired, JobFailed, JobNotFound, StoreError
from fencekit.jobs._registry import queue_names
from fencekit.jobs.records import JobInfo, JobStatus, parse

__all__ = [
    "SAFETY_REREAD",
    "Pause",
    "ResultWaiter",
    "Subscribe",
    "cancel_call",
    "cancel_job",
    "cancel_steps",
    "job_steps",
    "outcome",
    "read_job",
    "result_steps",
]

SAFETY_REREAD = 5.0
"""Seconds between re-reads of a record while waiting (a lost message costs at most this)."""


def _check_jid(jid: str) -> None:
    if (problem := jid_error(jid)) is not None:
        raise ConfigError(problem)


def _recorded_in(keys: KeySpace, jid: str) -> Steps[tuple[list[str], list[str], list[str]]]:
    """Every known queue, those holding a record of ``jid``, and the registered consumers."""
    queues = yield from queue_names(keys)
    ops = [cmd("exists", keys.queue(name).job(jid)) for name in queues]
    *exists, consumers = yield Batch((*ops, cmd("hkeys", keys.consumers)))
    return queues, [name for name, n in zip(queues, exists) if n], [as_text(c) for c in consumers]


def _consumers(keys: KeySpace) -> Steps[list[str]]:
    (consumers,) = yield Batch((cmd("hkeys", keys.consumers),))
    return [as_text(c) for c in consumers]


def job_steps(keys: KeySpace, jid: str, queue: str | None = None) -> Steps[JobInfo | None]:
    """The record of task ``jid`` (of ``queue``, else of whichever known queue has it), or None."""
    _check_jid(jid)
    if queue is None:
        _, found, consumers = yield from _recorded_in(keys, jid)
        if not found:
            return None
        queue = found[0]
    else:
        consumers = yield from _consumers(keys)
    qk = keys.queue(queue)
    call = scripts.job_info(record=qk.job(jid), inflight=[qk.inflight(c) for c in consumers], jid=jid)
    (reply,) = yield Batch((call,))
    return parse(jid, queue, reply)


async def read_job(
    redis_client: redis.asyncio.Redis, keys: KeySpace, jid: str, queue: str | None = None
) -> JobInfo | None:
    """:func:`job_steps` on an asyncio client."""
    return await adrive(redis_client, job_steps(keys, jid, queue))


def cancel_call(
    keys: KeySpace, queue: str, jid: str, consumers: list[str], keep_finished: int
) -> scripts.Call:
    """``cancel.lua`` of task ``jid`` of ``queue``, looking in the in-flight hashes of ``consumers``."""
    qk = keys.queue(queue)
    return scripts.cancel(
        record=qk.job(jid),
        pending=qk.pending,
        scheduled=qk.scheduled,
        stats=qk.stats,
        finished=qk.finished,
        inflight=[qk.inflight(c) for c in consumers],
        jid=jid,
        channel=qk.cancel_channel,
        keep_finished=keep_finished,
        done=qk.done_channel,
    )


def cancel_steps(keys: KeySpace, jid: str, queue: str | None, keep_finished: int) -> Steps[bool]:
    """Run ``cancel.lua`` on the queue that has task ``jid`` (or each known queue until one has it)."""
    _check_jid(jid)
    if queue is not None:
        queues = [queue]
        consumers = yield from _consumers(keys)
    else:
        every, recorded, consumers = yield from _recorded_in(keys, jid)
        queues = recorded or every  # without a record: look in every queue
    for name in queues:
        ((done, where),) = yield Batch((cancel_call(keys, name, jid, consumers, keep_finished),))
        if int(done):
            return True
        if as_text(where):  # found, but finished already
            return False
    return False


async def cancel_job(
    redis_client: redis.asyncio.Redis, keys: KeySpace, jid: str, queue: str | None, keep_finished: int
) -> bool:
    """:func:`cancel_steps` on an asyncio client."""
    return await adrive(redis_client, cancel_steps(keys, jid, queue, keep_finished))


class Subscribe(NamedTuple):
    """A request of :func:`result_steps`: be woken when task ``jid`` of ``queue`` may have finished.

    The driver subscribes before it answers (so the record read next cannot
    miss the finish), forgets any wake-up older than each later read, and
    unsubscribes when the steps end.
    """

    queue: str
    jid: str


class Pause(NamedTuple):
    """A request of :func:`result_steps`: wait for a wake-up, at most ``seconds``."""

    seconds: float


def result_steps(
    keys: KeySpace, jid: str, queue: str | None, timeout: float | None, clock: Callable[[], float]
) -> Steps[Any]:
    """Wait until task ``jid`` finishes and return its result (``Client.result``'s rule).

    Reads the record; while it is unfinished: subscribed, read again, pause
    until woken or :data:`SAFETY_REREAD` (or the deadline) passes. ``clock``
    is a monotonic clock in seconds.
    """
    deadline = None if timeout is None else clock() + timeout
    info = yield from job_steps(keys, jid, queue)
    if info is not None and not info.status.finished:
        found = info.queue
        yield Subscribe(found, jid)
        while True:
            info = yield from job_steps(keys, jid, found)
            if info is None or info.status.finished:
                break
            left = SAFETY_REREAD if deadline is None else min(SAFETY_REREAD, deadline - clock())
            if left <= 0:
                raise TimeoutError(f"task {jid} did not finish within {timeout}s")
            yield Pause(left)
    if info is None:
        raise JobNotFound(f"no record of task {jid}: it keeps none (keep_result=0), or it was forgotten")
    return outcome(info)


def outcome(info: JobInfo) -> Any:
    """The result of a finished task, or the exception that says why there is none."""
    if info.status is JobStatus.DONE:
        return info.result
    if info.status is JobStatus.EXPIRED:
        raise JobExpired(f"task {info.jid} expired before it started")
    if info.status is JobStatus.CANCELLED:
        raise JobCancelled(f"task {info.jid} was cancelled")
    detail = f": {info.error}" if info.error else ""
    raise JobFailed(f"task {info.jid} {info.status.value}{detail}", info.error)


class ResultWaiter:
    """Wakes ``Client.result()`` calls when their task's finishing ack publishes its jid."""

    def __init__(self, redis_client: redis.asyncio.Redis, keys: KeySpace, logger: logging.Logger) -> None:
        self._redis = redis_client
        self._keys = keys
        self._logger = logger
        self._pubsub: Any = None
        self._scope = TaskScope("result waiter", logger=logger)
        self._listener: asyncio.Task[None] | None = None
        self._waiting: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._channels: dict[str, str] = {}  # channel -> queue
        self._ready: dict[str, asyncio.Event] = {}  # channel -> confirmed
        self._unsubscribed: set[str] = set()  # channels whose SSUBSCRIBE failed: the listener retries

    async def watch(self, queue: str, jid: str) -> asyncio.Event:
        """An event set when task ``jid`` of ``queue`` may have finished (subscribed before it returns)."""
        event = asyncio.Event()
        self._waiting.setdefault((queue, jid), set()).add(event)
        channel = self._keys.queue(queue).done_channel
        try:
            if channel not in self._channels:
                self._channels[channel] = queue
                self._ready[channel] = asyncio.Event()
                await self._subscribe(channel)
            await asyncio.wait_for(self._ready[channel].wait(), SAFETY_REREAD)
        except (asyncio.TimeoutError, StoreError, redis.RedisError, OSError) as exc:
            self._logger.warning("result wait on queue %s is not subscribed yet (%s): re-reading", queue, exc)
        return event

    def unwatch(self, queue: str, jid: str, event: asyncio.Event) -> None:
        events = self._waiting.get((queue, jid))
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiting[(queue, jid)]

    async def _subscribe(self, channel: str) -> None:
        if self._pubsub is None:
            self._pubsub = sharded_pubsub(self._redis)
        try:
            await self._pubsub.ssubscribe(channel)
        except BaseException:
            # the listener subscribes it later (the waits re-read meanwhile): a failed first
            # SSUBSCRIBE once left a channel unsubscribed for good, and no listener running
            self._unsubscribed.add(channel)
            raise
        finally:
            if self._listener is None or self._listener.done():
                self._listener = self._scope.start(self._listen(), name="fencekit-results")

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                if self._unsubscribed:
                    channels = sorted(self._unsubscribed)
                    await self._pubsub.ssubscribe(*channels)
                    self._unsubscribed.difference_update(channels)
                message = await self._pubsub.get_message(timeout=1.0)
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection dropped: wake everyone to read again
                self._logger.warning("result channel failed, resubscribing in %.1fs: %s", delay, exc)
                for ready in self._ready.values():
                    ready.clear()
                self._wake_all()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                with contextlib.suppress(Exception):
                    await self._pubsub.ssubscribe(*self._channels)
                continue
            if message is None:
                continue
            kind = as_text(message.get("type", b""))
            channel = as_text(message.get("channel", b""))
            if kind == "ssubscribe" and channel in self._ready:
                self._ready[channel].set()
                self._wake_all(self._channels.get(channel))  # a finish before this may have been missed
            elif kind == "smessage":
                queue = self._channels.get(channel, "")
                for jid in as_text(message["data"]).split():  # one message per ack: its recorded jids
                    for event in self._waiting.get((queue, jid), ()):
                        event.set()

    def _wake_all(self, queue: str | None = None) -> None:
        for (q, _), events in self._waiting.items():
            if queue is None or q == queue:
                for event in events:
                    event.set()

    async def aclose(self) -> None:
        try:
            await self._scope.aclose()  # raises the caller's cancellation, once the listener ended
        finally:
            self._listener = None
            pubsub, self._pubsub = self._pubsub, None
            await aclose_all(pubsub)
