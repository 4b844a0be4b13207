"""The pool embedded in a host: exec'd children, no signal handlers, no waitpid(-1)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from tests.queue_helpers import capture_logger, messages

from fencekit import Client, ConfigError, Task
from fencekit._redis.address import DEFAULT_URL, Record, default_url, read, write
from fencekit.pool import Pool
from fencekit.pool._embedded import default_redis
from fencekit.testing import RedisServer, wait_until

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
        async with Pool(embed_app, procs=2, redis_url=url, heartbeat_ttl=2.0, web_port=0) as pool:
            assert signal.getsignal(signal.SIGTERM) is before
            assert not getattr(loop, "_signal_handlers", {})  # no handler added to the host's loop
            pids = [c["pid"] for c in pool.children()]
            assert len(pids) == 2, pids
            for pid in pids:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                assert b"fencekit.pool._exec_child" in cmdline  # exec'd, not forked
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

    pool = Pool([Echo], procs=1, redis_url=private_redis.url(), web_port=0)  # 3030 may be another test's
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


@pytest.fixture
def data_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short data directory (a unix socket path must stay under 108 bytes), as FENCEKIT_DATA_DIR."""
    directory = Path(tempfile.mkdtemp(prefix="fk-data-", dir="/tmp"))
    monkeypatch.setenv("FENCEKIT_DATA_DIR", str(directory))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def enqueue_from_another_process(n: int) -> None:
    """``Client()`` with no URL in a fresh interpreter (it inherits FENCEKIT_DATA_DIR)."""
    code = (
        "import asyncio\n"
        "from fencekit import Client, Task\n"
        "async def main():\n"
        "    async with Client() as client:\n"
        f"        await client.enqueue_many(Task('embed', 'echo', {{'n': i}}) for i in range({n}))\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def pending_by_default_client() -> int:
    async def length() -> int:
        async with Client() as client:
            return await client.queue("embed").length()

    return asyncio.run(length())


def test_the_embedded_default_has_a_stable_socket_that_client_finds_and_keeps_its_data(
    data_dir: Path,
) -> None:
    logger = capture_logger("test.embedded")
    url, embedded = default_redis(None, logger)
    assert embedded is not None
    try:
        assert url == f"unix://{data_dir.resolve()}/redis.sock?db=0"
        assert default_url() == url  # what Client(), Server() and Pool() use with no URL
        enqueue_from_another_process(3)
        assert pending_by_default_client() == 3
        line = messages(logger)[-1]
        assert line.startswith(
            "no Redis URL given (--redis-url, FENCEKIT_REDIS_URL, App(redis_url=)): started an "
        )
        assert f" at {url} with its data in {data_dir}" in line
    finally:
        embedded.stop()
    assert default_url() == DEFAULT_URL  # the record goes with the server
    assert not (data_dir / "redis.json").exists()
    again, embedded = default_redis(None, logger)
    assert embedded is not None
    try:
        assert again == url  # the same address on every start
        assert pending_by_default_client() == 3  # and the same data (AOF)
    finally:
        embedded.stop()


def test_a_second_pool_shares_the_running_embedded_redis_and_an_orphan_is_adopted(data_dir: Path) -> None:
    logger = capture_logger("test.embedded.shared")
    url, first = default_redis(None, logger)
    assert first is not None
    try:
        shared, none = default_redis(None, logger)
        assert (shared, none) == (url, None)  # not a second server on the same AOF
        assert messages(logger)[-1].startswith(f"using the embedded Redis at {url} (pid ")
        # Its pool is gone (a SIGKILLed supervisor leaves the server running): the next pool adopts it.
        record = read(data_dir)
        assert record is not None
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        write(data_dir, Record(record.url, record.server, gone.pid))
        adopted_url, adopted = default_redis(None, logger)
        assert adopted_url == url
        assert adopted is not None
        assert messages(logger)[-1].startswith(f"adopting the embedded Redis at {url} (pid {record.server})")
        adopted.stop()
        assert read(data_dir) is None
        assert default_url() == DEFAULT_URL
    finally:
        first.stop()


def test_a_client_given_no_url_starts_the_embedded_redis_and_the_next_pool_adopts_it(data_dir: Path) -> None:
    """The first hour, item 2: ``Client()`` with no URL anywhere uses the data directory's embedded
    Redis, started when none runs; it outlives the client (its tasks wait for a pool), which adopts it."""
    env = {k: v for k, v in os.environ.items() if k != "FENCEKIT_REDIS_URL"}
    code = (
        "import asyncio, logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        "from fencekit import Client, Task\n"
        "async def main():\n"
        "    async with Client() as client:\n"
        "        await client.enqueue_many(Task('embed', 'echo', {'n': i}) for i in range(4))\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    record = read(data_dir)
    assert record is not None, done.stdout + done.stderr  # still running: the client is gone
    assert record.url == f"unix://{data_dir.resolve()}/redis.sock?db=0"
    assert "no Redis URL given (redis_url, FENCEKIT_REDIS_URL): started an embedded " in done.stdout
    assert "it keeps running after this process; the next pool adopts it" in done.stdout
    logger = capture_logger("test.embedded.client")
    url, adopted = default_redis(None, logger)
    assert adopted is not None
    try:
        assert url == record.url
        assert messages(logger)[-1].startswith(f"adopting the embedded Redis at {url}")
        assert pending_by_default_client() == 4
    finally:
        adopted.stop()
    assert read(data_dir) is None


def test_the_cli_given_no_url_and_no_embedded_redis_asks_for_one(data_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FENCEKIT_REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "fencekit", "queues"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "no Redis URL given (--redis-url, FENCEKIT_REDIS_URL) and no embedded Redis runs in " in done.stderr
    )
    assert read(data_dir) is None  # nothing started
