"""Per-queue history on a real Redis: what each minute and hour booked, retention, bytes, many hosts.

The buckets are read straight from Redis and split by hand, following the
stored form documented in ``history_sample.lua`` (22 integers: processed
failed retried fenced_out dead depth dur_sum_us and 15 duration counts), so
the tests check what is stored, not what the reader makes of it.

Two kinds of test: the real sampling loop of running ``Server`` s (every job
booked once, durations included, however many hosts sample), and samples
driven at chosen times (``HistorySampler.sample(now_ms=...)``, the call the
loop makes with the Redis clock) to cross minute boundaries and to age
buckets out of the window without waiting days.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio
from tests.fault_helpers import PoolRunner, http_body, runs_from_files, write_app
from tests.queue_helpers import eventually, new_server, qkey, running, stats, worker

from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.errors import StoreError
from fencekit.jobs.histogram import DEFAULT_BUCKETS, DurationHistogram, QueueDurations
from fencekit.jobs.history import HOURS, MINUTES, read_histories, read_history
from fencekit.runtime.server import Server
from fencekit.services._sampler import INTERVAL as HISTORY_INTERVAL
from fencekit.services._sampler import HistorySampler
from fencekit.testing import RedisServer, wait_until

MINUTE_MS = 60_000
HOUR_MS = 3_600_000


def buckets(r: redis.Redis, queue: str, tier: str = "m") -> dict[int, list[int]]:
    """bucket number -> its 22 integers, as stored."""
    raw = r.hgetall(qkey(queue, f"history:{tier}"))
    return {int(k): [int(v) for v in value.split()] for k, value in raw.items()}


def total(r: redis.Redis, queue: str, index: int, tier: str = "m") -> int:
    return sum(values[index] for values in buckets(r, queue, tier).values())


def timed(r: redis.Redis, queue: str, tier: str = "m") -> int:
    """Jobs whose duration the buckets hold (the 15 histogram counts)."""
    return sum(sum(values[7:]) for values in buckets(r, queue, tier).values())


def enqueue(url: str, tasks: list[Task]) -> None:
    async def go() -> None:
        async with Client(url) as client:
            await client.enqueue_many(tasks)

    asyncio.run(go())


def stop_history_loop(server: Server) -> HistorySampler:
    """Stop the server's own sampling loop: the test samples at the times it chooses instead."""
    for task in server.services._tasks:
        if task.get_name() == "fencekit-history":
            task.cancel()
    return server.services.history


def sampler(url: str, queue: str, durations: Any = QueueDurations) -> tuple[HistorySampler, Any]:
    client = redis.asyncio.Redis.from_url(url)
    return HistorySampler(client, KeySpace(), [queue], logging.getLogger("test.history"), durations), client


