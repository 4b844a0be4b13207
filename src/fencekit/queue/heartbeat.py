"""Heartbeats: keep consumers registered and alive in Redis.

Every beat re-registers each consumer (``heartbeat.lua``: info in the
registry hash, server-clock timestamp in the beats set), so a consumer that
was reaped while Redis was unreachable is watched again as soon as it is back
in touch. Beats run ``BEATS_PER_TTL`` times per TTL.

:meth:`Heartbeat.healthy` is the consumer's lease: it stops claiming when its
last successful beat is older than half the TTL, so a consumer cut off from
Redis (or paused) does not take new tasks while its peers may be reaping it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.store import arun, translated
from fencekit.errors import StoreError
from fencekit.queue.loops import Backoff

BEATS_PER_TTL = 3
HOSTNAME = socket.gethostname()


class Heartbeat:
    """Beats for the consumers returned by ``entries()`` (id -> info dict)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        ttl: float,
        logger: logging.Logger,
        entries: Callable[[], Mapping[str, Mapping[str, Any]]],
        on_success: Callable[[float], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl = ttl
        self.logger = logger
        self.entries = entries
        self.on_success = on_success
        self.last_ok = 0.0
        self._backoff = Backoff(logger, "heartbeat", base=min(1.0, ttl / 10), cap=ttl / BEATS_PER_TTL)

    def healthy(self) -> bool:
        """True while the last successful beat is younger than half the TTL."""
        return time.monotonic() - self.last_ok < self.ttl / 2

    async def beat_once(self) -> None:
        """Beat now for every current consumer; raises :class:`StoreError`."""
        entries = [(cid, orjson.dumps(dict(info))) for cid, info in self.entries().items()]
        if entries:
            call = scripts.heartbeat(consumers=self.keys.consumers, beats=self.keys.beats, entries=entries)
            await arun(self.client, call)
        else:
            with translated():
                await self.client.ping()
        self.last_ok = time.monotonic()
        if self.on_success is not None:
            self.on_success(self.last_ok)

    async def run(self) -> None:
        """Beat until cancelled; failures are logged and retried sooner."""
        while True:
            try:
                await self.beat_once()
            except StoreError as exc:
                await asyncio.sleep(self._backoff.failed(exc))
                continue
            self._backoff.succeeded()
            await asyncio.sleep(self.ttl / BEATS_PER_TTL)


def consumer_info(consumer_id: str, queues: list[str], concurrency: int, **extra: Any) -> dict[str, Any]:
    """The registry record of a consumer (host, pid, queues, start time …)."""
    return {
        "id": consumer_id,
        "host": HOSTNAME,
        "pid": os.getpid(),
        "queues": queues,
        "concurrency": concurrency,
        "started": round(time.time(), 3),
        **extra,
    }
