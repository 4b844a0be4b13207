"""Periodic jobs: a worker's schedule, its validation, and which ticks are due. No I/O.

A worker declares ``cron = "*/5 * * * *"`` (five fields, or six with seconds
first) or ``every = 30`` (seconds or a ``timedelta``), with ``cron_params``
(the params of each run), ``cron_tz`` (an IANA zone, default ``"UTC"``) and
``cron_catch_up`` (default False). :func:`schedule_of` validates them once,
at registration, into a :class:`Schedule`; a bad value is a
:class:`~fencekit.errors.ConfigError` naming the worker and the attribute.

A *tick* is a point in time in Unix milliseconds. ``every`` ticks are the
multiples of the period since the Unix epoch, so every host computes the
same ticks without talking to the others; ``cron`` ticks are those of the
expression in ``cron_tz``, computed by croniter (pallets-eco; it reads the
seconds field and follows the zone's offsets through DST with ``zoneinfo``;
``docs/guides/periodic.md`` says why it and not cronsim, which has no seconds field).

Which ticks a round enqueues (:meth:`Schedule.due`); *whether* each is
enqueued is decided in Redis (``periodic_enqueue.lua``: only ticks newer
than the last one enqueued by any host), so this only proposes every tick
after the last one enqueued, at most :data:`MAX_CATCH_UP_TICKS` (the newest
ones) and none older than :data:`MAX_CATCH_UP_AGE`. With
``cron_catch_up=False`` the script then collapses the ticks already past on
*Redis's* clock into the newest of them (after downtime, one run for the
missed ticks, not one per tick), and enqueues every tick still ahead of it:
those a host whose clock is ahead proposes early. Collapsing on the host's
own clock would skip them: the host ahead is the one that enqueues each tick
first, so a round of it that comes late proposes ticks no other host will
reach before they are older than the newest stored one.

A schedule's runs are ordinary tasks whose jid is ``cron:<operation>:<tick ms>``
(:meth:`Schedule.jid`), so ``client.job(jid)`` finds each run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from croniter import croniter

from fencekit._redis.keys import jid_error
from fencekit.errors import ConfigError

__all__ = [
    "CRON_KEEP_RESULT",
    "MAX_CATCH_UP_AGE",
    "MAX_CATCH_UP_TICKS",
    "Schedule",
    "schedule_of",
]

MAX_CATCH_UP_TICKS = 100
"""With ``cron_catch_up=True``, the most ticks one round enqueues after downtime (the newest ones)."""

MAX_CATCH_UP_AGE = 24 * 3600 * 1000
"""With ``cron_catch_up=True``, ticks older than this (ms) are not enqueued any more."""

CRON_KEEP_RESULT = 3600.0
"""Seconds a run's record is kept when its worker sets no ``keep_result``: a run is findable by jid."""


def _cron_fields(expression: str) -> int:
    return len(expression.split())


@dataclass(frozen=True, slots=True)
class Schedule:
    """One worker's schedule (see the module docstring); built by :func:`schedule_of`."""

    queue: str
    operation: str
    cron: str | None
    every_ms: int | None
    tz: str = "UTC"
    catch_up: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    keep_ms: int = round(CRON_KEEP_RESULT * 1000)
    priority: int = 0  # the worker's: each run is claimed as any task of that priority
    concurrency_key: str | None = None  # the worker's key of ``params``: each run takes a slot of it

    @property
    def name(self) -> str:
        """``<queue>:<operation>``: how the schedule is listed."""
        return f"{self.queue}:{self.operation}"

    def jid(self, tick_ms: int) -> str:
        """The jid of the run of ``tick_ms``: one per schedule and tick."""
        return f"cron:{self.operation}:{tick_ms}"

    def _zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def _iter(self, at_ms: int) -> croniter:
        assert self.cron is not None
        start = datetime.fromtimestamp(at_ms / 1000, self._zone())
        return croniter(self.cron, start, second_at_beginning=_cron_fields(self.cron) == 6)

    def next_after(self, ms: int) -> int:
        """The first tick strictly after ``ms``."""
        if self.every_ms is not None:
            return (ms // self.every_ms + 1) * self.every_ms
        tick = round(float(self._iter(ms).get_next(float)) * 1000)
        return self.next_after(tick) if self._repeated(tick) else tick

    def latest(self, ms: int) -> int:
        """The newest tick at or before ``ms``."""
        if self.every_ms is not None:
            return ms - ms % self.every_ms
        tick = round(float(self._iter(ms + 1).get_prev(float)) * 1000)
        return self.latest(tick - 1) if self._repeated(tick) else tick

    def _repeated(self, tick_ms: int) -> bool:
        """True for the second occurrence of a local time the clock went back over (DST ends),
        when the hour field is fixed: such a job runs once that day, as Vixie cron runs it.
        (croniter returns both occurrences; a wildcard hour keeps both, they are an hour apart.)"""
        assert self.cron is not None
        hour = self.cron.split()[-4]
        local = datetime.fromtimestamp(tick_ms / 1000, self._zone())
        return local.fold == 1 and not hour.startswith("*")

    def due(self, last_ms: int | None, floor_ms: int, now_ms: int) -> list[int]:
        """The ticks a round at ``now_ms`` proposes, oldest first.

        ``last_ms``: the newest tick enqueued by any host, as last seen (None:
        none known, then no tick before ``floor_ms`` is proposed).
        """
        lower = last_ms if last_ms is not None else floor_ms - 1
        newest = self.latest(now_ms)
        if newest <= lower:
            return []
        lower = max(lower, now_ms - MAX_CATCH_UP_AGE - 1)
        ticks = [newest]
        while len(ticks) < MAX_CATCH_UP_TICKS:
            before = self.latest(ticks[-1] - 1)
            if before <= lower:
                break
            ticks.append(before)
        ticks.reverse()
        return ticks

    def definition(self, seen_ms: int | None = None) -> bytes:
        """The JSON a running process registers for ``client.schedules()`` and /admin.

        ``seen_ms``: when it was written (a process that runs the schedule
        writes it again every minute, so an old one means none runs it now).
        """
        return orjson.dumps(
            {
                "seen": seen_ms,
                "queue": self.queue,
                "operation": self.operation,
                "cron": self.cron,
                "every_ms": self.every_ms,
                "tz": self.tz,
                "catch_up": self.catch_up,
                "params": self.params,
            }
        )

    @classmethod
    def from_definition(cls, raw: bytes | str) -> Schedule | None:
        """A schedule read back from :meth:`definition` (None when it does not parse)."""
        try:
            d = orjson.loads(raw)
            schedule = cls(
                queue=str(d["queue"]),
                operation=str(d["operation"]),
                cron=d.get("cron"),
                every_ms=d.get("every_ms"),
                tz=str(d.get("tz", "UTC")),
                catch_up=bool(d.get("catch_up", False)),
                params=dict(d.get("params") or {}),
            )
            if (schedule.cron is None) == (schedule.every_ms is None):
                return None
            schedule.next_after(0)  # a definition that no longer computes is left out
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, ZoneInfoNotFoundError):
            return None
        return schedule