async def test_each_minute_holds_what_finished_in_it_across_two_minute_boundaries(
    redis_url: str, r: redis.Redis
) -> None:
    queue = "hist-minutes"

    async def perform(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.03)  # every duration lands in the <= 50 ms bucket
        if payload["fail"]:
            raise RuntimeError("boom")

    server = new_server(redis_url, worker(queue, "job", perform, retry=False))
    # the Redis clock's current minute, and the three before it: the batches are booked there
    now_ms = int(r.time()[0]) * 1000
    first = now_ms // MINUTE_MS - 3
    async with running(server), Client(redis_url) as client:
        history = stop_history_loop(server)
        await history.sample(now_ms=first * MINUTE_MS - 50)  # baseline: books nothing
        batches = [(30, 0), (50, 4), (70, 1)]  # (succeed, fail) per minute
        for i, (ok, bad) in enumerate(batches):
            tasks = [Task(queue, "job", {"fail": False}) for _ in range(ok)]
            tasks += [Task(queue, "job", {"fail": True}) for _ in range(bad)]
            await client.enqueue_many(tasks)
            done = sum(a + b for a, b in batches[: i + 1])
            await eventually(
                lambda done=done: (
                    server.consumer is not None
                    and server.consumer.stats.durations.count == done
                    and int(r.hget(qkey(queue, "stats"), "processed") or 0)
                    + int(r.hget(qkey(queue, "stats"), "failed") or 0)
                    == done
                ),
                what=f"batch {i} settled",
            )
            # just before the end of minute first + i, as the loop books a sample taken after the mark
            await history.sample(now_ms=(first + i + 1) * MINUTE_MS - 50)

    stored = buckets(r, queue)
    assert sorted(stored) == [first, first + 1, first + 2]
    for i, (ok, bad) in enumerate(batches):
        values = stored[first + i]
        assert values[0:5] == [ok, bad, 0, 0, 0]  # processed failed retried fenced_out dead
        assert values[6] >= (ok + bad) * 30_000  # durations' sum, µs
        counts = values[7:]
        assert sum(counts) == ok + bad
        # a 30 ms job is booked at 30 ms or more (a loaded machine may book it later, never sooner)
        assert sum(counts[: DEFAULT_BUCKETS.index(0.05)]) == 0
    hours = buckets(r, queue, "h")
    assert sum(v[0] for v in hours.values()) == 150
    assert sum(v[1] for v in hours.values()) == 5
    assert all(first * 60 // 3600 <= h <= (first + 2) * 60 // 3600 for h in hours)

    # the reader sums what is stored: the last hour of this queue
    reader = redis.asyncio.Redis.from_url(redis_url)  # the server's own client closed with it
    try:
        read = await read_history(reader, KeySpace(), [queue], "1h")
    finally:
        await reader.aclose()
    assert [b.processed for b in read.buckets] == [30, 50, 70]
    assert [b.failed for b in read.buckets] == [0, 4, 1]
    assert [b.p50 for b in read.buckets] == [0.05, 0.05, 0.05]


async def caught_up(*servers: Server) -> None:
    """Wait until every host's sampling loop has completed two more samples than it had now.

    The loop counts a sample once its reply is read, so the one whose script has just booked
    may be counted after this call: the second sample starts after every booking seen before.
    A sampler that books an increment (or a duration) again books it there.
    """
    marks = [server.services.history.samples + 2 for server in servers]
    await eventually(
        lambda: all(s.services.history.samples >= m for s, m in zip(servers, marks)),
        3 * HISTORY_INTERVAL + 5,
        "two more samples of every host",
    )


def assert_booked_once(r: redis.Redis, queue: str, jobs: int) -> None:
    """Both tiers hold exactly ``jobs`` processed and ``jobs`` timed, summed over all their buckets."""
    assert stats(r, queue)["processed"] == jobs  # what there is to book
    for tier in ("m", "h"):
        stored = buckets(r, queue, tier)
        assert sum(values[0] for values in stored.values()) == jobs, (tier, stored)
        assert sum(sum(values[7:]) for values in stored.values()) == jobs, (tier, stored)
        assert all(values[1:5] == [0, 0, 0, 0] for values in stored.values()), (tier, stored)


async def one_ms(payload: dict[str, Any]) -> None:
    await asyncio.sleep(0.001)


async def run_and_book(server: Server, client: Client, r: redis.Redis, queue: str, jobs: int) -> None:
    """Enqueue ``jobs`` on ``queue`` of the running ``server``; all acknowledged, then booked once."""
    await client.enqueue_many(Task(queue, "job", {}) for _ in range(jobs))
    await eventually(lambda: stats(r, queue)["processed"] == jobs, 15, "all acknowledged")
    # the loop samples every 5 s on the host clock's grid; a double count overshoots, hence >=
    await eventually(lambda: total(r, queue, 0) >= jobs and timed(r, queue) >= jobs, 15, "booked")
    await caught_up(server)
    assert_booked_once(r, queue, jobs)


async def test_a_running_server_books_every_job_once_with_its_duration(
    redis_url: str, r: redis.Redis
) -> None:
    queue = "hist-live"
    server = new_server(redis_url, worker(queue, "job", one_ms))
    async with running(server), Client(redis_url) as client:
        await run_and_book(server, client, r, queue, 120)
        for window in ("1h", "90d"):
            read = await client.queue(queue).history(window)  # the public reader
            assert read.totals().processed == 120
            assert read.totals().durations is not None
            assert read.totals().durations.count == 120
    assert_booked_once(r, queue, 120)


async def test_the_first_sample_is_taken_before_any_job_can_end(redis_url: str, r: redis.Redis) -> None:
    """A new queue's jobs that end before the loop's first round are booked too.

    A queue's first sample has nothing to compare the counters with and books nothing; a pool
    whose children ran 4 jobs before it booked 296 of 300 (CI). So the services take it when
    they open: the startup hooks, which run after that and before the consumer starts, see it.
    """
    queue = "hist-first"
    baselines: list[dict[bytes, bytes]] = []
    server = new_server(redis_url, worker(queue, "job", one_ms))

    @server.on_startup
    async def look(client: Client) -> None:
        baselines.append(r.hgetall(qkey(queue, "history:last")))

    async with running(server), Client(redis_url) as client:
        await run_and_book(server, client, r, queue, 50)
    assert [seen.get(b"processed") for seen in baselines] == [b"0"], baselines  # seen by the hook


async def test_two_hosts_sampling_one_queue_book_each_job_once(redis_url: str, r: redis.Redis) -> None:
    queue = "hist-two"

    async def perform(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.002)

    servers = [new_server(redis_url, worker(queue, "job", perform)) for _ in range(2)]
    async with running(servers[0]), running(servers[1]), Client(redis_url) as client:
        await client.enqueue_many(Task(queue, "job", {}) for _ in range(400))
        await eventually(lambda: stats(r, queue)["processed"] == 400, 15, "all acknowledged")
        await eventually(lambda: total(r, queue, 0) >= 400 and timed(r, queue) >= 400, 15, "booked")
        ran = [s.consumer.stats.durations.count for s in servers if s.consumer is not None]
        assert sum(ran) == 400, ran
        assert all(ran), ran  # both hosts ran jobs, and both sample
        await caught_up(*servers)
        # each increment booked by exactly one of the two hosts, each duration by the host that saw it
        assert_booked_once(r, queue, 400)
    assert_booked_once(r, queue, 400)


async def test_old_buckets_leave_the_window_and_a_long_gap_empties_it(redis_url: str, r: redis.Redis) -> None:
    queue = "hist-retention"
    history, client = sampler(redis_url, queue)
    try:
        start = 29_000_000  # a minute number (2025): any will do, the script books at the time given
        await history.sample(now_ms=start * MINUTE_MS)
        for i in range(3):
            r.hincrby(qkey(queue, "stats"), "processed", 10 + i)
            await history.sample(now_ms=(start + i) * MINUTE_MS + 1)
        assert sorted(buckets(r, queue)) == [start, start + 1, start + 2]

        # 48 h later, one minute past the window of start + 1: start and start + 1 are dropped
        r.hincrby(qkey(queue, "stats"), "processed", 5)
        await history.sample(now_ms=(start + 1 + MINUTES.keep) * MINUTE_MS)
        assert sorted(buckets(r, queue)) == [start + 2, start + 1 + MINUTES.keep]
        assert buckets(r, queue)[start + 2][0] == 12
        hours = buckets(r, queue, "h")  # the hour tier still holds both hours
        assert sum(v[0] for v in hours.values()) == 10 + 11 + 12 + 5
        assert len(hours) == 2

        # past the hour tier's window (90 days) with nothing in between: both tiers start over
        r.hincrby(qkey(queue, "stats"), "processed", 7)
        later = (start + 1 + MINUTES.keep) * MINUTE_MS + (HOURS.keep + 1) * HOUR_MS
        await history.sample(now_ms=later)
        assert {k: v[0] for k, v in buckets(r, queue).items()} == {later // MINUTE_MS: 7}
        assert {k: v[0] for k, v in buckets(r, queue, "h").items()} == {later // HOUR_MS: 7}

        # a sample older than the window (a host clock far behind) books nothing and drops nothing
        r.hincrby(qkey(queue, "stats"), "processed", 3)
        await history.sample(now_ms=start * MINUTE_MS)
        assert {k: v[0] for k, v in buckets(r, queue).items()} == {later // MINUTE_MS: 7}
    finally:
        await client.aclose()


async def test_a_full_history_is_bounded_and_its_bytes_are_as_documented(
    redis_url: str, r: redis.Redis
) -> None:
    queue = "hist-bytes"
    counts = [0] * (len(DEFAULT_BUCKETS) + 1)

    def durations() -> QueueDurations:  # a busy host: 12k jobs a sample over four buckets
        for bucket in (1, 2, 4, 6):
            counts[bucket] += 3000
        return QueueDurations({queue: DurationHistogram.from_counts(counts, sum(counts) * 0.05)})

    history, client = sampler(redis_url, queue, durations)
    try:
        start = 29_000_000
        await history.sample(now_ms=start * MINUTE_MS)
        # every minute of the 48 h window busy, then every hour of the 90 days
        for minute in range(start, start + MINUTES.keep + 100):
            r.hincrby(qkey(queue, "stats"), "processed", 12_345)
            await history.sample(now_ms=minute * MINUTE_MS)
        hour0 = (start + MINUTES.keep + 100) * MINUTE_MS // HOUR_MS
        for hour in range(hour0, hour0 + HOURS.keep + 10):
            r.hincrby(qkey(queue, "stats"), "processed", 12_345)
            await history.sample(now_ms=hour * HOUR_MS)
        assert r.hlen(qkey(queue, "history:m")) <= MINUTES.keep
        assert r.hlen(qkey(queue, "history:h")) == HOURS.keep
        await history.sample(now_ms=(hour0 + HOURS.keep + 9) * HOUR_MS)  # refill the minute tier's last hour
        size = sum(
            int(r.memory_usage(qkey(queue, part), samples=0) or 0)
            for part in ("history:m", "history:h", "history:last")
        )
        print(f"history bytes, one queue, full windows: {size}")
        # jobs/history.py and the README state "about 0.3 MB" for a queue busy through both windows
        assert 200_000 < size < 450_000
    finally:
        await client.aclose()


async def test_a_reset_counter_and_an_unreadable_bucket_lose_nothing_after_them(
    redis_url: str, r: redis.Redis
) -> None:
    queue = "hist-odd"
    history, client = sampler(redis_url, queue)
    try:
        minute = int(r.time()[0]) // 60
        await history.sample(now_ms=minute * MINUTE_MS)
        r.hincrby(qkey(queue, "stats"), "processed", 100)
        await history.sample(now_ms=minute * MINUTE_MS + 1)
        r.delete(qkey(queue, "stats"))  # the counters start over (as after a lost Redis)
        r.hincrby(qkey(queue, "stats"), "processed", 3)
        await history.sample(now_ms=minute * MINUTE_MS + 2)
        assert buckets(r, queue)[minute][0] == 103

        r.hset(qkey(queue, "history:m"), str(minute - 1), "not a bucket")
        read = (await read_histories(client, KeySpace(), [queue], "1h"))[queue]
        assert read.unreadable == 1
        assert [b.processed for b in read.buckets] == [103]
        r.hincrby(qkey(queue, "stats"), "processed", 1)
        await history.sample(now_ms=(minute - 1) * MINUTE_MS)  # booking into it rewrites it whole
        assert buckets(r, queue)[minute - 1][0] == 1
    finally:
        await client.aclose()


async def test_a_sample_that_fails_books_nothing_and_the_next_one_books_what_it_missed(
    redis_url: str, r: redis.Redis
) -> None:
    queue = "hist-outage"
    seen = QueueDurations()
    history, client = sampler(redis_url, queue, lambda: seen)
    dead = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    try:
        minute = int(r.time()[0]) // 60
        await history.sample(now_ms=minute * MINUTE_MS)
        seen.observe(queue, 0.002)
        r.hincrby(qkey(queue, "stats"), "processed", 1)
        history.client = dead  # Redis unreachable for this sample
        with pytest.raises(StoreError):
            await history.sample(now_ms=minute * MINUTE_MS + 1)
        seen.observe(queue, 0.002)
        r.hincrby(qkey(queue, "stats"), "processed", 1)
        history.client = client
        await history.sample(now_ms=minute * MINUTE_MS + 2)
        assert buckets(r, queue)[minute][0] == 2
        assert timed(r, queue) == 2
        await history.sample(now_ms=minute * MINUTE_MS + 3)
        assert buckets(r, queue)[minute][0] == 2
        assert timed(r, queue) == 2
    finally:
        await client.aclose()
        await dead.aclose()


def booked(r: redis.Redis, pool: PoolRunner, app_dir: Path, queue: str, jobs: int) -> None:
    """Wait until ``queue``'s buckets hold ``jobs`` processed and timed; else say what they hold and why."""
    try:
        wait_until(lambda: total(r, queue, 0) == jobs and timed(r, queue) == jobs, 30, what=f"{queue} booked")
    except TimeoutError:
        reruns = {jid: n for jid, n in runs_from_files(app_dir / "runs").items() if n > 1}
        lines = [line for line in pool.output().splitlines() if "child" in line or "ERROR" in line]
        raise AssertionError(
            f"{queue}: booked processed {total(r, queue, 0)}, timed {timed(r, queue)} (want {jobs} each); "
            f"stats {stats(r, queue)}; jobs run more than once {reruns}; pool: {lines[-20:]}"
        ) from None


def test_a_pool_books_its_childrens_jobs_with_their_durations_once(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    """Real processes: two children publish per-queue durations on the board, the supervisor books them."""
    url = private_redis.url()
    write_app(tmp_path)
    pool = PoolRunner(tmp_path, url, "--procs", "2", "--concurrency", "8")
    r = private_redis.client()
    try:
        pool.wait_ready()
        enqueue(url, [Task("work", "do", {"sleep": 0.002, "incr": False}) for _ in range(300)])
        enqueue(url, [Task("hold", "hold", {"seconds": 0.02}) for _ in range(20)])
        booked(r, pool, tmp_path, "work", 300)
        booked(r, pool, tmp_path, "hold", 20)
        counts = [sum(values[7:]) for values in buckets(r, "hold").values()]
        assert sum(counts) == 20
        hold_histogram = [sum(c) for c in zip(*(values[7:] for values in buckets(r, "hold").values()))]
        assert sum(hold_histogram[: DEFAULT_BUCKETS.index(0.025)]) == 0  # 20 ms jobs: none under 10 ms
        time.sleep(HISTORY_INTERVAL + 1)  # another sample: nothing booked twice
        assert total(r, "work", 0) == 300
        assert timed(r, "work") == 300
        body = http_body(f"http://127.0.0.1:{pool.web_port}/admin/api/history?queue=work")
        assert sum(b["processed"] for b in orjson.loads(body)["buckets"]) == 300
    finally:
        r.close()
        assert pool.stop() == 0


@pytest.mark.slow
def test_the_history_script_runs_on_redis_cluster(tmp_path: Path, server_binary: str) -> None:
    """Each queue's history stays in its queue's slot: samples of three queues on different masters."""
    from fencekit._redis import scripts
    from fencekit._redis.run import run
    from fencekit.testing.cluster import LocalCluster

    keys = KeySpace()
    with LocalCluster(tmp_path / "cluster", binary=server_binary) as cluster:
        client = cluster.client()
        try:
            nodes = set()
            for n, queue in enumerate(("emails", "reports", "sms"), start=1):
                qk = keys.queue(queue)
                nodes.add(client.get_node_from_key(qk.history_minutes).name)

                def sample(at_ms: int, qk: Any = qk) -> Any:
                    return run(
                        client,
                        scripts.history_sample(
                            stats=qk.stats, pending=qk.pending, last=qk.history_last,
                            minutes=qk.history_minutes, hours=qk.history_hours, now_ms=at_ms, back_ms=0,
                            minute_tier=(MINUTES.step, MINUTES.keep), hour_tier=(HOURS.step, HOURS.keep),
                            durations=" ".join(["1500", *["0"] * 15]),
                        ),
                    )  # fmt: skip

                minute = 29_000_000
                sample(minute * MINUTE_MS)
                client.hincrby(qk.stats, "processed", 10 * n)
                client.rpush(qk.pending, b"x")
                assert [int(v) for v in sample(minute * MINUTE_MS + 1)] == [10 * n, 1]
                stored = {int(k): v.split() for k, v in client.hgetall(qk.history_minutes).items()}
                assert list(stored) == [minute]
                assert int(stored[minute][0]) == 10 * n
                assert int(stored[minute][5]) == 1  # the depth
            assert len(nodes) > 1  # the three queues do not all live on one master
        finally:
            client.close()
