"""Heartbeats: keep consumers registered and alive in Redis.

Every beat re-registers each consumer (``heartbeat.lua``: its
:class:`~fencekit.queue.registry.ConsumerRecord` in the registry hash, a
server-clock timestamp in the beats set), so a consumer that was reaped while
Redis was unreachable is watched again as soon as it is back in touch. Beats
run ``BEATS_PER_TTL`` times per TTL.

:meth:`Heartbeat.healthy` is the lease of the consumers it beats for
(:func:`~fencekit.queue.registry.lease_ok`): they stop claiming when the last
successful beat is older than half the TTL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun, translated
from fencekit.queue.loops import Backoff, Loop
from fencekit.queue.registry import ConsumerRecord, lease_ok

__all__ = ["BEATS_PER_TTL", "Heartbeat"]

BEATS_PER_TTL = 3


class Heartbeat:
    """Beats for the consumers returned by ``entries()`` (id -> record)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        ttl: float,
        logger: logging.Logger,
        entries: Callable[[], Mapping[str, ConsumerRecord]],
        on_success: Callable[[float], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl = ttl
        self.logger = logger
        self.entries = entries
        self.on_success = on_success
        self.last_ok = 0.0

    def healthy(self) -> bool:
        """True while the consumers' lease holds (the last beat is younger than TTL/2)."""
        return lease_ok(self.last_ok, self.ttl)

    async def beat_once(self) -> None:
        """Beat now for every current consumer; raises :class:`StoreError`."""
        entries = [(cid, record.to_json()) for cid, record in self.entries().items()]
        if entries:
            call = scripts.heartbeat(consumers=self.keys.consumers, beats=self.keys.beats, entries=entries)
            await arun(self.client, call)
        else:
            with translated():
                await self.client.ping()
        self.last_ok = time.monotonic()
        if self.on_success is not None:
            self.on_success(self.last_ok)

    def loop(self) -> Loop:
        """The periodic beat (failures retried sooner, within a third of the TTL)."""
        backoff = Backoff(
            self.logger, "heartbeat", base=min(1.0, self.ttl / 10), cap=self.ttl / BEATS_PER_TTL
        )
        return Loop("heartbeat", self.beat_once, lambda: self.ttl / BEATS_PER_TTL, backoff)