def _every_ms(every: object, label: str) -> int:
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 < seconds < 1e9:
        raise ConfigError(
            f"{label}: attribute 'every' must be a positive number of seconds or a timedelta, got {every!r}"
        )
    ms = round(seconds * 1000)
    if ms < 1:
        raise ConfigError(f"{label}: attribute 'every' must be at least 1 ms, got {every!r}")
    return ms


def _check_cron(cron: object, label: str) -> str:
    if not isinstance(cron, str) or _cron_fields(cron) not in (5, 6):
        raise ConfigError(
            f"{label}: attribute 'cron' must be a cron expression of 5 fields "
            f"(or 6, seconds first), got {cron!r}"
        )
    try:
        it = croniter(cron, datetime.now(timezone.utc), second_at_beginning=_cron_fields(cron) == 6)
        it.get_next(float)
    except (ValueError, KeyError, TypeError) as exc:  # croniter's errors are ValueErrors
        raise ConfigError(
            f"{label}: attribute 'cron' is not a valid cron expression {cron!r}: {exc}"
        ) from None
    return cron


_UNSET = (("cron_params", None), ("cron_tz", "UTC"), ("cron_catch_up", False))


def schedule_of(
    label: str, queue: str, operation: str, options: Mapping[str, Any], keep_ms: int | None
) -> Schedule | None:
    """The worker's :class:`Schedule` from its options (None: neither ``cron`` nor ``every``).

    ``label`` begins each ConfigError (``worker <name>``); ``keep_ms`` is the
    worker's own record retention, if it sets one.
    """
    cron, every = options.get("cron"), options.get("every")
    if cron is None and every is None:
        for name, default in _UNSET:
            if options.get(name, default) != default:
                raise ConfigError(f"{label}: attribute {name!r} needs 'cron' or 'every'")
        return None
    if cron is not None and every is not None:
        raise ConfigError(f"{label}: attribute 'every': give either 'cron' or 'every', not both")
    if (problem := jid_error(f"cron:{operation}:0", "a run's jid")) is not None:
        raise ConfigError(f"{label}: attribute 'operation' cannot name periodic runs: {problem}")
    tz = options.get("cron_tz", "UTC")
    if not isinstance(tz, str) or not tz:
        raise ConfigError(f"{label}: attribute 'cron_tz' must be an IANA time zone name, got {tz!r}")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{label}: attribute 'cron_tz' is not a known IANA time zone: {tz!r}") from None
    catch_up = options.get("cron_catch_up", False)
    if type(catch_up) is not bool:
        raise ConfigError(f"{label}: attribute 'cron_catch_up' must be a bool, got {catch_up!r}")
    params = options.get("cron_params")
    if params is None:
        params = {}
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise ConfigError(f"{label}: attribute 'cron_params' must be a dict with str keys, got {params!r}")
    try:
        orjson.dumps(params)
    except TypeError as exc:
        raise ConfigError(f"{label}: attribute 'cron_params' must be plain JSON: {exc}") from None
    return Schedule(
        queue=queue,
        operation=operation,
        cron=_check_cron(cron, label) if cron is not None else None,
        every_ms=_every_ms(every, label) if every is not None else None,
        tz=tz,
        catch_up=catch_up,
        params=dict(params),
        keep_ms=keep_ms if keep_ms else round(CRON_KEEP_RESULT * 1000),
    )
