"""The pool on real processes: kill -9, SIGSTOP past the TTL, SIGTERM under load.

Every test starts ``python -m fencekit.pool`` (or the embedded ``Pool``) on a
private Redis, and checks the outcome by reading Redis, not by trusting the
code under test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fencekit.testing import RedisServer, wait_until

APP = textwrap.dedent(
    """
    import asyncio, os, time
    import redis.asyncio
    from fencekit import current_job, FencedOutError

    URL = os.environ["TEST_REDIS_URL"]
    _r = None

    def r():
        global _r
        if _r is None:
            _r = redis.asyncio.Redis.from_url(URL)
        return _r

    class Work:
        queue = "work"
        operation = "do"
        retry_count = 50

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            await asyncio.sleep(payload.get("sleep", 0.002))
            try:
                value = os.environ.get("POOL_NAME", "?") + ":" + str(job.token.value)
                await job.set_if_fresh("effect:" + job.jid, value)
            except FencedOutError:
                await r().incr("fenced_writes")
                raise
            await r().incr("runs")

    class Hang:
        queue = "hang"
        operation = "block"
        retry = False

        @classmethod
        async def perform(cls, payload):
            time.sleep(payload["seconds"])  # blocks the event loop on purpose

    WORKERS = [Work]
    HANGING = [Work, Hang]
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "poolapp.py").write_text(APP)
    return tmp_path


@pytest.fixture
def srv(private_redis: RedisServer) -> Iterator[redis.Redis]:
    client = private_redis.client()
    yield client
    client.close()


class PoolProcess:
    """A ``python -m fencekit.pool`` process in its own session (so SIGSTOP reaches all of it)."""

    def __init__(
        self, app_dir: Path, url: str, *args: str, name: str = "A", env: dict[str, str] | None = None
    ):
        self.log = app_dir / f"pool-{name}-{time.monotonic_ns()}.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": f"{app_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "TEST_REDIS_URL": url,
            "POOL_NAME": name,
            **(env or {}),
        }
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fencekit.pool", *args, "--redis-url", url]
            + ([] if "--web-port" in args else ["--web-port", "-1"]),
            cwd=app_dir,
            env=full_env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        wait_until(
            lambda: "pool ready" in self.output() or self.proc.poll() is not None, timeout, what="pool ready"
        )
        assert self.proc.poll() is None, self.output()

    def group_signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> int:
        try:
            return self._stop(timeout)
        finally:
            self._out.close()

    def _stop(self, timeout: float) -> int:
        if self.proc.poll() is None:
            try:
                self.group_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.group_signal(signal.SIGKILL)
                self.proc.wait()
                raise
        return self.proc.returncode


def stats(client: redis.Redis, queue: str = "work") -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(f"fencekit:{{{queue}}}:stats").items()}


def in_flight(client: redis.Redis, queue: str = "work") -> int:
    return sum(client.hlen(k) for k in client.scan_iter(f"fencekit:{{{queue}}}:inflight:*"))


def nothing_left(client: redis.Redis, queue: str = "work") -> bool:
    """No task of ``queue`` pending, scheduled or in flight anywhere."""
    waiting = client.llen(f"fencekit:{{{queue}}}:pending") + client.zcard(f"fencekit:{{{queue}}}:scheduled")
    return waiting == 0 and in_flight(client, queue) == 0


def child_pids(client: redis.Redis, supervisor: int) -> list[int]:
    import json

    pids = []
    for raw in client.hvals("fencekit:{registry}:consumers"):
        info = json.loads(raw)
        if info.get("supervisor") == supervisor and info.get("pid"):
            pids.append(int(info["pid"]))
    return pids


def enqueue(url: str, n: int, queue: str = "work", operation: str = "do", **params: object) -> list[str]:
    import asyncio

    from fencekit import Client, Task

    async def go() -> list[str]:
        async with Client(url) as client:
            return await client.enqueue_many(Task(queue, operation, dict(params)) for _ in range(n))

    return asyncio.run(go())


