"""Hearing that a running task was cancelled: the consumer's cancel channel.

``Client.cancel(jid)`` runs ``cancel.lua``, which takes a running delivery
out of its consumer's in-flight hash at once (from then on its ack and its
fenced writes are refused) and publishes ``"<jid> <token>"`` on the queue's
``P:{Q}:cancel`` channel (``SPUBLISH``: on Redis Cluster it stays on the
queue's node). Each consumer listens on the channels of its queues over a
pub/sub connection of its own and cancels the coroutine of a delivery it
runs. A message published while the subscription is down is not lost:
``cancel.lua`` also keeps it in ``P:{Q}:cancelled`` (the newest 1,000, for an
hour), and each time a channel's subscription is confirmed again -- after the
listener reconnected, or after redis-py did it under it -- the listener reads
that set and hands every entry on (the consumer ignores the deliveries it does
not run). Read after the confirmation, so a cancel is in the set or arrives on
the channel. On a Redis Cluster the channels of queues on different primaries
are heard over one subscription per node
(:func:`fencekit._redis.cluster.pubsub.sharded_pubsub`), followed when a
queue's slot moves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import redis.asyncio
import redis.exceptions

from fencekit._aio.closing import aclose_all
from fencekit._aio.loops import Backoff
from fencekit._redis.cluster.pubsub import sharded_pubsub
from fencekit._redis.keys import QueueKeys
from fencekit._redis.run import as_text
from fencekit.errors import StoreError

__all__ = ["CancelListener"]


# redis-py's own errors reach the listener untranslated (its pub/sub is redis-py's).
UNREACHABLE = (StoreError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class CancelListener:
    """Calls ``on_cancel(queue, jid, token)`` for every cancel published on the queues' channels.

    ``queues`` maps each cancel channel to its queue's keys. ``subscribed`` is
    set once every channel's subscription is confirmed, and cleared while the
    connection is down.
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        queues: Mapping[str, QueueKeys],
        *,
        name: str,
        logger: logging.Logger,
        on_cancel: Callable[[str, str, int], None],
    ) -> None:
        self._redis = redis_client
        self.channels = {channel: keys.name for channel, keys in queues.items()}  # channel -> queue
        self._logs = {channel: keys.cancelled for channel, keys in queues.items()}
        self._heard: set[str] = set()  # channels confirmed at least once: a new confirmation replays
        self._replay: set[str] = set()  # channels confirmed again whose P:{Q}:cancelled is to be read
        self._on_cancel = on_cancel
        self._backoff = Backoff(logger, f"consumer {name}: listening for cancels", unreachable=UNREACHABLE)
        self._pubsub: Any = None
        self._confirmed: set[str] = set()
        self.subscribed = asyncio.Event()
        self._stopping = False

    def stop(self) -> None:
        """Make :meth:`run` return at its next message or 1 s read timeout.

        Called beside ``task.cancel()``: a cancellation can be swallowed by a
        client library mid-call (seen on the cluster's sharded pub/sub), and a
        listener that goes on would hold a stopping consumer forever.
        """
        self._stopping = True

    async def run(self) -> None:
        """Listen until stopped or cancelled; reconnect with back-off when the connection fails."""
        try:
            await self._listen()
        finally:
            self._backoff.rest()

    async def _listen(self) -> None:
        while not self._stopping:
            try:
                if self._pubsub is None:
                    self._pubsub = sharded_pubsub(self._redis)
                    await self._pubsub.ssubscribe(*self.channels)
                message = await self._pubsub.get_message(timeout=1.0)
                if message is not None:
                    self._handle(message)
                if self._replay:
                    await self._read_missed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.subscribed.clear()
                self._confirmed.clear()
                await self._drop()
                await self._backoff.pause(exc)
                continue
            self._backoff.succeeded()

    async def _read_missed(self) -> None:
        """Hand on the cancels kept in ``P:{Q}:cancelled`` of the channels confirmed again."""
        for channel in sorted(self._replay):
            entries = cast("list[bytes | str]", await self._redis.zrange(self._logs[channel], 0, -1))
            self._replay.discard(channel)
            for entry in entries:
                self._cancelled(channel, entry)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = as_text(message.get("type", b""))
        if kind == "ssubscribe":
            channel = as_text(message.get("channel", b""))
            if channel in self._heard:  # subscribed again: what was published meanwhile is kept
                self._replay.add(channel)
            elif channel in self.channels:
                self._heard.add(channel)
            self._confirmed.add(channel)
            if self._confirmed.issuperset(self.channels):
                self.subscribed.set()
            return
        if kind == "smessage":
            self._cancelled(as_text(message.get("channel", b"")), message.get("data", b""))

    def _cancelled(self, channel: str, data: bytes | str) -> None:
        queue = self.channels.get(channel)
        jid, _, token = as_text(data).partition(" ")
        if queue is not None and token.isdigit():
            self._on_cancel(queue, jid, int(token))

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        await aclose_all(pubsub)

    async def aclose(self) -> None:
        await self._drop()
