"""The schedule loop: enqueues each due tick of the periodic workers, once across every host.

Run by the ``Server`` or the pool's supervisor (``runtime.services``), never
by a pool child. Every host that serves a schedule runs this loop; none is
elected. Each round:

1. the schedules whose next tick has come propose their due ticks
   (:meth:`~fencekit.jobs.periodic.Schedule.due`, from the newest tick
   enqueued as last seen);
2. one ``periodic_enqueue.lua`` call per schedule, all in one pipeline,
   enqueues only the ticks newer than the newest one any host enqueued
   (``P:{Q}:cron:<operation>``), atomically with the LPUSH: the script
   decides, so two hosts, a paused host that resumes, or a host whose clock
   is behind never enqueue one tick twice;
3. the replies give the newest tick enqueued by anyone, and the loop sleeps
   until the next tick of any schedule (at most :data:`MAX_SLEEP`, to
   notice clock jumps).

The first round reads the newest ticks from Redis and registers the
schedules' definitions (``P:{Q}:schedules``, for ``client.schedules()`` and
/admin); the registration is written again every :data:`REGISTER_EVERY`
seconds (so it comes back after Redis lost its data). Ticks are on the
host's clock: hosts whose clocks disagree by ``d`` enqueue a tick up to
``d`` early or late, never twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, arun_batch, cmd
from fencekit.jobs.periodic import Schedule
from fencekit.jobs.task import Task

__all__ = ["MAX_SLEEP", "REGISTER_EVERY", "Ticker"]

MAX_SLEEP = 1.0
"""The longest the loop sleeps, whatever the next tick: a clock jump is noticed within it."""

REGISTER_EVERY = 60.0
"""Seconds between two writes of the schedules' definitions."""

LATE = 0.002
"""Seconds the loop wakes after a tick (so the host's clock has passed it)."""


class Ticker:
    """Enqueues the due ticks of ``schedules`` (see the module docstring)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        schedules: Sequence[Schedule],
        logger: logging.Logger,
        *,
        max_payload: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.keys = keys
        self.schedules = list(schedules)
        self.logger = logger
        self.max_payload = max_payload
        self.clock = clock
        self.floor_ms = self._now_ms()  # a schedule no host ran yet starts from here (see register)
        self._floor_checked = False
        self.last: dict[str, int | None] = {}  # schedule name -> newest tick enqueued, as last seen
        self.next: dict[str, int] = {}  # schedule name -> the next tick to look at
        self.enqueued = 0  # ticks this loop enqueued
        self._registered_at: float | None = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def loop(self) -> Loop:
        """A round at each tick of any schedule, at most :data:`MAX_SLEEP` apart."""
        return Loop("periodic", self.round, self.interval, Backoff(self.logger, "periodic", 0.1, 2.0))

    def interval(self) -> float:
        """Seconds until the next tick of any schedule (at most :data:`MAX_SLEEP`)."""
        if not self.next:  # no round has succeeded yet
            return MAX_SLEEP
        wait = (min(self.next.values()) - self._now_ms()) / 1000 + LATE
        return max(0.0, min(MAX_SLEEP, wait))

    async def round(self) -> int:
        """One round (see the module docstring); returns the ticks this round enqueued."""
        if self._registered_at is None or time.monotonic() - self._registered_at >= REGISTER_EVERY:
            await self.register()
        now = self._now_ms()
        proposals: list[tuple[Schedule, list[int]]] = []
        for schedule in self.schedules:
            if self.next.get(schedule.name, 0) > now:
                continue
            ticks = schedule.due(self.last.get(schedule.name), self.floor_ms, now)
            if ticks:
                proposals.append((schedule, ticks))
            else:
                self.next[schedule.name] = schedule.next_after(now)
        if not proposals:
            return 0
        replies = await arun_batch(self.client, Batch([self._call(s, ticks) for s, ticks in proposals]))
        enqueued = 0
        newest_runs: list[str] = []  # one per schedule that enqueued: the round's one log line
        for (schedule, _), (count, newest) in zip(proposals, replies):
            enqueued += int(count)
            newest_ms = int(as_text(newest))
            self.last[schedule.name] = newest_ms if newest_ms >= 0 else None
            self.next[schedule.name] = schedule.next_after(now)
            if int(count):
                newest_runs.append(schedule.jid(newest_ms))
        if len(newest_runs) == 1:
            self.logger.info("periodic: enqueued %d run(s), newest %s", enqueued, newest_runs[0])
        elif newest_runs:
            shown = ", ".join(newest_runs[:3]) + (", ..." if len(newest_runs) > 3 else "")
            self.logger.info(
                "periodic: enqueued %d run(s) of %d schedule(s), newest %s", enqueued, len(newest_runs), shown
            )
        self.enqueued += enqueued
        return enqueued

    def _call(self, schedule: Schedule, ticks: list[int]) -> scripts.Call:
        qk = self.keys.queue(schedule.queue)
        keep_s = schedule.keep_ms / 1000
        entries = []
        for tick in ticks:
            jid = schedule.jid(tick)
            task = Task(
                schedule.queue,
                schedule.operation,
                dict(schedule.params),
                jid,
                keep_result=keep_s,
                priority=schedule.priority,
                concurrency_key=schedule.concurrency_key,
            )
            entries.append((tick, task.envelope(self.max_payload, keep_s), qk.job(jid)))
        return scripts.periodic_enqueue(
            last=qk.cron_last(schedule.operation),
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            floor_ms=self.floor_ms,
            keep_ms=schedule.keep_ms,
            collapse=not schedule.catch_up,
            ticks=entries,
        )

    async def register(self) -> None:
        """Write the schedules' definitions and read the newest tick of each (raises StoreError).

        The first one also moves :attr:`floor_ms` back to this host's start on
        Redis's clock when that is earlier: a host whose clock is ahead would
        otherwise start its schedules up to the skew late, and the ticks
        between would be enqueued by nobody (the other hosts reach them when
        they are older than the newest stored tick).
        """
        ops: list[Any] = []
        written = self._now_ms()
        for schedule in self.schedules:
            qk = self.keys.queue(schedule.queue)
            ops.append(cmd("hset", qk.schedules, schedule.operation, schedule.definition(written)))
            ops.append(cmd("get", qk.cron_last(schedule.operation)))
        replies = await arun_batch(self.client, Batch(ops)) if ops else []
        if not self._floor_checked:
            seconds, micros = (await arun_batch(self.client, Batch([cmd("time")])))[0]
            ahead_ms = self._now_ms() - (int(seconds) * 1000 + int(micros) // 1000)
            self.floor_ms -= max(0, ahead_ms)
            self._floor_checked = True
        for schedule, newest in zip(self.schedules, replies[1::2]):
            known = int(as_text(newest)) if newest is not None else None
            mine = self.last.get(schedule.name)  # kept when Redis lost the key: no tick again
            self.last[schedule.name] = known if mine is None or (known is not None and known > mine) else mine
        self._registered_at = time.monotonic()
