"""The embedded ``Pool`` used the wrong way round, and the embedded Redis default.

A pool asked for its children before it started, stopped before it started,
started twice, started against a Redis that is not there (async and sync
hosts), an exec'd child whose APP fails to import in the child only; and
``default_redis`` when a Redis already answers at its probe address.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.queue_helpers import capture_logger, messages

from fencekit import ConfigError, StoreError
from fencekit._redis.address import data_home
from fencekit.pool import Pool
from fencekit.pool._embedded import answers, default_redis
from fencekit.runtime.exits import ExitCode
from fencekit.testing import RedisServer

APP = textwrap.dedent(
    """
    class Echo:
        queue = "embed-edge"
        operation = "echo"

        @classmethod
        async def perform(cls, payload):
            return None


    WORKERS = [Echo]
    """
)

CHILD_FAILS = textwrap.dedent(
    """
    import sys

    if sys.argv[0].endswith("exec_child.py"):  # python -m fencekit.pool._exec_child
        raise RuntimeError("this module refuses to load in a pool child")


    class Echo:
        queue = "embed-edge"
        operation = "echo"

        @classmethod
        async def perform(cls, payload):
            return None


    WORKERS = [Echo]
    """
)


@pytest.fixture
def edge_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "edgeembed.py").write_text(APP)
    (tmp_path / "edgechildfails.py").write_text(CHILD_FAILS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    yield "edgeembed:WORKERS"
    sys.modules.pop("edgeembed", None)
    sys.modules.pop("edgechildfails", None)


async def test_a_pool_not_started_has_no_children_and_stops_as_a_no_op(edge_app: str) -> None:
    pool = Pool(edge_app, procs=1, redis_url="redis://127.0.0.1:1/0", web_port=None)
    assert pool.children() == []
    await pool.stop()
    pool.stop_sync()


async def test_a_running_pool_cannot_be_started_again(edge_app: str, private_redis: RedisServer) -> None:
    pool = Pool(edge_app, procs=1, redis_url=private_redis.url(), web_port=None)
    await pool.start()
    try:
        with pytest.raises(ConfigError, match=r"^this pool is already running: stop\(\) it before starting"):
            await pool.start()
    finally:
        await pool.stop()


async def test_a_pool_without_its_redis_fails_its_start_and_leaves_nothing_running(
    edge_app: str, server_binary: str, tmp_path: Path
) -> None:
    gone = RedisServer(tmp_path / "gone", binary=server_binary)  # never started: nothing listens
    pool = Pool(edge_app, procs=1, redis_url=gone.url() + "?socket_connect_timeout=1", web_port=None)
    with pytest.raises(
        StoreError, match=rf"^ConnectionError: Error 111 connecting to 127\.0\.0\.1:{gone.port}\."
    ):
        await pool.start()
    assert pool.supervisor is not None
    assert pool.supervisor.stopped.is_set()
    assert all(not child["alive"] for child in pool.children())


def test_a_synchronous_host_gets_the_start_failure_raised(
    edge_app: str, server_binary: str, tmp_path: Path
) -> None:
    gone = RedisServer(tmp_path / "gone", binary=server_binary)
    pool = Pool(edge_app, procs=1, redis_url=gone.url() + "?socket_connect_timeout=1", web_port=None)
    with pytest.raises(StoreError):
        pool.start_sync(timeout=30)


async def test_an_exec_child_whose_app_cannot_load_stops_the_pool_with_the_boot_code(
    edge_app: str, private_redis: RedisServer
) -> None:
    from edgechildfails import Echo  # type: ignore[import-not-found]  # imports in the host

    logger = logging.getLogger("test.embed-edge")
    pool = Pool([Echo], procs=1, redis_url=private_redis.url(), web_port=None, logger=logger)
    try:
        with pytest.raises(
            ConfigError, match=r"the pool stopped while starting \(exit code 3: a child could not boot"
        ):
            await pool.start()
        assert pool.supervisor is not None
        assert pool.supervisor.stopped.is_set()
        assert pool.supervisor.exit_code == ExitCode.BOOT
    finally:
        await pool.stop(fast=True)


def test_the_embedded_default_never_takes_a_redis_that_merely_answers(
    private_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first hour, item 2: with no URL anywhere the pool used whatever answered on 6379 (the
    machine's own Redis got the demo's keys). A server answering is not a server given."""
    assert answers(private_redis.host, private_redis.port)
    logger = capture_logger("test.embed-edge")
    url, server = default_redis(tmp_path / "mine", logger)
    assert server is not None
    try:
        assert url.startswith(("unix://", "redis://127.0.0.1:"))
        assert url != "redis://127.0.0.1:6379/0"
        (line,) = messages(logger)
        assert line.startswith(
            "no Redis URL given (--redis-url, FENCEKIT_REDIS_URL, App(redis_url=)): started "
        )
        assert f"with its data in {tmp_path / 'mine'}" in line
    finally:
        server.stop()
    monkeypatch.setenv("FENCEKIT_DATA_DIR", str(tmp_path / "mine"))
    assert data_home() == tmp_path / "mine"
    monkeypatch.delenv("FENCEKIT_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_home() == tmp_path / "xdg" / "fencekit"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_home() == tmp_path / "home" / ".local" / "share" / "fencekit"
