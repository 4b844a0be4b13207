"""Periodic jobs without Redis: validation at registration, tick arithmetic, what a round proposes."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import pytest

from fencekit import App, ConfigError
from fencekit.jobs.periodic import MAX_CATCH_UP_AGE, MAX_CATCH_UP_TICKS, Schedule, schedule_of
from fencekit.jobs.worker import inspect_worker


def worker(**attrs: Any) -> type:
    async def perform(cls: type, payload: dict[str, Any]) -> None:
        return None

    return type("Beat", (), {"queue": "q", "operation": "beat", "perform": classmethod(perform), **attrs})


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"cron": "61 * * * *"}, "attribute 'cron' is not a valid cron expression"),
        ({"cron": "* * *"}, "attribute 'cron' must be a cron expression of 5 fields"),
        ({"cron": "* * * * * * *"}, "attribute 'cron' must be a cron expression of 5 fields"),
        ({"cron": 5}, "attribute 'cron' must be a cron expression"),
        ({"cron": "* * * * *", "cron_tz": "Mars/Olympus"}, "attribute 'cron_tz' is not a known IANA"),
        ({"cron": "* * * * *", "every": 5}, "give either 'cron' or 'every', not both"),
        ({"every": 0}, "attribute 'every' must be a positive number"),
        ({"every": -1}, "attribute 'every' must be a positive number"),
        ({"every": timedelta(0)}, "attribute 'every' must be a positive number"),
        ({"every": True}, "attribute 'every' must be a positive number"),
        ({"every": 1, "cron_catch_up": "yes"}, "attribute 'cron_catch_up' must be a bool"),
        ({"every": 1, "cron_params": [1]}, "attribute 'cron_params' must be a dict"),
        ({"every": 1, "cron_params": {"x": object()}}, "attribute 'cron_params' must be plain JSON"),
        ({"cron_tz": "Europe/Paris"}, "attribute 'cron_tz' needs 'cron' or 'every'"),
    ],
)
def test_a_bad_schedule_is_a_config_error_naming_the_worker_and_the_attribute(
    attrs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="worker Beat: ") as caught:
        inspect_worker(worker(**attrs))
    assert message in str(caught.value)


def test_the_decorator_takes_the_periodic_options_and_names_a_bad_one() -> None:
    app = App()

    @app.task(every=timedelta(seconds=30), cron_params={"who": "all"})
    async def remind(who: str) -> None: ...

    assert remind.spec.periodic is not None
    assert remind.spec.periodic.every_ms == 30_000
    assert remind.spec.periodic.params == {"who": "all"}
    with pytest.raises(ConfigError, match=r"@app.task of .*nightly: option 'cron' is not a valid"):

        @app.task(cron="99 * * * *")
        async def nightly() -> None: ...


def test_a_periodic_task_function_with_required_parameters_needs_cron_params_that_bind() -> None:
    app = App()
    with pytest.raises(ConfigError, match="option 'cron_params' must bind every required parameter"):

        @app.task(every=60)
        async def report(customer: str) -> None: ...

    with pytest.raises(ConfigError, match="option 'cron_params' must bind"):

        @app.task(every=60, cron_params={"client": "x"})
        async def report2(customer: str) -> None: ...

    @app.task(every=60, cron_params={"customer": "acme"})
    async def report3(customer: str, *, verbose: bool = False) -> None: ...

    assert report3.spec.periodic is not None


def test_every_ticks_are_multiples_of_the_period_since_the_epoch() -> None:
    s = Schedule("q", "beat", None, 5000)
    assert s.next_after(12_345) == 15_000
    assert s.next_after(15_000) == 20_000
    assert s.latest(15_000) == 15_000
    assert s.latest(19_999) == 15_000
    assert s.jid(15_000) == "cron:beat:15000"


def test_a_cron_with_seconds_ticks_on_its_seconds() -> None:
    s = schedule_of("worker Beat", "q", "beat", {"cron": "*/2 * * * * *", "cron_tz": "Europe/Paris"}, None)
    assert s is not None
    start = ms(datetime(2026, 12, 2, 10, 0, 1, 500_000, tzinfo=timezone.utc))
    assert s.next_after(start) == start + 500
    assert s.next_after(start + 500) == start + 2500
    assert s.latest(start) == start - 1500


def test_cron_ticks_are_computed_in_the_schedules_time_zone_through_dst() -> None:
    paris = ZoneInfo("Europe/Paris")
    s = schedule_of("worker Beat", "q", "beat", {"cron": "0 9 * * *", "cron_tz": "Europe/Paris"}, None)
    assert s is not None
    winter = s.next_after(ms(datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)))
    assert datetime.fromtimestamp(winter / 1000, timezone.utc) == datetime(
        2026, 12, 3, 8, 0, tzinfo=timezone.utc
    )
    summer = s.next_after(ms(datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)))
    assert datetime.fromtimestamp(summer / 1000, timezone.utc) == datetime(
        2026, 7, 2, 7, 0, tzinfo=timezone.utc
    )
    # 02:30 does not exist in Paris on 2026-03-29 (02:00 -> 03:00): that day's run is at 03:00
    night = schedule_of("worker Beat", "q", "beat", {"cron": "30 2 * * *", "cron_tz": "Europe/Paris"}, None)
    assert night is not None
    spring = night.next_after(ms(datetime(2026, 3, 28, 12, 0, tzinfo=paris)))
    assert datetime.fromtimestamp(spring / 1000, paris) == datetime(2026, 3, 29, 3, 0, tzinfo=paris)
    # 02:30 happens twice on 2026-10-25 (03:00 -> 02:00): a fixed hour runs once, at the first
    autumn = night.next_after(ms(datetime(2026, 10, 24, 12, 0, tzinfo=paris)))
    assert autumn == ms(datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc))
    assert night.next_after(autumn) == ms(datetime(2026, 10, 26, 1, 30, tzinfo=timezone.utc))
    assert night.latest(ms(datetime(2026, 10, 25, 2, 0, tzinfo=timezone.utc))) == autumn
    # a wildcard hour keeps both: its ticks are half an hour apart in elapsed time
    half = schedule_of("worker Beat", "q", "beat", {"cron": "*/30 * * * *", "cron_tz": "Europe/Paris"}, None)
    assert half is not None
    start = ms(datetime(2026, 10, 24, 23, 50, tzinfo=timezone.utc))  # 01:50 in Paris, summer time
    got = [start]
    for _ in range(5):
        got.append(half.next_after(got[-1]))
    assert [b - a for a, b in itertools.pairwise(got[1:])] == [1_800_000] * 4


def test_catch_up_off_proposes_every_missed_tick_too_and_the_script_collapses_the_past_ones() -> None:
    """The campaign's case: the host ahead saw 282 s last and wakes at 285.282 s; 283 and 284 s
    are still ahead of the other hosts' clocks (and Redis's), so nobody else would enqueue them.
    Which of them are past is Redis's to say (``periodic_enqueue.lua``, test_periodic.py)."""
    s = Schedule("q", "beat", None, 1000)
    assert s.due(last_ms=282_000, floor_ms=0, now_ms=285_282) == [283_000, 284_000, 285_000]
    assert s.due(last_ms=15_000, floor_ms=0, now_ms=15_900) == []


