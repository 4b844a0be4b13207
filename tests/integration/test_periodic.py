"""Periodic jobs on a real ``Server`` and a private Redis: catch-up both ways, a cron with
seconds in a time zone, and the listing (``client.schedules()``, ``SyncClient.schedules()``, /admin,
``fencekit schedules``).

Runs are recorded outside Redis (in this process's lists); enqueues are read
from Redis (each run's record ``P:{Q}:job:cron:<operation>:<tick>``, and the
schedule's newest tick ``P:{Q}:cron:<operation>``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import httpx
import pytest
import redis.asyncio
from tests.queue_helpers import eventually, new_server, running

from fencekit import Client, SyncClient
from fencekit._redis.keys import KeySpace
from fencekit.jobs import records
from fencekit.jobs.periodic import Schedule
from fencekit.services._ticker import Ticker
from fencekit.testing import RedisServer


class Recorder:
    """A class worker that appends each run's jid to ``runs`` (outside Redis)."""

    queue = "cron"
    runs: ClassVar[list[str]]

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        from fencekit import current_job

        cls.runs.append(current_job().jid)


def recorder(operation: str, **options: Any) -> type:
    return type(operation.title(), (Recorder,), {"operation": operation, "runs": [], **options})


def ticks_in_redis(r: Any, operation: str) -> list[int]:
    prefix = f"fencekit:{{cron}}:job:cron:{operation}:"
    return sorted(int(k.decode()[len(prefix) :]) for k in r.scan_iter(match=prefix + "*"))


def ticks_run(worker: Any) -> list[int]:
    return sorted(int(jid.rsplit(":", 1)[1]) for jid in worker.runs)


@pytest.mark.slow
async def test_a_server_stopped_for_several_ticks_runs_once_for_them_or_all_of_them_with_catch_up(
    private_redis: RedisServer,
) -> None:
    latest = recorder("latest", every=1)
    every = recorder("every", every=1, cron_catch_up=True)
    r = private_redis.client()
    async with running(new_server(private_redis.url(), latest, every)):
        await eventually(lambda: len(every.runs) >= 2 and len(latest.runs) >= 2, what="two runs each")
    last = {op: int(r.get(f"fencekit:{{cron}}:cron:{op}") or 0) for op in ("latest", "every")}
    assert last["latest"] == last["every"]
    stop_tick = last["latest"]
    await asyncio.sleep(max(0.0, (stop_tick + 5300) / 1000 - time.time()))  # ticks +1 .. +5 pass unserved
    restart_ms = int(time.time() * 1000)
    missed = list(range(stop_tick + 1000, restart_ms + 1, 1000))
    assert len(missed) >= 5
    async with running(new_server(private_redis.url(), latest, every)):
        await eventually(
            lambda: int(r.get("fencekit:{cron}:cron:every") or 0) >= missed[-1], what="caught up"
        )
        await eventually(lambda: int(r.get("fencekit:{cron}:cron:latest") or 0) >= missed[-1], what="ran")
        await eventually(lambda: set(missed) <= set(ticks_run(every)), what="every missed tick ran")
    # catch-up on: every missed tick enqueued and run, once
    assert set(missed) <= set(ticks_in_redis(r, "every"))
    assert len(ticks_run(every)) == len(set(ticks_run(every)))
    # catch-up off: one run for the missed ticks (the newest), not one per tick
    enqueued_missed = [t for t in ticks_in_redis(r, "latest") if t in missed]
    assert enqueued_missed == [missed[-1]], (missed, ticks_in_redis(r, "latest"))
    assert [t for t in ticks_run(latest) if t in missed] == [missed[-1]]
    assert len(ticks_run(latest)) == len(set(ticks_run(latest)))
    r.close()


