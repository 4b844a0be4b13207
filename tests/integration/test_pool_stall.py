"""A child stalled by a blocking call in an async perform (issue 15, item 2), on real processes.

The worker below calls ``time.sleep`` inside its ``async def perform`` on its
first attempt: the child's event loop stops ticking. Before the hang timeout
the supervisor shows the child *stalled* (admin page, /metrics,
``Pool.children``); at the timeout it logs one record naming the task, the
child's stack with the ``time.sleep`` line, and the hint, then kills it. The
task is redelivered and, no longer blocking, completes. With Redis stopped
(SIGSTOP) the kill is not held up: the record says the tasks could not be read.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from tests.queue_helpers import capture_logger, messages

from fencekit import Client, Task
from fencekit.pool import Pool
from fencekit.testing import RedisServer, free_port, wait_until

APP = textwrap.dedent(
    """
    import os, time
    import redis.asyncio
    from fencekit import current_job

    class Stall:
        queue = "stall"
        operation = "block"
        retry_count = 3

        @classmethod
        async def perform(cls, payload):
            if current_job().attempt == 0:
                time.sleep(payload["seconds"])  # blocks the event loop: the bug under test
            client = redis.asyncio.Redis.from_url(os.environ["TEST_REDIS_URL"])
            await client.set("stall:done", current_job().jid)
            await client.aclose()

    WORKERS = [Stall]
    """
)
SLEEP_LINE = next(n for n, line in enumerate(APP.splitlines(), 1) if "time.sleep(" in line)
HINT = "a blocking call in an async perform?"
STALLED = re.compile(r"stalled \d+\.\ds")  # the admin page's pill


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "stallapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("stallapp", None)


@pytest.fixture
def srv(private_redis: RedisServer) -> Iterator[redis.Redis]:
    client = private_redis.client()
    yield client
    client.close()


class PoolProcess:
    """``python -m fencekit.pool stallapp:WORKERS`` with its output in a file."""

    def __init__(self, app_dir: Path, url: str, *args: str) -> None:
        self.log = app_dir / f"pool-{time.monotonic_ns()}.log"
        env = {**os.environ, "PYTHONPATH": str(app_dir), "TEST_REDIS_URL": url}
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fencekit.pool",
                "stallapp:WORKERS",
                "--procs",
                "1",
                "--redis-url",
                url,
                *args,
            ],
            cwd=app_dir,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_until(
            lambda: "pool ready" in self.output() or self.proc.poll() is not None, 30, what="pool ready"
        )
        assert self.proc.poll() is None, self.output()

    def stop(self) -> int:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    return self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
                    raise
            return self.proc.returncode
        finally:
            self._out.close()


def enqueue_stall(url: str, seconds: float) -> str:
    async def go() -> str:
        async with Client(url) as client:
            return await client.enqueue(Task("stall", "block", {"seconds": seconds}))

    return asyncio.run(go())


def stall_record(log: str) -> str:
    """The supervisor's record about the hung child: its first line to the hint's line."""
    start = log.index("is hung: its event loop has not ticked")
    end = log.find("\n", log.index(HINT, start))
    return log[start : end if end >= 0 else len(log)]


def assert_names_the_stack(record: str, app_dir: Path) -> None:
    assert f'File "{app_dir / "stallapp.py"}", line {SLEEP_LINE} in perform' in record, record
    assert 'time.sleep(payload["seconds"])' in record, record  # the source line under the frame
    assert "a blocking call in an async perform? use a sync task" in record, record
    assert "asyncio.to_thread" in record, record


def test_a_stalled_child_is_shown_stalled_then_killed_with_its_task_and_stack_named(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
) -> None:
    url = private_redis.url()
    jid = enqueue_stall(url, 120)
    port = free_port()
    pool = PoolProcess(app_dir, url, "--hang-timeout", "8", "--web-port", str(port))
    try:
        pool.wait_ready()
        base = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: STALLED.search(httpx.get(base + "/admin").text) is not None or "is hung" in pool.output(),
            30,
            what="admin page shows stalled",
        )
        assert "is hung" not in pool.output()  # shown before the kill
        page = httpx.get(base + "/admin").text
        children = page[page.index("<section id=children>") :]
        children = children[: children.index("</section>")]
        assert STALLED.search(children), children
        assert "running</span>" not in children, children
        metrics = httpx.get(base + "/metrics").text
        found = re.search(r'^fencekit_pool_child_stalled_seconds\{slot="0"\} (\S+)$', metrics, re.MULTILINE)
        assert found is not None, metrics
        wait_until(lambda: HINT in pool.output(), 30, what="the hung child's record")
        record = stall_record(pool.output())
        assert "could not be read" not in record, record
        assert f"stall/block jid {jid} attempt 1, running for" in record, record
        assert re.search(r"running for \d+\.\ds", record), record
        assert "durations on Redis's clock" in record, record
        assert_names_the_stack(record, app_dir)
        wait_until(lambda: srv.get("stall:done") == jid.encode(), 60, what="the task redelivered and done")
        wait_until(lambda: pool.output().count("started child") >= 2, 30, what="child restarted")
        assert "killed by SIGKILL" in pool.output()
        assert float(found.group(1)) > 0.0
    finally:
        assert pool.stop() == 0, pool.output()


def test_a_stalled_child_is_killed_while_redis_is_stopped_and_the_record_says_so(
    app_dir: Path, private_redis: RedisServer, srv: redis.Redis
) -> None:
    url = private_redis.url()
    jid = enqueue_stall(url, 120)
    pool = PoolProcess(app_dir, url, "--hang-timeout", "3", "--heartbeat-ttl", "3", "--web-port", "-1")
    try:
        pool.wait_ready()
        wait_until(
            lambda: sum(srv.hlen(k) for k in srv.scan_iter("fencekit:{stall}:inflight:*")) == 1,
            30,
            what="the blocking task claimed",
        )
        private_redis.pause()
        try:
            wait_until(
                lambda: "killed by SIGKILL" in pool.output(), 30, what="the kill while Redis is stopped"
            )
            record = stall_record(pool.output())
        finally:
            private_redis.resume()
        assert "the tasks it was running could not be read from Redis: no answer within 0.5s" in record, (
            record
        )
        assert_names_the_stack(record, app_dir)
        wait_until(lambda: srv.get("stall:done") == jid.encode(), 90, what="the task redelivered and done")
    finally:
        assert pool.stop() == 0, pool.output()


async def test_an_embedded_pool_shows_its_exec_child_stalled_and_logs_its_stack(
    app_dir: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = private_redis.url()
    monkeypatch.setenv("PYTHONPATH", str(app_dir))
    monkeypatch.setenv("TEST_REDIS_URL", url)
    logger = capture_logger("fencekit.test.stall")
    srv = private_redis.client()
    try:
        async with Pool(
            "stallapp:WORKERS", procs=1, redis_url=url, hang_timeout=6.0, web_port=None, logger=logger
        ) as pool:
            async with Client(url) as client:
                jid = await client.enqueue(Task("stall", "block", {"seconds": 120}))

            def shown_stalled() -> bool:
                return any(c["state"] == "stalled" and c["stalled_for"] > 0 for c in pool.children())

            await asyncio.to_thread(wait_until, shown_stalled, 30, what="Pool.children shows stalled")
            assert not any("is hung" in m for m in messages(logger))  # before the kill
            assert not pool.children()[0]["ready"]
            await asyncio.to_thread(
                wait_until, lambda: any(HINT in m for m in messages(logger)), 30, what="the record"
            )
            record = stall_record("\n".join(messages(logger)))
            assert f"stall/block jid {jid} attempt 1" in record, record
            assert_names_the_stack(record, app_dir)
            await asyncio.to_thread(
                wait_until, lambda: srv.get("stall:done") == jid.encode(), 60, what="redelivered and done"
            )
    finally:
        srv.close()
