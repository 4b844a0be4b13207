"""The history sampler: the periodic loop that books each queue's minute and hour buckets.

Every :data:`INTERVAL` seconds, on a grid of the host clock and just after each
mark, one ``history_sample.lua`` call per queue books the counters' increase
since the previous sample *by any host*, the depth, and this host's own job
durations since its own previous sample (the stored form and the reads are
:mod:`fencekit.jobs.history`). A sample landing just after a minute mark books
:data:`BOOK_BACK_MS` back in time, into the minute that ended. Several hosts
sampling one queue book each increment once; a failed sample books nothing, and
the next one books what it missed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.steps import apipeline
from fencekit.jobs.histogram import DurationHistogram, QueueDurations
from fencekit.jobs.history import HOURS, MINUTES

__all__ = ["AFTER_MARK", "BOOK_BACK_MS", "INTERVAL", "HistorySampler"]

INTERVAL = 5.0
"""Seconds between two samples of a host (on a grid of its clock: every host samples at :00, :05, ...)."""

AFTER_MARK = 0.05
"""Seconds after each grid mark a sample is taken."""

BOOK_BACK_MS = 100
"""Booked this much before the sample's time: a sample just after a minute mark is the minute that ended."""


class HistorySampler:
    """Books the history of ``queues`` (see the module docstring); :meth:`loop` runs it."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        queues: Sequence[str],
        logger: logging.Logger,
        durations: Callable[[], QueueDurations] = QueueDurations,
    ) -> None:
        """``durations``: this host's job durations per queue so far (they only grow)."""
        self.client = client
        self.keys = keys
        self.queues = list(queues)
        self.logger = logger
        self.durations = durations
        self._booked: dict[str, DurationHistogram] = {}  # per queue: what is in Redis already
        self.samples = 0

    async def sample(self, now_ms: int | None = None) -> list[tuple[int, int]]:
        """Book every queue once; returns (processed booked, depth) per queue. Raises StoreError.

        ``now_ms``: the time to book at (None: the Redis clock, minus
        :data:`BOOK_BACK_MS`).
        """
        reading = self.durations().copy()
        calls = []
        for queue in self.queues:
            qk = self.keys.queue(queue)
            delta = reading.get(queue) - self._booked.get(queue, _EMPTY)
            calls.append(
                scripts.history_sample(
                    stats=qk.stats,
                    pending=qk.pending,
                    last=qk.history_last,
                    minutes=qk.history_minutes,
                    hours=qk.history_hours,
                    now_ms=now_ms,
                    back_ms=0 if now_ms is not None else BOOK_BACK_MS,
                    minute_tier=(MINUTES.step, MINUTES.keep),
                    hour_tier=(HOURS.step, HOURS.keep),
                    durations=_encode(delta),
                )
            )
        results = await apipeline(self.client, calls)
        booked: list[tuple[int, int]] = []
        failure: BaseException | None = None
        for queue, result in zip(self.queues, results):
            if isinstance(result, BaseException):
                failure = failure or result  # this queue's durations are booked by the next sample
                continue
            self._booked[queue] = reading.get(queue)
            booked.append((int(result[0]), int(result[1])))
        if failure is not None:
            raise failure
        self.samples += 1
        return booked

    def loop(self) -> Loop:
        """Sample on the :data:`INTERVAL` grid of the host clock, just after each mark."""
        return Loop("history", self.sample, _until_next_mark, Backoff(self.logger, "history", 1.0, INTERVAL))


_EMPTY = DurationHistogram()


def _until_next_mark() -> float:
    return INTERVAL - time.time() % INTERVAL + AFTER_MARK


def _encode(delta: DurationHistogram) -> str:
    if delta.count == 0:
        return ""
    return " ".join([str(round(delta.sum * 1e6)), *(str(n) for n in delta.counts)])
