"""Global rate limits on a real Redis and real processes (docs/guides/flow.md): one token
bucket per limited operation in Redis, taken in ``ack_claim.lua``; a limited task
stays queued (not failed, retried or counted) and the claim of its queue pauses
until the next token."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.queue_helpers import eventually, new_server, qkey, running, stats, worker

from fencekit import Client, Task, current_job
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit.errors import ConfigError
from fencekit.jobs.flow import Rate, flow_specs, parse_rate
from fencekit.jobs.worker import inspect_worker

KEYS = KeySpace()
SCAN_CAP = 128  # lua/_flow.lua

RATE_APP = textwrap.dedent(
    """
    import os
    import time

    from fencekit import current_job

    OUT = os.environ["RATE_OUT"]


    class Limited:
        queue = "rated"
        operation = "call"
        rate_limit = "50/s"

        @staticmethod
        async def perform(payload):
            # the claim's time on Redis's clock (the delivery's token, in µs): the clock the
            # bucket is refilled from, so the windows below are exact, free of start-up jitter
            with open(os.path.join(OUT, f"{os.getpid()}.txt"), "a") as f:
                f.write(f"{current_job().token.value / 1e6}\\n")


    class Free:
        queue = "unrated"
        operation = "call"

        @staticmethod
        async def perform(payload):
            with open(os.path.join(OUT, f"free-{os.getpid()}.txt"), "a") as f:
                f.write(f"{time.time()}\\n")


    WORKERS = [Limited, Free]
    """
)


def assert_within_bucket(claims: list[float], rate: Rate) -> None:
    """Claim times (s, Redis's clock): between any two, at most the bucket's size and its refill.

    A token bucket of capacity ``burst`` refilled at ``per_second`` lets at most
    ``burst + per_second * (t_j - t_i)`` claims happen from t_i to t_j, both included.
    The times are delivery tokens, which read the same clock as the claim's buckets (the script's
    one ``TIME``, ``lua/_clock.lua``) unless the token counter runs ahead of it (a µs per token of
    a big claim), hence a slack of 2 ms of refill (0.1 token at 50/s; a real excess is a whole
    token). With two readings a CI run saw two claims 0.197 s apart at 5/s.
    """
    times = sorted(claims)
    slack = max(0.01, rate.per_second * 0.002)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            allowed = rate.burst + rate.per_second * (times[j] - start)
            assert j - i + 1 <= allowed + slack, (i, j, times[i : j + 1])


def test_parse_rate_and_bad_values_name_the_worker() -> None:
    assert parse_rate("100/s") == Rate(100.0, 10)
    assert parse_rate("30/m") == Rate(0.5, 1)
    assert parse_rate("7200/h") == Rate(2.0, 1)
    for bad in ("100", "100/d", "/s", "0/s", 100):

        class Bad:
            queue = "q"
            operation = "op"
            rate_limit = bad

            @staticmethod
            async def perform(payload: dict[str, Any]) -> None:
                return None

        with pytest.raises(ConfigError, match=r"worker .*Bad: attribute 'rate_limit'"):
            inspect_worker(Bad)


@pytest.mark.slow
def test_50_per_second_over_two_pools(tmp_path: Path, redis_url: str, r: Any) -> None:
    (tmp_path / "rate_app.py").write_text(RATE_APP)
    out = tmp_path / "out"
    out.mkdir()

    async def fill() -> None:
        async with Client(redis_url=redis_url) as client:
            await client.enqueue_many([Task("rated", "call") for _ in range(800)])
            await client.enqueue_many([Task("unrated", "call") for _ in range(200)])

    asyncio.run(fill())
    env = {
        **os.environ,
        "RATE_OUT": str(out),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    pools = []
    logs = []
    for n in range(2):
        log = (tmp_path / f"pool{n}.log").open("wb")
        logs.append(log)
        pools.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fencekit.pool",
                    "rate_app:WORKERS",
                    "--procs",
                    "2",
                    "--concurrency",
                    "8",
                    "--redis-url",
                    redis_url,
                    "--web-port",
                    "off",
                ],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        deadline = time.time() + 40
        while time.time() < deadline:
            files = list(out.glob("[0-9]*.txt"))
            times = sorted(float(x) for f in files for x in f.read_text().split())
            if times and times[-1] - times[0] > 12.0:
                break
            time.sleep(0.5)
    finally:
        for pool in pools:
            pool.terminate()
        for pool in pools:
            pool.wait(30)
        for log in logs:
            log.close()
    starts = sorted(float(x) for f in out.glob("[0-9]*.txt") for x in f.read_text().split())
    free = [float(x) for f in out.glob("free-*.txt") for x in f.read_text().split()]
    writers = {f.name for f in out.glob("[0-9]*.txt")}
    t0 = starts[0]
    window = [t for t in starts if t0 + 1.0 <= t < t0 + 11.0]
    print(f"\n[rate_limit 50/s, 2 pools x 2 children] {len(window) / 10.0:.1f}/s over 10 s, "
          f"{len(starts)} claims, {len(writers)} processes ran tasks")  # fmt: skip
    # the claim times on Redis's clock: between any two claims, no more than the bucket held
    # (its burst, 5) and what the clock refilled (50 per second) -- however fast the hosts ran
    assert_within_bucket(starts, Rate(50.0, 5))
    assert len(starts) > 5  # more than one burst: the bound above was exercised past the bucket's size
    assert len(free) == 200  # the unlimited queue was served meanwhile, by the same consumers
    assert len(writers) >= 2
    s = stats(r, "rated")
    assert s["failed"] == 0  # limited tasks only waited
    assert s["retried"] == 0
    # everything not run is still queued (pending, or parked for a token): nothing lost
    assert (
        s["processed"]
        + r.llen(qkey("rated", "pending"))
        + r.llen(qkey("rated", "rparked:call"))
        + sum(r.hlen(k) for k in r.keys(qkey("rated", "inflight:*")))
        == 800
    )


async def test_a_limited_task_waits_in_its_queue_without_a_busy_loop(redis_url: str, r: Any) -> None:
    runs: list[float] = []

    async def perform(payload: dict[str, Any]) -> None:
        runs.append(current_job().token.value / 1e6)  # the claim's time on Redis's clock

    limited = worker("slowrate", "call", perform, rate_limit="2/s")
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task("slowrate", "call") for _ in range(4)])
        server = new_server(redis_url, limited, concurrency=4)
        before = int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        async with running(server):
            await eventually(lambda: len(runs) == 4, timeout=5, what="four runs")
        calls = int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)) - before
    assert_within_bucket(runs, Rate(2.0, 1))  # burst 1, then one each 500 ms (Redis's clock)
    assert calls < 60  # the claims wait for the token instead of polling
    s = stats(r, "slowrate")
    assert (s["processed"], s["failed"], s["retried"]) == (4, 0, 0)


async def test_the_bucket_grants_exactly_what_redis_time_refilled(redis_url: str, r: Any) -> None:
    """``ack_claim.lua`` driven directly; each claim checked against the bucket's formula (_flow.lua).

    tokens = min(burst, t + (now - at) * rate / 1e6) with ``now`` the claim's Redis ``TIME`` (which
    the script stores as ``at``): ``floor(tokens)`` tasks are granted (FIFO), the rest go back to the
    head, ``tokens - granted`` is stored, and the reply's wait is the ms until the next token.
    """

    async def perform(payload: dict[str, Any]) -> None:
        return None

    queue = "ratemath"
    spec = inspect_worker(worker(queue, "call", perform, rate_limit="100/s"))
    assert spec.rate == Rate(100.0, 10)
    flow = flow_specs([spec], {queue: KEYS.queue(queue)})[queue]
    per_second, burst = spec.rate
    bucket = qkey(queue, "rate:call")
    qk = KEYS.queue(queue)
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task(queue, "call", {"i": i}) for i in range(60)])
    ar = async_client(redis_url)
    granted: list[int] = []

    def stored() -> tuple[float, int]:
        t, at = r.hmget(bucket, "t", "at")
        return float(t), int(at)

    parked, due_key = qkey(queue, "rparked:call"), qkey(queue, "rparkedops")

    async def claim(want: int, before: tuple[float, int] | None) -> tuple[int, float, int]:
        """One claim of ``want``; asserts the formula from the bucket ``before`` it; (granted, t, at).

        A claim first takes the parked tasks whose token is due (as many as the bucket holds),
        then pops the pending list; a popped task finds a token only while none is parked
        before it, else it parks behind them (FIFO within the operation), and the claim pops
        on, up to SCAN_CAP tasks looked at, for tasks of other operations."""
        pending, parked_before = r.llen(qkey(queue, "pending")), r.llen(parked)
        due = r.zscore(due_key, "call")
        reply = await arun(
            ar,
            scripts.ack_claim(
                pending=qk.pending,
                inflight=qk.inflight("c1"),
                token_counter=qk.token_counter,
                stats=qk.stats,
                wake=qk.wake,
                want=want,
                acks=[],
                flow=flow,
            ),
        )
        fenced, first, lost, wait, *envelopes = reply
        t_raw, at_raw = r.hmget(bucket, "t", "at")
        now = int(at_raw)  # the claim's Redis TIME, in µs
        if before is None:
            tokens = float(burst)  # no bucket yet: a full one
        else:
            t, at = before
            tokens = min(burst, t + max(0, now - at) * per_second / 1000000)
        restored = (
            min(want, math.floor(tokens), parked_before) if due is not None and due <= now // 1000 else 0
        )
        popped = min(want - restored, pending)
        new = 0 if parked_before - restored > 0 else min(popped, math.floor(tokens - restored))
        if popped > new and restored + new < want:  # one parked: it scans on for others (none here)
            popped = min(pending, SCAN_CAP - restored)
        expected = restored + new
        assert len(envelopes) == expected, (tokens, before, now, restored, popped)
        assert t_raw.decode() == f"{tokens - expected:.6f}"  # what is left, as the script stores it
        assert r.llen(qkey(queue, "pending")) == pending - popped
        assert r.llen(parked) == parked_before - restored + popped - new  # the rest parked, none lost
        assert (wait > 0) == (r.llen(parked) > 0)  # a look again when the next token is due
        if envelopes:
            assert int(first) >= now  # the delivery tokens come from the same clock, after the refill
        assert (fenced, lost) == ([], 0)
        assert 0 < r.pttl(bucket) <= math.ceil(burst * 1000 / per_second) + 1000
        granted.extend(orjson.loads(e)["params"]["i"] for e in envelopes)
        return expected, float(t_raw), now

    try:
        # a fresh bucket is full: exactly the burst; the others parked (the claim scanned on for
        # tasks of another operation: there are none), a look again in one token (10 ms)
        assert (await claim(15, None))[:2] == (10, 0.0)
        assert r.llen(parked) == 50
        # a bucket stamped ahead of Redis's clock refills nothing: 3.5 tokens give 3 of the
        # parked, leave 0.5
        await asyncio.sleep(0.02)  # past the parked operation's due time
        now_s, now_us = r.time()
        ahead = int(now_s) * 1_000_000 + int(now_us) + 3_600_000_000
        r.hset(bucket, mapping={"t": "3.5", "at": str(ahead)})
        got, left, at = await claim(15, (3.5, ahead))
        assert (got, left) == (3, 0.5)
        assert at < ahead  # stamped again with the claim's own clock
        # a bucket idle far longer than it takes to fill holds the burst, not more
        await asyncio.sleep(0.02)
        r.hset(bucket, mapping={"t": "0.25", "at": str(at - 3_600_000_000)})
        assert (await claim(15, stored()))[:2] == (10, 0.0)
        # then claims as fast as they come, each granting what the clock refilled since the one before
        while len(granted) < 60:
            got, left, _ = await claim(7, stored())
            if got == 0:
                await asyncio.sleep(max(0.002, (1 - left) / per_second))  # until the next token
    finally:
        await aclose_client(ar)
    assert granted == list(range(60))  # FIFO: the parked ones first, in their order
    s = stats(r, queue)
    assert (s["processed"], s["failed"], s["retried"]) == (0, 0, 0)  # waiting costs nothing
    assert not r.exists(parked, due_key, qkey(queue, "rparkedspec"))  # nothing parked is left behind
    assert r.hlen(qkey(queue, "inflight:c1")) == 60