async def test_a_cron_with_seconds_in_a_time_zone_runs_on_its_seconds_and_is_listed_with_its_next_run(
    private_redis: RedisServer,
) -> None:
    paris = ZoneInfo("Europe/Paris")
    even = recorder("even", cron="*/2 * * * * *", cron_tz="Europe/Paris")
    morning = recorder("morning", cron="0 9 * * *", cron_tz="Europe/Paris", cron_params={"who": "all"})
    server = new_server(private_redis.url(), even, morning)
    async with running(server):
        await eventually(lambda: len(even.runs) >= 2, timeout=10, what="two runs")
        async with Client(private_redis.url()) as client:
            listed = {s.operation: s for s in await client.schedules()}
            info = await client.job(even.runs[0])
            assert server.web is not None
            async with httpx.AsyncClient(base_url=server.web.url, timeout=10) as http:
                page = (await http.get("/admin")).text
        with SyncClient(private_redis.url()) as sync:
            listed_sync = {s.operation: s for s in sync.schedules()}
    ticks = ticks_run(even)
    assert all(t % 2000 == 0 for t in ticks), ticks
    assert all(b - a == 2000 for a, b in itertools.pairwise(ticks)), ticks
    assert info is not None
    assert (info.status, info.operation, info.queue) == ("done", "even", "cron")

    assert set(listed) == {"even", "morning"} == set(listed_sync)
    e, m = listed["even"], listed["morning"]
    assert (e.queue, e.cron, e.tz, e.catch_up) == ("cron", "*/2 * * * * *", "Europe/Paris", False)
    assert e.last_run is not None
    assert e.last_jid == f"cron:even:{round(e.last_run * 1000)}"
    assert e.next_run > e.last_run
    assert e.next_run % 2 == 0
    assert m.last_run is None
    assert m.params == {"who": "all"}
    next_local = datetime.fromtimestamp(m.next_run, paris)
    assert (next_local.hour, next_local.minute, next_local.second) == (9, 0, 0)  # 09:00 in Paris, not UTC
    assert 0 < m.next_run - time.time() <= 24 * 3600
    assert listed_sync["morning"].next_run == m.next_run
    assert m.registered_at is not None
    assert abs(m.registered_at - time.time()) < 30

    shown = subprocess.run(
        [sys.executable, "-m", "fencekit", "schedules", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FENCEKIT_REDIS_URL": private_redis.url()},
        stdin=subprocess.DEVNULL,
    )
    assert shown.returncode == 0, shown.stderr
    by_name = {s["name"]: s for s in json.loads(shown.stdout)["schedules"]}
    assert set(by_name) == {"cron:even", "cron:morning"}
    assert by_name["cron:morning"]["next_run"] == m.next_run
    assert by_name["cron:even"]["tz"] == "Europe/Paris"
    table = subprocess.run(
        [sys.executable, "-m", "fencekit", "schedules"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FENCEKIT_REDIS_URL": private_redis.url(), "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
    )
    assert table.returncode == 0, table.stderr
    assert "cron:morning" in table.stdout
    assert "0 9 * * *" in table.stdout

    assert "<section id=schedules>" in page
    assert "<td class=mono>cron:even</td><td class=mono>cron</td><td class=mono>even</td>" in page
    assert "<td class=mono>*/2 * * * * *</td><td>Europe/Paris</td>" in page
    assert "<td class=mono>0 9 * * *</td><td>Europe/Paris</td><td>never</td>" in page
    next_utc = datetime.fromtimestamp(m.next_run, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"<td>{next_utc}</td>" in page


async def test_hosts_with_skewed_clocks_and_a_paused_host_enqueue_each_tick_once(
    private_redis: RedisServer,
) -> None:
    """Two tickers on one Redis, driven by hand-set clocks: B 0.4 s behind A, then A "paused"
    (its memory stale) while B runs on. The script refuses every tick not newer than the last."""
    every = Schedule("cron", "all", None, 1000, catch_up=True)
    newest = Schedule("cron", "one", None, 1000)
    now = [100.5]
    r = private_redis.client()
    client = redis.asyncio.Redis.from_url(private_redis.url())
    logger = logging.getLogger("test.periodic")

    def ticker(skew: float) -> Ticker:
        return Ticker(
            client, KeySpace(), [every, newest], logger, max_payload=2**20, clock=lambda: now[0] - skew
        )

    a, b = ticker(0.0), ticker(0.4)  # their floors: 100.5 s and 100.1 s
    assert a.floor_ms == 100_500
    try:
        assert await a.round() == 0  # the tick 100 s is before either host started
        now[0] = 101.5
        assert await a.round() == 2  # 101 s, for both schedules
        assert await b.round() == 0  # its clock says 101.1 s: 101 s is done
        now[0] = 104.2
        assert await b.round() == 3  # at 103.8 s: "all" 102, 103; "one" 103 only
        assert await a.round() == 2  # at 104.2 s: 104 s for both
        now[0] = 110.2  # A was paused since 104.2 s (stale memory); B runs first
        assert await b.round() == 6  # at 109.8 s: "all" 105..109; "one" 109
        assert await a.round() == 2  # 110 s for both; 105..109 refused by the script
    finally:
        await client.aclose()
    assert ticks_in_redis(r, "all") == list(range(101_000, 111_000, 1000))
    assert ticks_in_redis(r, "one") == [101_000, 103_000, 104_000, 109_000, 110_000]
    assert int(r.hget("fencekit:{cron}:stats", "enqueued") or 0) == 10 + 5
    assert int(r.get("fencekit:{cron}:cron:all") or 0) == 110_000
    r.close()


async def test_a_late_round_of_the_host_whose_clock_is_ahead_skips_no_tick(
    private_redis: RedisServer,
) -> None:
    """Two tickers driven by hand-set clocks, A's 3 s ahead of B's (B's is Redis's), catch-up off.

    A starts at +3.5 s on its clock, +0.5 s on Redis's: its first round enqueues +1 to
    +3 s (before: its floor was its own clock's +3.5 s, so +1 to +3 s were enqueued
    by nobody). A enqueues each tick first; its round at +4.2 s enqueues +4 s. Then A is late
    (paused, or a loaded machine): B, at +1.2 s, proposes +1 s, refused (not newer
    than +4 s). A resumes at +7.3 s having seen +4 s last: it proposes +5, +6 and
    +7 s, and since all three are still ahead of Redis's clock the script enqueues
    each (before: A proposed only +7 s, and +5, +6 s were enqueued by nobody,
    B reaching them when they were older than the stored tick). B's later
    rounds are refused: no tick twice."""
    newest = Schedule("cron", "skew", None, 1000)
    # Redis's clock must stay in this second until A's first round reads it (A's floor): from
    # late in a second, a loaded CI crossed into the next one first (+1 s then below the floor)
    await asyncio.sleep(1.01 - time.time() % 1)
    base = float(int(time.time()))
    clock_a, clock_b = [base + 3.5], [base + 0.5]
    r = private_redis.client()
    client = redis.asyncio.Redis.from_url(private_redis.url())
    logger = logging.getLogger("test.periodic")
    a = Ticker(client, KeySpace(), [newest], logger, max_payload=2**20, clock=lambda: clock_a[0])
    b = Ticker(client, KeySpace(), [newest], logger, max_payload=2**20, clock=lambda: clock_b[0])
    s = int(base) * 1000
    try:
        assert await a.round() == 3  # +1, +2, +3 s: after its start on Redis's clock (its floor)
        assert a.floor_ms < s + 1000
        clock_a[0] = base + 4.2
        assert await a.round() == 1  # +4 s, early by Redis's clock
        clock_b[0] = base + 1.2
        assert await b.round() == 0  # +1 s is older than +4 s
        clock_a[0] = base + 7.3
        assert await a.round() == 3  # +5, +6, +7 s: none of them past on Redis's clock
        for now in (5.1, 6.1, 7.1):
            clock_b[0] = base + now
            assert await b.round() == 0
    finally:
        await client.aclose()
    assert ticks_in_redis(r, "skew") == [s + n * 1000 for n in range(1, 8)]
    r.close()


async def test_a_burst_run_drains_what_is_queued_and_starts_no_periodic_run(
    private_redis: RedisServer,
) -> None:
    beat = recorder("beat", every=0.05)
    server = new_server(private_redis.url(), beat, burst=True)
    await asyncio.wait_for(server.run(), 30)
    r = private_redis.client()
    assert beat.runs == []
    assert list(r.scan_iter(match="fencekit:{cron}:cron:*")) == []
    r.close()


async def test_a_periodic_run_carries_its_worker_s_priority_and_concurrency_key(
    private_redis: RedisServer,
) -> None:
    """Each run is enqueued as the worker's other tasks are: on its priority's list, with its key."""
    keyed = recorder(
        "keyed",
        every=1,
        cron_params={"tenant": "t-7"},
        priority=3,
        concurrency_key=lambda p: p["tenant"],
        max_concurrency=1,
    )
    r = private_redis.client()
    async with running(new_server(private_redis.url(), keyed)):
        await eventually(lambda: len(keyed.runs) >= 1, timeout=10, what="a run")
    fields = r.hgetall(f"fencekit:{{cron}}:job:{keyed.runs[0]}")
    record = records.record_envelope({k.decode(): v for k, v in fields.items()})
    assert record is not None
    envelope = json.loads(record)
    assert envelope["priority"] == 3
    assert envelope["ckey"] == "t-7"
    r.close()