@pytest.mark.slow
def test_5000_jobs_survive_repeated_sigkill_of_children(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
):
    url = private_redis.url()
    jids = enqueue(url, 5000, sleep=0.01)
    pool = PoolProcess(
        app_dir, url, "poolapp:WORKERS", "--procs", "2", "--concurrency", "8", "--heartbeat-ttl", "5"
    )
    try:
        pool.wait_ready()
        kills = 0
        deadline = time.monotonic() + 60
        while stats(srv).get("processed", 0) < 5000 and time.monotonic() < deadline:
            if kills < 4 and stats(srv).get("processed", 0) > 800 * (kills + 1):
                pids = child_pids(srv, pool.proc.pid)
                if pids:
                    os.kill(pids[kills % len(pids)], signal.SIGKILL)
                    kills += 1
            time.sleep(0.02)
        assert kills == 4
        wait_until(lambda: stats(srv).get("processed", 0) >= 5000, 60, what="5000 processed")
        # No task left in any place (I1): nothing that could still be counted a second time.
        wait_until(lambda: nothing_left(srv), 30, what="no task left anywhere")
        counters = stats(srv)
        assert counters["processed"] == 5000
        assert counters.get("failed", 0) == 0
        assert srv.llen("fencekit:{work}:pending") == 0
        assert in_flight(srv) == 0
        # every job's fenced effect exists: nothing lost
        assert all(srv.exists("effect:" + jid) for jid in jids)
        assert counters.get("retried", 0) >= 1  # the kills did cut tasks short
    finally:
        code = pool.stop()
    out = pool.output()
    assert out.count("killed by SIGKILL") == 4, out[-3000:]
    assert out.count("started child") >= 2 + 4
    assert code == 0


@pytest.mark.slow
def test_a_paused_pool_is_fenced_out_after_another_pool_reaps_it(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
):
    url = private_redis.url()
    jids = enqueue(url, 10, sleep=2.0)
    a = PoolProcess(
        app_dir,
        url,
        "poolapp:WORKERS",
        "--procs",
        "2",
        "--concurrency",
        "5",
        "--heartbeat-ttl",
        "1",
        name="A",
    )
    b: PoolProcess | None = None
    try:
        a.wait_ready()
        wait_until(lambda: in_flight(srv) == 10, 10, what="A holds all ten tasks")
        a.group_signal(signal.SIGSTOP)
        time.sleep(1.5)  # past A's heartbeat TTL
        b = PoolProcess(
            app_dir,
            url,
            "poolapp:WORKERS",
            "--procs",
            "1",
            "--concurrency",
            "10",
            "--heartbeat-ttl",
            "1",
            name="B",
        )
        b.wait_ready()
        wait_until(
            lambda: stats(srv).get("processed", 0) >= 10, 30, what="B redelivered and finished all ten"
        )
        a.group_signal(signal.SIGCONT)
        wait_until(lambda: int(srv.get("fenced_writes") or 0) >= 10, 20, what="A's stale writes fenced out")
        wait_until(lambda: stats(srv).get("fenced_out", 0) >= 10, 20, what="A's stale settlements fenced out")
        wait_until(lambda: nothing_left(srv), 20, what="no task left anywhere")  # I1: none to count again
        counters = stats(srv)
        assert counters["processed"] == 10  # each task counted once
        for jid in jids:
            assert srv.get("effect:" + jid).startswith(b"B:")  # the newest delivery's write holds
        assert int(srv.get("runs")) == 10  # A's runs never completed their effect
    finally:
        a.stop()
        if b is not None:
            b.stop()


