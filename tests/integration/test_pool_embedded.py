"""The pool embedded in a host: exec'd children, no signal handlers, no waitpid(-1)."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fencekit import Client, ConfigError, Task
from fencekit.pool import Pool
from fencekit.pool.embedded import default_redis
from fencekit.testing import RedisServer, free_port, wait_until

APP = textwrap.dedent(
    """
    from fencekit import current_job

    class Echo:
        queue = "embed"
        operation = "echo"

        @classmethod
        async def perform(cls, payload):
            await current_job().set_if_fresh("echo:" + current_job().jid, str(payload["n"]))

    WORKERS = [Echo]
    """
)


@pytest.fixture
def embed_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "embedapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    yield "embedapp:WORKERS"
    sys.modules.pop("embedapp", None)


def processed(client: redis.Redis) -> int:
    return int(client.hget("fencekit:{embed}:stats", "processed") or 0)


async def test_an_async_host_runs_the_pool_with_exec_children_and_keeps_its_signals(
    embed_app: str, private_redis: RedisServer
):
    url = private_redis.url()
    loop = asyncio.get_running_loop()
    before = signal.getsignal(signal.SIGTERM)
    host_child = subprocess.Popen(["sleep", "30"])
    try:
        async with Pool(embed_app, procs=2, redis_url=url, heartbeat_ttl=2.0) as pool:
            assert signal.getsignal(signal.SIGTERM) is before
            assert not getattr(loop, "_signal_handlers", {})  # no handler added to the host's loop
            pids = [c["pid"] for c in pool.children()]
            assert len(pids) == 2, pids
            for pid in pids:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                assert b"fencekit.pool.exec_child" in cmdline  # exec'd, not forked
            async with Client(url) as client:
                await client.enqueue_many(Task("embed", "echo", {"n": i}) for i in range(200))
            srv = private_redis.client()
            await asyncio.to_thread(wait_until, lambda: processed(srv) >= 200, 30)
            # a dead child is noticed through its pidfd and restarted ...
            victim = pids[0]
            import os

            os.kill(victim, signal.SIGKILL)
            await asyncio.to_thread(
                wait_until, lambda: pool.children()[0]["pid"] != victim and pool.children()[0]["ready"], 20
            )
            assert pool.children()[0]["restarts"] == 1
            # ... without reaping the host's own children (no waitpid(-1))
            assert host_child.poll() is None
        assert srv.hlen("fencekit:{registry}:consumers") == 0
        srv.close()
    finally:
        host_child.kill()
        assert host_child.wait() == -signal.SIGKILL


def test_a_synchronous_host_starts_and_stops_the_pool(embed_app: str, private_redis: RedisServer):
    from embedapp import Echo  # a class list instead of an APP string

    pool = Pool([Echo], procs=1, redis_url=private_redis.url())
    pool.start_sync()
    try:
        assert pool.children()[0]["ready"]

        async def feed() -> None:
            async with Client(private_redis.url()) as client:
                await client.enqueue_many(Task("embed", "echo", {"n": i}) for i in range(50))

        asyncio.run(feed())
        srv = private_redis.client()
        wait_until(lambda: processed(srv) >= 50, 30)
        srv.close()
    finally:
        pool.stop_sync(timeout=30)
    assert pool.children()[0]["alive"] is False


def test_workers_defined_inside_a_function_cannot_be_exec_d():
    class Local:
        queue = "embed"
        operation = "x"

        @classmethod
        async def perform(cls, payload: dict[str, object]) -> None: ...

    with pytest.raises(ConfigError, match="inside a function"):
        Pool([Local], procs=1, redis_url="redis://127.0.0.1:1/0")


def test_the_embedded_default_starts_a_private_redis_that_keeps_its_data(tmp_path: Path):
    logger = logging.getLogger("test.embedded")
    probe = ("127.0.0.1", free_port())  # nothing answers there
    url, server = default_redis(tmp_path / "data", logger, probe=probe)
    assert server is not None
    try:

        async def put() -> None:
            async with Client(url) as client:
                await client.enqueue(Task("embed", "echo", {"n": 1}))

        asyncio.run(put())
    finally:
        server.stop()
    assert (tmp_path / "data").exists()
    server.start()
    try:
        client = server.client()
        assert client.llen("fencekit:{embed}:pending") == 1  # survived the restart (AOF)
        client.close()
    finally:
        server.cleanup()
