"""What a consumer says when Redis refuses it: fenced out, data lost, or no lease.

A refused settlement has two possible causes, and the log must name the
right one: the delivery was reaped or returned while it ran (fenced out,
invariant I3 of ``docs/design.md``), or Redis lost its data after the task was
claimed (restarted empty, flushed), which the heartbeat detects and counts
as a reset. :class:`Refusals` remembers which deliveries a reset caught and
words each refusal, and says once why the consumer stopped claiming when
its lease lapsed (no heartbeat reached Redis) and once when it claims again.

No I/O here; the consumer calls it on rare paths only (a reset, a refusal, a
lease that changes), so the hot path pays one integer comparison per turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from fencekit._aio.outage import OUTAGE
from fencekit.consume._perform import ConsumerStats

__all__ = ["Refusals"]

Key = tuple[str, int]  # (queue, token)


class Refusals:
    """The wording of one consumer's refusals and idle spells (see the module docstring)."""

    def __init__(
        self,
        consumer_id: str,
        logger: logging.Logger,
        stats: ConsumerStats,
        heartbeat_ttl: float,
        resets: Callable[[], int] | None = None,
    ) -> None:
        self.consumer_id = consumer_id
        self.logger = logger
        self.stats = stats
        self.heartbeat_ttl = heartbeat_ttl
        self._resets = resets or (lambda: 0)
        self._seen = self._resets()
        self._lost: set[Key] = set()  # deliveries claimed before Redis lost its data
        self._idle_since: float | None = None

    def check_reset(self, unsettled: Callable[[], Iterable[Key]]) -> None:
        """After a reset the heartbeat saw, every delivery not settled yet was claimed before it."""
        if self._resets() != self._seen:
            self._seen = self._resets()
            self._lost.update(unsettled())

    def lost(self, key: Key) -> None:
        """Redis itself reported that ``key``'s record is gone (its token counter vanished)."""
        self._lost.add(key)

    def settled(self, keys: Iterable[Key]) -> None:
        """These deliveries are settled: forget them."""
        if self._lost:
            self._lost.difference_update(keys)

    def refused(self, key: Key, jid: str | None, what: str) -> None:
        """Log and count a refused settlement truthfully: fenced out, or Redis lost its data meanwhile."""
        queue, token = key
        if key in self._lost:
            self._lost.discard(key)
            self.stats.lost += 1
            self.logger.warning(
                "task %s: %s delivery %s on queue %s found no record: Redis lost its data after the "
                "task was claimed; it ran, but its outcome is not recorded",
                jid,
                what,
                token,
                queue,
            )
            return
        self.stats.fenced_out += 1
        self.logger.warning(
            "task %s: %s delivery %s on queue %s fenced out: the task was reaped or returned while it "
            "ran, a newer delivery owns it",
            jid,
            what,
            token,
            queue,
        )

    def lease(self, blocked: bool, stopping: bool) -> None:
        """Say once why the consumer stopped claiming, and once when it starts again."""
        if blocked and self._idle_since is None:
            self._idle_since = time.monotonic()
            self.logger.log(
                logging.DEBUG if OUTAGE.open else logging.WARNING,  # Redis is away: the outage's line says it
                "consumer %s: not claiming: no heartbeat has reached Redis for more than half its "
                "%.0fs lease, so peers may soon return its tasks (the heartbeat's log line says why "
                "it fails; Redis out of memory refuses them); it claims again after the next heartbeat",
                self.consumer_id,
                self.heartbeat_ttl,
            )
        elif not blocked and self._idle_since is not None and not stopping:
            self.logger.info(
                "consumer %s: claiming again: a heartbeat reached Redis after %.1fs without one",
                self.consumer_id,
                time.monotonic() - self._idle_since,
            )
            self._idle_since = None
