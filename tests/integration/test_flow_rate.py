"""Global rate limits on a real Redis and real processes (docs/flow.md): one token
bucket per limited operation in Redis, taken in ``ack_claim.lua``; a limited task
stays queued (not failed, retried or counted) and the claim of its queue pauses
until the next token."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, qkey, running, stats, worker

from fencekit import Client, Task, current_job
from fencekit.errors import ConfigError
from fencekit.jobs.flow import Rate, parse_rate
from fencekit.jobs.worker import inspect_worker

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
    # claim times on Redis's clock. The steady rate: the 10 s after the first second (which may
    # spend the bucket's burst); a token bucket of capacity b lets at most rate * T + b through
    # in any T seconds, so no 1-s window of claims holds more than 50 + 5
    window = [t for t in starts if t0 + 1.0 <= t < t0 + 11.0]
    rate = len(window) / 10.0
    peak = max(sum(1 for t in starts[i:] if t < s + 1.0) for i, s in enumerate(starts))
    print(f"\n[rate_limit 50/s, 2 pools x 2 children] {rate:.1f}/s over 10 s, busiest 1-s window {peak}, "
          f"{len(writers)} processes ran tasks")  # fmt: skip
    assert 45.0 <= rate <= 50.0, rate
    assert peak <= 50 + 5, peak  # rate + burst (5 = a tenth of a second's worth)
    assert len(free) == 200  # the unlimited queue was served meanwhile, by the same consumers
    assert len(writers) >= 2
    s = stats(r, "rated")
    assert s["failed"] == 0  # limited tasks only waited
    assert s["retried"] == 0
    # everything not run is still queued: nothing lost
    assert (
        s["processed"]
        + r.llen(qkey("rated", "pending"))
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
    runs.sort()
    assert runs[3] - runs[0] >= 1.45  # burst 1, then one each 500 ms (claim times, Redis's clock)
    assert calls < 60  # the claims wait for the token instead of polling
    s = stats(r, "slowrate")
    assert (s["processed"], s["failed"], s["retried"]) == (4, 0, 0)