@pytest.mark.slow
def test_sigterm_under_load_exits_zero_and_loses_nothing(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
):
    url = private_redis.url()
    enqueue(url, 3000, sleep=0.01)
    pool = PoolProcess(app_dir, url, "poolapp:WORKERS", "--procs", "2", "--concurrency", "20", "--grace", "3")
    try:
        pool.wait_ready()
        wait_until(lambda: stats(srv).get("processed", 0) > 300, 30, what="some progress")
        pool.proc.send_signal(signal.SIGTERM)
        code = pool.proc.wait(30)  # a bounded wait: a pool that does not stop fails here
    finally:
        pool.stop()
    assert code == 0, pool.output()[-2000:]
    counters = stats(srv)
    pending = srv.llen("fencekit:{work}:pending")
    scheduled = srv.zcard("fencekit:{work}:scheduled")
    assert in_flight(srv) == 0
    assert counters["processed"] + counters.get("failed", 0) + pending + scheduled == 3000
    assert srv.hlen("fencekit:{registry}:consumers") == 0
    assert srv.zcard("fencekit:{registry}:beats") == 0


def test_a_second_stop_signal_says_it_skips_the_grace_and_stops_at_once(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
):
    """The first hour, item 7: a second SIGTERM/SIGINT stops at once and says so in one line."""
    url = private_redis.url()
    enqueue(url, 4, sleep=60)  # each task would hold the whole 60 s grace
    pool = PoolProcess(app_dir, url, "poolapp:WORKERS", "--procs", "1", "--concurrency", "4", "--grace", "60")
    try:
        pool.wait_ready()
        wait_until(lambda: in_flight(srv) == 4, 30, what="four tasks running")
        pool.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "pool stopping (grace 60" in pool.output(), 10, what="the graceful stop began")
        pool.proc.send_signal(signal.SIGINT)
        code = pool.proc.wait(30)  # far inside the grace: the second signal cut it short
    finally:
        pool.stop()
    assert code == 0, pool.output()[-2000:]
    lines = [line for line in pool.output().splitlines() if "second stop signal" in line]
    assert len(lines) == 1, pool.output()[-2000:]
    assert "without the rest of the grace" in lines[0]
    assert in_flight(srv) == 0  # the killed child's tasks went back
    assert srv.llen("fencekit:{work}:pending") == 4


def test_a_hung_child_is_killed_and_its_task_handled_as_a_crash(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
):
    url = private_redis.url()
    enqueue(url, 1, queue="hang", operation="block", seconds=30)
    pool = PoolProcess(app_dir, url, "poolapp:HANGING", "--procs", "1", "--hang-timeout", "1")
    try:
        pool.wait_ready()
        wait_until(lambda: "is hung" in pool.output(), 15, what="hang detected")
        wait_until(lambda: stats(srv, "hang").get("failed", 0) == 1, 15, what="task failed (retry=False)")
        wait_until(lambda: pool.output().count("started child") >= 2, 15, what="child restarted")
    finally:
        pool.stop()
    assert "killed by SIGKILL" in pool.output()


def test_sighup_replaces_children_one_by_one_without_losing_a_task(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
):
    url = private_redis.url()
    enqueue(url, 1500, sleep=0.005)
    pool = PoolProcess(app_dir, url, "poolapp:WORKERS", "--procs", "2", "--concurrency", "10")
    try:
        pool.wait_ready()
        before = set(child_pids(srv, pool.proc.pid))
        pool.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "rolling restart done" in pool.output(), 30, what="rolling restart")
        wait_until(lambda: stats(srv).get("processed", 0) >= 1500, 60, what="all processed")
        after = set(child_pids(srv, pool.proc.pid))
        assert before
        assert after
        assert not (before & after)
        assert stats(srv)["processed"] == 1500
        assert stats(srv).get("retried", 0) == 0  # returned at a restart, not counted as a crash
    finally:
        assert pool.stop() == 0


