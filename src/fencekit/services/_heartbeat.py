"""Heartbeats: keep consumers registered and alive in Redis.

Every beat re-registers each consumer (``heartbeat.lua``: its
:class:`~fencekit.jobs._registry.ConsumerRecord` in the registry hash, a
server-clock timestamp in the beats set), so a consumer that was reaped while
Redis was unreachable is watched again as soon as it is back in touch. Beats
run ``BEATS_PER_TTL`` times per TTL.

:meth:`Heartbeat.healthy` is the lease of the consumers it beats for
(:func:`~fencekit.jobs._registry.lease_ok`): they stop claiming when the last
successful beat is older than half the TTL.

Each beat also reads the store id (``P:{registry}:store``), a random id the
first beat ever wrote. When it is gone or changed, Redis lost its data since
the previous beat (restarted without persistence, flushed): the heartbeat logs
one WARNING saying so and how many tasks were running here, counts it in
:attr:`Heartbeat.resets` (the consumers word their refused settlements from
it), re-registers the queue names, and calls ``on_reset``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun, as_text
from fencekit.jobs._registry import ConsumerRecord, lease_ok, register_queues

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
        *,
        queues: Iterable[str] = (),
        running: Callable[[], int] = lambda: 0,
        on_reset: Callable[[int], None] | None = None,
    ) -> None:
        """``running``: tasks running here now; ``on_reset(resets)``: Redis lost its data."""
        self.client = client
        self.keys = keys
        self.ttl = ttl
        self.logger = logger
        self.entries = entries
        self.on_success = on_success
        self.queues = tuple(queues)
        self.running = running
        self.on_reset = on_reset
        self.last_ok = 0.0
        self.store_id: str | None = None
        self.resets = 0
        self._register = False

    def healthy(self) -> bool:
        """True while the consumers' lease holds (the last beat is younger than TTL/2)."""
        return lease_ok(self.last_ok, self.ttl)

    async def beat_once(self) -> None:
        """Beat now for every current consumer; raises :class:`StoreError`."""
        entries = [(cid, record.to_json()) for cid, record in self.entries().items()]
        call = scripts.heartbeat(
            consumers=self.keys.consumers,
            beats=self.keys.beats,
            store=self.keys.store,
            new_store_id=uuid.uuid4().hex,  # fresh each beat: a store rebuilt by this process differs
            entries=entries,
        )
        _, store = await arun(self.client, call)
        previous, self.store_id = self.store_id, as_text(store)
        if previous is not None and self.store_id != previous:
            self._lost_data()
        if self._register:
            await register_queues(self.client, self.keys, self.queues)
            self._register = False
        self.last_ok = time.monotonic()
        if self.on_success is not None:
            self.on_success(self.last_ok)

    def _lost_data(self) -> None:
        self.resets += 1
        self._register = True
        self.logger.warning(
            "Redis lost its data since the previous heartbeat (restarted without persistence, or "
            "flushed): the store id this process saw is gone. Every task that waited, was scheduled "
            "or was dead-lettered before is gone; %d task(s) running here will finish, but Redis "
            "holds no record to settle them against. Registering the queue names again.",
            self.running(),
        )
        if self.on_reset is not None:
            self.on_reset(self.resets)

    def loop(self) -> Loop:
        """The periodic beat; a failed beat is retried within a second (sooner when another loop
        reaches Redis: :meth:`~fencekit._aio.loops.Backoff.pause`), since claims wait for it."""
        retry = min(1.0, self.ttl / 10)
        backoff = Backoff(self.logger, "heartbeat", base=retry, cap=retry)
        return Loop("heartbeat", self.beat_once, lambda: self.ttl / BEATS_PER_TTL, backoff)
