"""Back-off and quiet logging for loops that keep failing against Redis.

The consumer backs off from its 100 ms poll interval up to 2 s while its
calls keep failing, logging the first failure, a line each time the wait
grows, then one roughly every 30 s; it logs once more when Redis answers
again. The scheduler, reaper and heartbeat loops use the same helper with
their own intervals.
"""

from __future__ import annotations

import logging
import time

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
    ) -> None:
        self.logger = logger
        self.what = what
        self.base = base
        self.cap = cap
        self.repeat_every = repeat_every
        self.failures = 0
        self.delay = 0.0
        self._last_log = 0.0

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        """Record a failure; return how long to wait before the next attempt."""
        self.failures += 1
        now = time.monotonic()
        previous = self.delay
        self.delay = min(self.cap, self.base if previous == 0 else previous * 2)
        if self.failures == 1:
            self.logger.error("%s failed, retrying in %.1fs: %s", self.what, self.delay, exc)
            self._last_log = now
        elif self.delay > previous:
            self.logger.warning(
                "%s still failing (%d attempts), now retrying every %.1fs: %s",
                self.what,
                self.failures,
                self.delay,
                exc,
            )
            self._last_log = now
        elif now - self._last_log >= self.repeat_every:
            self.logger.warning("%s still failing after %d attempts: %s", self.what, self.failures, exc)
            self._last_log = now
        return self.delay

    def succeeded(self) -> None:
        """Record a success; logs the recovery once after failures."""
        if self.failures:
            self.logger.info("%s recovered after %d failed attempts", self.what, self.failures)
        self.failures = 0
        self.delay = 0.0
