"""What ``client.schedules()`` and /admin list: each registered schedule with its last and next run.

The processes that run schedules register their definitions in
``P:{Q}:schedules`` (``services/_ticker.py``); the newest tick enqueued is
``P:{Q}:cron:<operation>``, written by ``periodic_enqueue.lua``. The read is
steps (:mod:`fencekit._redis.steps`), so ``Client``, ``SyncClient`` and the
admin page run the same rule: the known queues, one ``HGETALL`` per queue,
then one ``GET`` per schedule. The next run is computed from the definition
on the reader's clock; a definition that no longer parses is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Steps, cmd
from fencekit.jobs._registry import queue_names
from fencekit.jobs.periodic import Schedule

__all__ = ["ScheduleInfo", "schedules_steps"]


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as registered, with its newest run and its next tick (Unix seconds)."""

    queue: str
    operation: str
    cron: str | None
    every: float | None  # seconds
    tz: str
    catch_up: bool
    params: dict[str, Any]
    last_run: float | None  # the newest tick enqueued by any host (None: none yet)
    last_jid: str | None  # that run's jid (its record: ``client.job(last_jid)``)
    next_run: float  # the next tick after now (or after the last run, if that is later)
    registered_at: float | None = None
    """When a running process last registered it (each does every minute): older means none runs it."""

    @property
    def name(self) -> str:
        return f"{self.queue}:{self.operation}"

    @property
    def expression(self) -> str:
        """``cron`` as written, or ``every N s``."""
        return self.cron if self.cron is not None else f"every {self.every:g} s"


def _seen(definition: bytes | str) -> float | None:
    """The ``seen`` time of a definition, in Unix seconds (None: not written)."""
    value = orjson.loads(definition).get("seen")
    return value / 1000 if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def schedules_steps(
    keys: KeySpace, now_ms: int, queues: list[str] | None = None
) -> Steps[list[ScheduleInfo]]:
    """Every schedule registered in ``queues`` (None: every known queue), by queue then operation."""
    if queues is None:
        queues = yield from queue_names(keys)
    if not queues:
        return []
    hashes = yield Batch([cmd("hgetall", keys.queue(q).schedules) for q in queues])
    found: list[Schedule] = []
    seen: list[float | None] = []
    for raw in hashes:
        for _, definition in sorted((as_text(k), v) for k, v in raw.items()):
            schedule = Schedule.from_definition(definition)
            if schedule is not None:
                found.append(schedule)
                seen.append(_seen(definition))
    if not found:
        return []
    lasts = yield Batch([cmd("get", keys.queue(s.queue).cron_last(s.operation)) for s in found])
    out = []
    for schedule, raw_last, seen_at in zip(found, lasts, seen):
        last = int(as_text(raw_last)) if raw_last is not None else None
        out.append(
            ScheduleInfo(
                queue=schedule.queue,
                operation=schedule.operation,
                cron=schedule.cron,
                every=schedule.every_ms / 1000 if schedule.every_ms is not None else None,
                tz=schedule.tz,
                catch_up=schedule.catch_up,
                params=schedule.params,
                last_run=last / 1000 if last is not None else None,
                last_jid=schedule.jid(last) if last is not None else None,
                next_run=schedule.next_after(max(now_ms, last or 0)) / 1000,
                registered_at=seen_at,
            )
        )
    return out
