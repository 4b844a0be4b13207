"""The pool's children at the edges of their life: a boot refused, a boot that
keeps crashing, a start while Redis is away, and the supervisor's fast stop.

Each test runs ``python -m fencekit.pool`` on a private Redis (forked
children) and judges by the exit code, the log and Redis itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fencekit import Client, Task
from fencekit.runtime.exits import ExitCode
from fencekit.testing import RedisServer, wait_until

APP = textwrap.dedent(
    """
    import asyncio, os
    from pathlib import Path

    from fencekit.errors import ConfigError
    from fencekit.runtime.app import App

    STARTS = Path(os.environ["TEST_DIR"]) / "starts"


    class Work:
        queue = "edge"
        operation = "do"

        @classmethod
        async def perform(cls, payload):
            await asyncio.sleep(payload.get("sleep", 0))


    async def refuse():
        raise ConfigError("this child's settings are refused")


    async def crash_three_times():
        with STARTS.open("a") as f:
            f.write("start\\n")
        if len(STARTS.read_text().splitlines()) <= 3:
            raise RuntimeError("not today")


    WORKERS = [Work]
    REFUSED = App([Work], on_startup=[refuse])
    FLAKY = App([Work], on_startup=[crash_three_times])
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "edgeapp.py").write_text(APP)
    return tmp_path


@pytest.fixture
def srv(private_redis: RedisServer) -> Iterator[redis.Redis]:
    client = private_redis.client()
    yield client
    client.close()


class Pool:
    """``python -m fencekit.pool APP`` in its own session, its output in a file."""

    def __init__(self, app_dir: Path, url: str, spec: str, *args: str) -> None:
        self.log = app_dir / f"pool-{time.monotonic_ns()}.log"
        env = {
            **os.environ,
            "PYTHONPATH": f"{app_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "TEST_DIR": str(app_dir),
        }
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fencekit.pool", spec, "--redis-url", url, "--web-port", "-1", *args],
            cwd=app_dir,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 20.0) -> None:
        wait_until(lambda: text in self.output() or self.proc.poll() is not None, timeout, what=text)
        assert text in self.output(), self.output()

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._out.close()


@pytest.fixture
def pools() -> Iterator[list[Pool]]:
    started: list[Pool] = []
    yield started
    for pool in started:
        pool.close()


def stats(client: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall("fencekit:{edge}:stats").items()}


async def enqueue(url: str, n: int, **params: object) -> None:
    async with Client(url) as client:
        await client.enqueue_many(Task("edge", "do", dict(params)) for _ in range(n))


def test_a_child_whose_boot_is_refused_stops_the_pool_with_the_boot_code(
    app_dir: Path, private_redis: RedisServer, pools: list[Pool]
) -> None:
    pool = Pool(app_dir, private_redis.url(), "edgeapp:REFUSED", "--procs", "1")
    pools.append(pool)
    assert pool.wait() == ExitCode.BOOT
    out = pool.output()
    assert "child 0: this child's settings are refused" in out
    assert "child 0 could not boot (see above): stopping the pool" in out
    assert "pool ready" not in out


def test_a_child_that_keeps_crashing_at_start_is_restarted_with_back_off_until_it_serves(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis, pools: list[Pool]
) -> None:
    pool = Pool(app_dir, private_redis.url(), "edgeapp:FLAKY", "--procs", "1")
    pools.append(pool)
    pool.wait_for("pool ready", timeout=30)
    out = pool.output()
    assert out.count("child 0 crashed:") == 3, out
    assert "RuntimeError: not today" in out
    assert "child 0 keeps dying at start (3 times in a row)" in out
    assert (app_dir / "starts").read_text().splitlines() == ["start"] * 4
    import asyncio

    asyncio.run(enqueue(private_redis.url(), 3))
    wait_until(lambda: stats(srv).get("processed") == 3, 15, what="the fourth child serving")
    pool.proc.send_signal(signal.SIGTERM)
    assert pool.wait() == ExitCode.OK


def child_pid(pool: Pool) -> int:
    """The pid of the pool's one child, from its last "started child 0" line."""
    line = [x for x in pool.output().splitlines() if "started child 0 (pid " in x][-1]
    return int(line.rsplit("(pid ", 1)[1].rstrip(")"))


def kill_the_child_while_redis_is_away(pool: Pool, private_redis: RedisServer) -> int:
    """SIGKILL the pool's child with Redis stopped; return the pid of the one started in its place."""
    pool.wait_for("pool ready")
    first = child_pid(pool)
    private_redis.stop()
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: child_pid(pool) != first, 15, what="a new child")
    pool.wait_for("Redis is not answering (child 0: connecting to Redis")
    assert "could not register child 0 before starting it" in pool.output()
    return child_pid(pool)


def test_a_child_started_while_redis_is_away_waits_for_it_then_serves(
    app_dir: Path, private_redis: RedisServer, pools: list[Pool]
) -> None:
    pool = Pool(app_dir, private_redis.url(), "edgeapp:WORKERS", "--procs", "1")
    pools.append(pool)
    kill_the_child_while_redis_is_away(pool, private_redis)
    private_redis.start()
    pool.wait_for("Redis answers again (child 0: connecting to Redis)")
    import asyncio

    asyncio.run(enqueue(private_redis.url(), 5))
    client = private_redis.client()
    try:
        wait_until(lambda: stats(client).get("processed") == 5, 15, what="the new child serving")
    finally:
        client.close()
    pool.proc.send_signal(signal.SIGTERM)
    assert pool.wait() == ExitCode.OK


def test_a_pool_stopped_while_its_child_waits_for_redis_stops_at_once(
    app_dir: Path, private_redis: RedisServer, pools: list[Pool]
) -> None:
    pool = Pool(app_dir, private_redis.url(), "edgeapp:WORKERS", "--procs", "1", "--grace", "30")
    pools.append(pool)
    waiting = kill_the_child_while_redis_is_away(pool, private_redis)
    began = time.monotonic()
    pool.proc.send_signal(signal.SIGTERM)
    pool.wait()
    assert time.monotonic() - began < 15, pool.output()  # the waiting child stopped at once, not after grace
    assert f"child 0 (pid {waiting}) exited with code 0 after" in pool.output()
    assert "pool stopped" in pool.output()


def test_sigquit_stops_the_pool_at_once_and_returns_the_running_tasks(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis, pools: list[Pool]
) -> None:
    import asyncio

    pool = Pool(app_dir, private_redis.url(), "edgeapp:WORKERS", "--procs", "1", "--grace", "30")
    pools.append(pool)
    pool.wait_for("pool ready")
    asyncio.run(enqueue(private_redis.url(), 2, sleep=60))
    wait_until(
        lambda: sum(srv.hlen(k) for k in srv.scan_iter("fencekit:{edge}:inflight:*")) >= 1,
        10,
        what="a task in flight",
    )
    began = time.monotonic()
    pool.proc.send_signal(signal.SIGQUIT)
    pool.wait()
    assert time.monotonic() - began < 15  # far less than the 30 s of grace
    assert sum(srv.hlen(k) for k in srv.scan_iter("fencekit:{edge}:inflight:*")) == 0
    assert srv.llen("fencekit:{edge}:pending") + srv.zcard("fencekit:{edge}:scheduled") == 2
    assert stats(srv).get("processed", 0) == 0
