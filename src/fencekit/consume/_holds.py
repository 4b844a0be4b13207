"""Paused queues: which of a consumer's queues an operator paused, read every :data:`POLL` s.

``client.queue(name).pause()`` adds the name to the set ``P:{registry}:paused``
(kept across a Redis restart with an AOF, as every key); each consumer reads
that set when it starts, before its first claim, and then every :data:`POLL`
seconds, and claims from no queue in it (running tasks go on; enqueues are
accepted). So a pause takes hold on every host within about :data:`POLL`
seconds, with no cost on the claim path: the set is read beside it, not in it.
A read that fails keeps the last answer (the consumer's own turns report
Redis going away).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import redis.asyncio

from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, arun_batch, cmd
from fencekit.errors import StoreError

__all__ = ["POLL", "QueueHolds"]

POLL = 0.5
"""Seconds between two reads of the paused set by one consumer."""


class QueueHolds:
    """The paused ones among ``queues`` (see the module docstring); ``on_change`` is told the new set."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        queues: Sequence[str],
        logger: logging.Logger,
        on_change: Callable[[frozenset[str]], None],
    ) -> None:
        self.client = client
        self.keys = keys
        self.queues = frozenset(queues)
        self.logger = logger
        self.on_change = on_change
        self.held: frozenset[str] = frozenset()

    async def read(self) -> frozenset[str]:
        """Read the set once and tell ``on_change`` if it changed; raises StoreError."""
        (names,) = await arun_batch(self.client, Batch([cmd("smembers", self.keys.paused)]))
        held = frozenset(as_text(n) for n in names) & self.queues
        if held != self.held:
            for queue in sorted(held - self.held):
                self.logger.warning("queue %s is paused: no claims from it until it is resumed", queue)
            for queue in sorted(self.held - held):
                self.logger.info("queue %s is resumed", queue)
            self.held = held
            self.on_change(held)
        return held

    async def run(self) -> None:
        """Read every :data:`POLL` s until cancelled."""
        while True:
            await asyncio.sleep(POLL)
            try:
                await self.read()
            except StoreError:
                pass  # Redis away: the turns say so; the last answer stands
            except Exception:  # a bug must not end the watch silently
                self.logger.exception("reading the paused queues failed (trying again)")