def test_systemd_notifications_ready_watchdog_and_stopping(
    app_dir: Path, private_redis: RedisServer, tmp_path: Path
):
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(20)
    pool = PoolProcess(
        app_dir,
        private_redis.url(),
        "poolapp:WORKERS",
        "--procs",
        "1",
        env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "400000"},
    )
    try:
        messages: list[str] = []
        deadline = time.monotonic() + 20
        while not ("READY=1" in messages and "WATCHDOG=1" in messages) and time.monotonic() < deadline:
            messages += sock.recv(4096).decode().split("\n")
        assert "READY=1" in messages
        assert "WATCHDOG=1" in messages
        pool.proc.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in messages:
            messages += sock.recv(4096).decode().split("\n")
        assert pool.proc.wait(20) == 0
    finally:
        pool.stop()
        sock.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nosuchmodule:WORKERS"], "cannot import APP module 'nosuchmodule'"),
        (["poolapp:NOPE"], "has no attribute 'NOPE'"),
        (["poolapp"], "APP must look like"),
        (["poolapp:WORKERS", "--procs", "0"], "procs must be >= 1, got 0 (--procs)"),
        (["poolapp:WORKERS", "--redis-url", "http://x"], "unsupported URL scheme"),
    ],
)
def test_bad_app_or_settings_exit_2_with_one_clear_line(app_dir: Path, args: list[str], message: str):
    result = subprocess.run(
        [sys.executable, "-m", "fencekit.pool", *args, "--web-port", "-1"]
        + ([] if "--redis-url" in args else ["--redis-url", "redis://127.0.0.1:1/0"]),
        cwd=app_dir,
        env={**os.environ, "PYTHONPATH": str(app_dir), "TEST_REDIS_URL": "redis://127.0.0.1:1/0"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_redis_exits_4_with_one_clear_line(app_dir: Path):
    from fencekit.testing import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run(
        [sys.executable, "-m", "fencekit.pool", "poolapp:WORKERS", "--redis-url", url, "--web-port", "-1"],
        cwd=app_dir,
        env={**os.environ, "PYTHONPATH": str(app_dir), "TEST_REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 4
    assert "cannot reach Redis" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_the_console_command_runs_the_same_pool(app_dir: Path):
    result = subprocess.run(
        [sys.executable, "-m", "fencekit.cli", "pool", "poolapp:NOPE", "--web-port", "-1"],
        cwd=app_dir,
        env={**os.environ, "PYTHONPATH": str(app_dir)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("fencekit pool: error:")


def test_the_demo_app_makes_jobs_flow(private_redis: RedisServer, srv: redis.Redis, tmp_path: Path):
    pool = PoolProcess(
        tmp_path, private_redis.url(), "fencekit.demo:app", "--procs", "2", "--concurrency", "4"
    )
    try:
        pool.wait_ready()
        wait_until(lambda: stats(srv, "demo").get("processed", 0) >= 15, 30, what="demo jobs processed")
    finally:
        assert pool.stop() == 0
    assert srv.keys("fencekit:{demo}:result:*")
    outside = [k for k in srv.keys("*") if not k.startswith(b"fencekit:")]
    assert outside == []  # the demo writes only under its prefix (the first hour, item 2)


def test_the_supervisor_serves_probes_admin_and_metrics_for_its_children(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
):
    import httpx

    from fencekit.testing import free_port

    port = free_port()
    pool = PoolProcess(
        app_dir, private_redis.url(), "poolapp:WORKERS", "--procs", "2", "--web-port", str(port)
    )
    try:
        pool.wait_ready()
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/live").json() == {"status": "ok"}
        assert httpx.get(base + "/ready").json() == {"status": "ok"}
        page = httpx.get(base + "/admin").text
        pids = child_pids(srv, pool.proc.pid)
        assert len(pids) == 2, pids
        for pid in pids:
            assert str(pid) in page
        metrics = httpx.get(base + "/metrics").text
        assert "fencekit_pool_children 2.0" in metrics
    finally:
        assert pool.stop() == 0
