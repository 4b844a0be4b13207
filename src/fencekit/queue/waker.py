"""Waking an idle consumer within about a millisecond of an enqueue, without polling.

Every enqueue (and every requeue, retry move or claim that leaves work
behind) pushes at most one marker onto its queue's wake list
(``lua/_wake.lua``). An idle consumer blocks in ``BLPOP`` on the wake lists
of all its queues over a connection of its own; the reply names the queue
that has work. The ``BLPOP`` times out every :data:`IDLE_POLL` seconds as a
safety re-poll, so a lost marker costs at most that long.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from fencekit._redis.link import Link, open_link
from fencekit._redis.run import as_text
from fencekit._redis.sentinel import MasterWatch
from fencekit._redis.url import RedisTarget
from fencekit.errors import StoreError
from fencekit.queue.loops import Backoff

__all__ = ["IDLE_POLL", "Waker"]

IDLE_POLL = 1.0


class Waker:
    """Blocks on the wake lists while :attr:`wanted` is set; tells ``on_wake`` what it learned.

    ``on_wake(queue)`` gets the queue that has work, or ``None`` when the
    consumer should look at every queue again (the safety poll, or Redis
    came back after a failure).
    """

    def __init__(
        self,
        target: RedisTarget,
        *,
        watch: MasterWatch | None,
        link_kind: str,
        name: str,
        wake_keys: Mapping[str, str],
        logger: logging.Logger,
        on_wake: Callable[[str | None], None],
    ) -> None:
        self.target = target
        self.watch = watch
        self.link_kind = link_kind
        self.name = name
        self.wake_keys = dict(wake_keys)  # wake key -> queue
        self.on_wake = on_wake
        self.wanted = asyncio.Event()
        self._backoff = Backoff(logger, f"consumer {name}: waiting for work")
        self._link: Link | None = None

    async def run(self) -> None:
        """Wait for work until cancelled."""
        keys = list(self.wake_keys)
        while True:
            await self.wanted.wait()
            try:
                if self._link is None or self._link.closed:
                    self._link = await open_link(
                        self.target, name=f"fk:{self.name}:wake", kind=self.link_kind
                    )
                reply = await self._link.execute("BLPOP", *keys, IDLE_POLL, timeout=IDLE_POLL + 5.0)
            except StoreError as exc:
                await asyncio.sleep(self._backoff.failed(exc))
                self.on_wake(None)
                continue
            self._backoff.succeeded()
            self.on_wake(self.wake_keys[as_text(reply[0])] if reply else None)

    async def aclose(self) -> None:
        if self._link is not None:
            await self._link.aclose()
