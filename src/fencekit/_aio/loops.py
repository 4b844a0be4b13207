"""The periodic loops' one shape: a step run again and again, that never dies.

:class:`Loop` runs a step on its interval. A :class:`~fencekit.errors.StoreError`
(Redis failed or went away) backs off -- 100 ms doubling to 2 s for the
consumer, each loop with its own base and cap -- logging the first failure,
a line each time the wait grows, then one roughly every 30 s, and once more
when Redis answers again (:class:`Backoff`). A failure to reach Redis is also
this process's outage (:mod:`fencekit._aio.outage`): the outage logs one
line when it starts, one a minute, one when it ends, and the loop's own
lines go to DEBUG. Any other exception is a bug or bad data: it is logged with
its traceback, counted in :attr:`Loop.errors`, and the loop carries on at its
next interval, so one poisoned item never stops the heartbeat, the reaper or
the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from fencekit._aio.outage import OUTAGE
from fencekit.errors import StoreError

__all__ = ["BASE_DELAY", "MAX_DELAY", "Backoff", "Loop"]

BASE_DELAY = 0.1
MAX_DELAY = 2.0
REPEAT_LOG_EVERY = 30.0


class Backoff:
    """Tracks consecutive failures of one loop and decides waits and log lines."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        base: float = BASE_DELAY,
        cap: float = MAX_DELAY,
        repeat_every: float = REPEAT_LOG_EVERY,
        expected: tuple[type[BaseException], ...] = (),
        unreachable: tuple[type[BaseException], ...] = (StoreError,),
    ) -> None:
        self.logger = logger
        self.expected = expected
        """Failures of these types are an operating condition, not a fault: the first is a WARNING
        (so is an exception whose class says ``transient = True``: a slot migration, a failover)."""
        self.unreachable = unreachable
        """Failures of these types (not ``transient``) are Redis not answering: the process's outage."""
        self.what = what
        self.base = base
        self.cap = cap
        self.repeat_every = repeat_every
        self.failures = 0
        self.delay = 0.0
        self._last_log = 0.0
        self._outage = False  # the current failures are the process's outage (lines at DEBUG)

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        """Record a failure; return how long to wait before the next attempt."""
        self.failures += 1
        now = time.monotonic()
        previous = self.delay
        self.delay = min(self.cap, self.base if previous == 0 else previous * 2)
        transient = isinstance(exc, self.expected) or getattr(exc, "transient", False)
        self._outage = isinstance(exc, self.unreachable) and not getattr(exc, "transient", False)
        if self._outage:
            OUTAGE.failed(self, exc)
        quiet = logging.DEBUG if self._outage else None
        if self.failures == 1:
            level = quiet or (logging.WARNING if transient else logging.ERROR)
            self.logger.log(level, "%s failed, retrying in %.1fs: %s", self.what, self.delay, exc)
            self._last_log = now
        elif self.delay > previous:
            self.logger.log(
                quiet or logging.WARNING,
                "%s still failing (%d attempts), now retrying every %.1fs: %s",
                self.what,
                self.failures,
                self.delay,
                exc,
            )
            self._last_log = now
        elif now - self._last_log >= self.repeat_every:
            self.logger.log(
                quiet or logging.WARNING,
                "%s still failing after %d attempts: %s",
                self.what,
                self.failures,
                exc,
            )
            self._last_log = now
        return self.delay

    async def pause(self, exc: BaseException) -> None:
        """Record a failure and wait its back-off, cut short when another loop of this process
        reaches Redis again (:meth:`~fencekit._aio.outage.Outage.listen`)."""
        delay = self.failed(exc)
        if not self._outage:
            await asyncio.sleep(delay)
            return
        answered = asyncio.Event()
        stop = OUTAGE.listen(answered.set)
        try:
            await asyncio.wait_for(answered.wait(), delay)
        except asyncio.TimeoutError:
            pass
        finally:
            stop()

    def succeeded(self) -> None:
        """Record a success; logs the recovery once after failures."""
        if self.failures:
            level = logging.DEBUG if self._outage else logging.INFO
            self.logger.log(level, "%s recovered after %d failed attempts", self.what, self.failures)
            self.failures = 0
            self.delay = 0.0
            OUTAGE.answered(self)

    def rest(self) -> None:
        """This loop stops trying for now (it waits for work, or stops): it no longer holds
        the process's outage open."""
        OUTAGE.forget(self)


class Loop:
    """A named periodic step (see the module docstring); :meth:`run` until cancelled."""

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[object]],
        interval: Callable[[], float],
        backoff: Backoff,
        retry: tuple[type[BaseException], ...] = (StoreError,),
    ) -> None:
        self.name = name
        self.retry = retry
        """Failures the loop backs off on (the store, or another service it depends on): the others
        are bugs or bad data, logged with their traceback."""
        self.step = step
        self.interval = interval
        self.backoff = backoff
        self.errors = 0
        self.runs = 0
        self.last_ok = 0.0

    async def run(self) -> None:
        logger = self.backoff.logger
        try:
            while True:
                try:
                    await self.step()
                except self.retry as exc:
                    await self.backoff.pause(exc)
                    continue
                except Exception:
                    self.errors += 1
                    logger.exception("%s: unexpected error (carrying on with the next round)", self.name)
                    await asyncio.sleep(self.interval())
                    continue
                self.runs += 1
                self.last_ok = time.monotonic()
                self.backoff.succeeded()
                await asyncio.sleep(self.interval())
        finally:
            self.backoff.rest()
