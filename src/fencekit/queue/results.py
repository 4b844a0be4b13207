"""Reading a task's record by jid, and waiting for it to finish without polling.

:func:`read_job` finds the queue of a jid (the one given, else every known
queue: one ``EXISTS`` each, in one round trip) and runs ``job_info.lua``,
which reads the record and, while the task is unfinished, the in-flight
hashes of the registered consumers.

:class:`ResultWaiter` is one sharded pub/sub connection per ``Client``:
the ack that finishes a recorded task publishes its jid on the queue's
``P:{Q}:done`` channel (``SPUBLISH``, so on Redis Cluster it stays on the
queue's node), and every ``Client.result()`` waiting on that queue is woken
by it. A wait subscribes first, then reads the record, so a finish between
the two is never missed; if the connection drops, every waiter is woken to
read again, and a slow safety re-read covers a message lost anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import MAX_JID, KeySpace, is_jid
from fencekit._redis.run import arun, as_text, translated
from fencekit.errors import ConfigError, JobCancelled, JobExpired, JobFailed, StoreError
from fencekit.queue.records import JobInfo, JobStatus, parse
from fencekit.queue.registry import known_queues

__all__ = ["SAFETY_REREAD", "ResultWaiter", "cancel_job", "outcome", "read_job"]

SAFETY_REREAD = 5.0
"""Seconds between re-reads of a record while waiting (a lost message costs at most this)."""


async def read_job(
    redis_client: redis.asyncio.Redis, keys: KeySpace, jid: str, queue: str | None = None
) -> JobInfo | None:
    """The record of task ``jid`` (of ``queue``, else of whichever known queue has it), or None."""
    if not is_jid(jid):
        raise ConfigError(f"jid must be 1 to {MAX_JID} printable characters without whitespace, got {jid!r}")
    with translated():
        if queue is None:
            queues = await known_queues(redis_client, keys)
            pipe = redis_client.pipeline(transaction=False)
            for name in queues:
                pipe.exists(keys.queue(name).job(jid))
            found = [name for name, n in zip(queues, await pipe.execute()) if n]
            if not found:
                return None
            queue = found[0]
        consumers = [as_text(c) for c in await redis_client.hkeys(keys.consumers)]
    qk = keys.queue(queue)
    call = scripts.job_info(record=qk.job(jid), inflight=[qk.inflight(c) for c in consumers], jid=jid)
    return parse(jid, queue, await arun(redis_client, call))


async def cancel_job(
    redis_client: redis.asyncio.Redis, keys: KeySpace, jid: str, queue: str | None, keep_finished: int
) -> bool:
    """Run ``cancel.lua`` on the queue that has task ``jid`` (or each known queue until one has it)."""
    if not is_jid(jid):
        raise ConfigError(f"jid must be 1 to {MAX_JID} printable characters without whitespace, got {jid!r}")
    with translated():
        if queue is not None:
            queues = [queue]
        else:
            queues = await known_queues(redis_client, keys)
            pipe = redis_client.pipeline(transaction=False)
            for name in queues:
                pipe.exists(keys.queue(name).job(jid))
            recorded = [name for name, n in zip(queues, await pipe.execute()) if n]
            queues = recorded or queues  # without a record: look in every queue
        consumers = [as_text(c) for c in await redis_client.hkeys(keys.consumers)]
    for name in queues:
        qk = keys.queue(name)
        call = scripts.cancel(
            record=qk.job(jid),
            pending=qk.pending,
            scheduled=qk.scheduled,
            stats=qk.stats,
            finished=qk.finished,
            inflight=[qk.inflight(c) for c in consumers],
            jid=jid,
            channel=qk.cancel_channel,
            keep_finished=keep_finished,
        )
        done, where = await arun(redis_client, call)
        if int(done):
            return True
        if as_text(where):  # found, but finished already
            return False
    return False


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
        self._listener: asyncio.Task[None] | None = None
        self._waiting: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._channels: dict[str, str] = {}  # channel -> queue
        self._ready: dict[str, asyncio.Event] = {}  # channel -> confirmed

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
            self._pubsub = self._redis.pubsub()
        await self._pubsub.ssubscribe(channel)
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name="fencekit-results")

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
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
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