def test_catch_up_on_proposes_every_missed_tick_up_to_the_bound() -> None:
    s = Schedule("q", "beat", None, 1000, catch_up=True)
    assert s.due(last_ms=10_000, floor_ms=0, now_ms=15_500) == [11_000, 12_000, 13_000, 14_000, 15_000]
    many = s.due(last_ms=0, floor_ms=0, now_ms=1_000_000)
    assert len(many) == MAX_CATCH_UP_TICKS
    assert many[-1] == 1_000_000
    hourly = Schedule("q", "beat", None, 3_600_000, catch_up=True)
    now = 400 * 3_600_000
    old = hourly.due(last_ms=0, floor_ms=0, now_ms=now)
    assert old[0] >= now - MAX_CATCH_UP_AGE
    assert len(old) == 25  # 24 h of hourly ticks, both ends included


def test_a_schedule_no_host_ran_starts_at_the_floor() -> None:
    s = Schedule("q", "beat", None, 1000, catch_up=True)
    assert s.due(last_ms=None, floor_ms=12_500, now_ms=15_200) == [13_000, 14_000, 15_000]
    assert Schedule("q", "beat", None, 1000).due(last_ms=None, floor_ms=15_100, now_ms=15_200) == []


def test_a_definition_round_trips_and_a_broken_one_is_left_out() -> None:
    s = Schedule("q", "beat", "*/5 * * * *", None, tz="Europe/Paris", catch_up=True, params={"a": 1})
    back = Schedule.from_definition(s.definition())
    assert back is not None
    assert (back.cron, back.tz, back.catch_up, back.params) == ("*/5 * * * *", "Europe/Paris", True, {"a": 1})
    assert Schedule.from_definition(b"{not json") is None
    assert (
        Schedule.from_definition(b'{"queue": "q", "operation": "x", "cron": "bad", "every_ms": null}') is None
    )


def test_a_concurrency_key_that_fails_on_the_cron_params_is_a_config_error() -> None:
    class Keyed:
        queue, operation = "q", "keyed"
        every = 5
        cron_params: ClassVar[dict[str, str]] = {}
        concurrency_key = staticmethod(lambda p: p["tenant"])
        max_concurrency = 1

        @classmethod
        async def perform(cls, payload: dict[str, str]) -> None: ...

    with pytest.raises(ConfigError, match="'concurrency_key' failed on the 'cron_params': KeyError"):
        inspect_worker(Keyed)
