"""LeanConnection against real Redis servers, on asyncio's loop and on uvloop.

Each test is a plain function that runs its scenario on the loop given by the
``run`` fixture, parametrized over both loop implementations (the way uvloop
runs one suite against its loop and asyncio's).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
import uvloop
from tests.queue_helpers import eventually

from fencekit._redis import hotpath
from fencekit._redis.hotpath import LeanConnection
from fencekit._redis.run import NotSent
from fencekit._redis.scripts import Call, Script
from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError, EncodeError, FencedOutError, LockNotOwned, StoreError
from fencekit.testing import RedisServer, wait_until

T = TypeVar("T")
Runner = Callable[[Awaitable[T]], T]

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


async def _cancel_leftovers() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Iterator[Runner[Any]]:
    """Run a coroutine to completion on a fresh loop of the parametrized kind."""
    loop = LOOPS[request.param]()

    def runner(coro: Awaitable[T]) -> T:
        return loop.run_until_complete(asyncio.wait_for(coro, 60))

    try:
        yield runner
    finally:
        loop.run_until_complete(_cancel_leftovers())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def script(source: str) -> Script:
    return Script("test", source, hashlib.sha1(source.encode()).hexdigest())


COUNT_AND_ECHO = script("return {redis.call('INCR', KEYS[1]), ARGV[1]}")
SHAPES = [
    script("return 42"),
    script("return 'text'"),
    script("return ARGV[1]"),
    script("return {1, 'two', {3, ARGV[1]}, {}}"),
    script("return false"),
    script("return 3.99"),
    script("return redis.status_reply('FINE')"),
    script("return redis.call('MGET', KEYS[1], KEYS[2])"),
    script("return #ARGV"),
]
FENCED = script("return redis.error_reply('FENCED token 5 is older than 7')")
NOTOWNED = script("return redis.error_reply('NOTOWNED lease gone')")
OTHER_ERROR = script("return redis.error_reply('WEIRD something else')")
# Increments, then spins for ARGV[1] ms.
INCR_THEN_SPIN = script(
    """
    redis.call('INCR', KEYS[1])
    -- os.clock where there is one (Valkey, whose TIME inside a script is the time it began),
    -- else TIME (Redis 7.0 has no os)
    local ok, clock = pcall(function() return os.clock end)
    if not ok then
      clock = function() local t = redis.call('TIME') return t[1] + t[2] / 1000000 end
    end
    local stop = clock() + tonumber(ARGV[1]) / 1000
    while clock() < stop do end
    return 1
    """
)


def counter(url: str, key: str = "counter") -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.get(key) or 0)


def blocked_in_blpop(url: str, name: str) -> bool:
    """True once the connection named ``name`` is blocked in BLPOP on the server."""
    with redis.Redis.from_url(url, decode_responses=True) as client:
        return any(
            c.get("name") == name and c.get("cmd") == "blpop" and "b" in c.get("flags", "")
            for c in client.client_list()
        )


def busy(url: str) -> bool:
    """True while Redis answers BUSY: a script ran past ``lua-time-limit`` and is still running."""
    with redis.Redis.from_url(url) as client:
        try:
            client.ping()
        except redis.ResponseError as exc:
            if str(exc).startswith("BUSY"):
                return True
            raise
    return False


# -- results -----------------------------------------------------------------


def test_call_returns_what_redis_py_returns(run: Runner[Any], redis_url: str) -> None:
    args = (b"\x00binary\r\n", "t\u00e9xt", 17, 2.5)

    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        conn = await LeanConnection.open(redis_url)
        try:
            await client.mset({"a": b"1", "b": b"\xff"})
            for s in SHAPES:
                expected = await client.eval(s.source, 2, "a", "b", *args)
                assert await conn.call(Call(s, ("a", "b"), args)) == expected, s.source
        finally:
            await conn.aclose()
            await client.aclose()

    run(scenario())


def test_pipeline_returns_the_replies_of_its_calls_in_order(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        conn = await LeanConnection.open(redis_url)
        try:
            calls = [Call(s, ("a", "b"), (b"x", 1)) for s in SHAPES]
            calls.append(Call(COUNT_AND_ECHO, ("n",), ("last",)))
            pipe = client.pipeline(transaction=False)
            for c in calls:
                pipe.eval(c.script.source, len(c.keys), *c.keys, *c.args)
            expected = await pipe.execute()
            await client.set("n", 0)
            assert await conn.pipeline(calls) == expected
            assert await conn.pipeline([]) == []
        finally:
            await conn.aclose()
            await client.aclose()

    run(scenario())


# -- NOSCRIPT ----------------------------------------------------------------


def test_call_loads_the_script_after_script_flush_and_runs_it_once(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url)
        try:
            call = Call(COUNT_AND_ECHO, ("counter",), ("x",))
            assert await conn.call(call) == [1, b"x"]  # first use: NOSCRIPT -> load
            assert await conn.execute("SCRIPT", "FLUSH") == b"OK"
            assert await conn.call(call) == [2, b"x"]
            assert await conn.call(call) == [3, b"x"]
        finally:
            await conn.aclose()

    run(scenario())
    assert counter(redis_url) == 3


def test_pipeline_reruns_only_the_calls_that_got_noscript(run: Runner[Any], redis_url: str) -> None:
    loaded = script("return {redis.call('INCR', KEYS[1]), 'loaded'}")

    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url)
        try:
            assert await conn.execute("SCRIPT", "LOAD", loaded.source) == loaded.sha.encode()
            calls = [
                Call(COUNT_AND_ECHO, ("counter",), ("a",)),
                Call(loaded, ("other",), ()),
                Call(FENCED, (), ()),
                Call(COUNT_AND_ECHO, ("counter",), ("b",)),
                Call(loaded, ("other",), ()),
            ]
            replies = await conn.pipeline(calls)
            assert replies[0] == [1, b"a"]
            assert replies[1] == [1, b"loaded"]
            assert isinstance(replies[2], FencedOutError)
            assert replies[3] == [2, b"b"]
            assert replies[4] == [2, b"loaded"]
        finally:
            await conn.aclose()

    run(scenario())
    assert counter(redis_url) == 2
    assert counter(redis_url, "other") == 2


# -- error replies -----------------------------------------------------------


def test_error_replies_are_translated_and_leave_the_connection_usable(
    run: Runner[Any], redis_url: str
) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url)
        try:
            with pytest.raises(FencedOutError, match="token 5 is older than 7"):
                await conn.call(Call(FENCED, (), ()))
            with pytest.raises(LockNotOwned, match="lease gone"):
                await conn.call(Call(NOTOWNED, (), ()))
            with pytest.raises(StoreError, match="WEIRD something else"):
                await conn.call(Call(OTHER_ERROR, (), ()))
            await conn.execute("SET", "s", "text")
            with pytest.raises(StoreError, match="WRONGTYPE"):
                await conn.execute("LPUSH", "s", "x")
            with pytest.raises(StoreError, match="ERR"):
                await conn.call(Call(script("return redis.call('INCR', KEYS[1])"), ("s",), ()))
            replies = await conn.pipeline(
                [Call(NOTOWNED, (), ()), Call(SHAPES[0], (), ()), Call(OTHER_ERROR, (), ())]
            )
            assert isinstance(replies[0], LockNotOwned)
            assert replies[1] == 42
            assert isinstance(replies[2], StoreError)
            with pytest.raises(EncodeError):
                await conn.execute("SET", "k", None)  # type: ignore[arg-type]
            assert not conn.closed
            assert await conn.execute("PING") == b"PONG"
        finally:
            await conn.aclose()

    run(scenario())


# -- connection set-up -------------------------------------------------------


def test_auth_select_and_client_name_are_sent_on_open(
    run: Runner[Any], tmp_path: Path, server_binary: str
) -> None:
    with RedisServer(tmp_path / "auth", binary=server_binary, config={"requirepass": "s3cret"}) as server:

        async def scenario() -> None:
            url = f"redis://default:s3cret@{server.host}:{server.port}/5"
            conn = await LeanConnection.open(url, name="lean-worker-1")
            try:
                await conn.execute("SET", "where", "db5")
                assert await conn.execute("CLIENT", "GETNAME") == b"lean-worker-1"
            finally:
                await conn.aclose()
            password_only = await LeanConnection.open(server.url(5))
            assert await password_only.execute("GET", "where") == b"db5"
            await password_only.aclose()
            with pytest.raises(StoreError, match="refused AUTH"):
                await LeanConnection.open(f"redis://:wrong@{server.host}:{server.port}/0")
            unauthenticated = await LeanConnection.open(f"redis://{server.host}:{server.port}/0")
            try:
                with pytest.raises(StoreError, match="NOAUTH"):
                    await unauthenticated.execute("GET", "where")
            finally:
                await unauthenticated.aclose()

        run(scenario())
        with server.client(db=5) as client:
            assert client.get("where") == b"db5"


def test_a_bad_database_or_name_fails_the_open(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        # a database the server does not have is configuration (exit 2), not an outage
        with pytest.raises(ConfigError, match="has no database 99999: ERR DB index is out of range"):
            await LeanConnection.open(redis_url.rsplit("/", 1)[0] + "/99999")
        with pytest.raises(StoreError, match="refused CLIENT SETNAME"):
            await LeanConnection.open(redis_url, name="has space")

    run(scenario())


def test_unix_socket_urls_connect(run: Runner[Any], redis_server: RedisServer, redis_url: str) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(f"unix://{redis_server.unixsocket}?db=2")
        try:
            assert conn.address == redis_server.unixsocket
            await conn.execute("SET", "via", "unix")
            assert await conn.call(Call(SHAPES[2], (), ("ok",))) == b"ok"
        finally:
            await conn.aclose()

    run(scenario())
    with redis_server.client(db=2) as client:
        assert client.get("via") == b"unix"


def test_an_unreachable_server_is_a_store_error(run: Runner[Any], tmp_path: Path, server_binary: str) -> None:
    # Never started: nothing listens on its port.
    server = RedisServer(tmp_path / "gone", binary=server_binary)

    async def scenario() -> None:
        with pytest.raises(StoreError, match="cannot connect"):
            await LeanConnection.open(server.url(0) + "?socket_connect_timeout=1")

    run(scenario())


def test_sentinel_urls_find_the_master(run: Runner[Any], tmp_path: Path, server_binary: str) -> None:
    with (
        RedisServer(tmp_path / "master", binary=server_binary) as master,
        RedisServer(
            tmp_path / "sentinel",
            binary=server_binary,
            sentinel=True,
            config={"sentinel": f"monitor mymaster {master.host} {master.port} 1"},
        ) as sentinel,
    ):

        async def scenario() -> None:
            url = f"redis+sentinel://{sentinel.host}:{sentinel.port}/mymaster?db=3"
            conn = await LeanConnection.open(url, name="via-sentinel")
            try:
                assert conn.address == f"{master.host}:{master.port}"
                await conn.execute("SET", "found", "master")
            finally:
                await conn.aclose()

        run(scenario())
        with master.client(db=3) as client:
            assert client.get("found") == b"master"


def test_sentinel_targets_are_checked_to_be_the_master(
    run: Runner[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_binary: str
) -> None:
    with (
        RedisServer(tmp_path / "master", binary=server_binary) as master,
        RedisServer(
            tmp_path / "replica",
            binary=server_binary,
            config={"replicaof": f"{master.host} {master.port}"},
        ) as replica,
    ):
        target = parse_url("redis+sentinel://127.0.0.1:1/mymaster?db=1")

        async def pretend_sentinel_says(address: tuple[str, int]) -> None:
            async def resolve(_target: object) -> tuple[str, int]:
                return address

            monkeypatch.setattr(hotpath, "resolve_address", resolve)

        async def scenario() -> None:
            await pretend_sentinel_says((master.host, master.port))
            conn = await LeanConnection.open(target)
            assert await conn.execute("PING") == b"PONG"
            await conn.aclose()
            await pretend_sentinel_says((replica.host, replica.port))
            with pytest.raises(StoreError, match="says its role is b'slave'"):
                await LeanConnection.open(target)

        run(scenario())


def _context(url: str) -> ssl.SSLContext:
    target = parse_url(url)
    assert target.tls is not None
    return target.tls.context(target.redacted())


def test_ssl_contexts_follow_the_url_options(tmp_path: Path) -> None:
    strict = _context("rediss://redis.example:6380/0")
    assert strict.verify_mode == ssl.CERT_REQUIRED
    assert strict.check_hostname
    relaxed = _context("rediss://h/0?ssl_cert_reqs=optional&ssl_check_hostname=false")
    assert relaxed.verify_mode == ssl.CERT_OPTIONAL
    assert not relaxed.check_hostname
    off = _context("rediss://h/0?ssl_cert_reqs=none")
    assert off.verify_mode == ssl.CERT_NONE
    assert not off.check_hostname
    with pytest.raises(ConfigError, match="ssl_cert_reqs"):
        _context("rediss://h/0?ssl_cert_reqs=sometimes")
    with pytest.raises(ConfigError, match="cannot load TLS certificates"):
        _context(f"rediss://h/0?ssl_ca_certs={tmp_path}/missing.pem")


# -- timeouts and failures (I4 of docs/design.md) ----------------------------------------


def test_a_timeout_closes_the_connection_and_nothing_is_re_sent(
    run: Runner[Any], private_redis: RedisServer
) -> None:
    url = private_redis.url(0) + "?socket_timeout=0.2"
    with private_redis.client() as admin:
        admin.config_set("lua-time-limit", 50)  # a script running past 50 ms makes Redis answer BUSY

    async def scenario() -> None:
        conn = await LeanConnection.open(url)
        await conn.execute("SCRIPT", "LOAD", INCR_THEN_SPIN.source)  # so PING queues behind it
        slow = asyncio.ensure_future(conn.call(Call(INCR_THEN_SPIN, ("counter",), (1500,))))
        queued = asyncio.ensure_future(conn.execute("PING"))
        with pytest.raises(StoreError, match=r"within 0\.2s.*not re-sent"):
            await slow
        assert busy(private_redis.url(0))  # the timeout surfaced while the script still ran
        with pytest.raises(StoreError, match="not re-sent"):
            await queued
        assert conn.closed
        with pytest.raises(StoreError, match="closed"):
            await conn.execute("PING")
        await conn.aclose()

    run(scenario())
    wait_until(lambda: not busy(private_redis.url(0)), timeout=10, what="the script to finish")
    assert counter(private_redis.url(0)) == 1  # it ran exactly once
    # And nothing is still on its way: the server has let go of the connection under test, which
    # it does only after running all that was sent on it.
    with private_redis.client() as check:
        wait_until(lambda: len(check.client_list()) == 1, timeout=10, what="the test's connection gone")
        assert int(check.get("counter")) == 1


def test_a_per_call_timeout_lets_blocking_commands_wait(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url + "?socket_timeout=0.1")
        try:
            assert await conn.execute("BLPOP", "empty", 0.3, timeout=1.0) is None
            assert await conn.execute("PING") == b"PONG"
            with pytest.raises(ConfigError):
                await conn.execute("PING", timeout=0)
            with pytest.raises(StoreError, match=r"within 0\.1s"):
                await conn.execute("BLPOP", "empty", 0.5)
            assert conn.closed
        finally:
            await conn.aclose()

    run(scenario())


def test_steady_traffic_longer_than_the_timeout_does_not_time_out(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url + "?socket_timeout=0.05")
        try:
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                assert await conn.execute("PING") == b"PONG"
            await asyncio.sleep(0.1)  # idle: no request, nothing to time out
            assert await conn.execute("PING") == b"PONG"
            assert not conn.closed
        finally:
            await conn.aclose()

    run(scenario())


def test_a_server_killed_mid_call_is_a_store_error(run: Runner[Any], private_redis: RedisServer) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(private_redis.url(0))
        idle = await LeanConnection.open(private_redis.url(0))
        call = asyncio.ensure_future(conn.call(Call(INCR_THEN_SPIN, ("counter",), (5000,))))
        await asyncio.sleep(0.2)  # into the script: a Redis running one answers nobody, so nothing to poll
        private_redis.kill()
        with pytest.raises(StoreError, match="lost"):
            await call
        assert conn.closed
        await eventually(lambda: idle.closed, timeout=5, what="the idle connection noticing")
        with pytest.raises(StoreError, match="closed"):
            await idle.execute("PING")
        await conn.aclose()
        await idle.aclose()

    run(scenario())


def test_a_readonly_reply_closes_the_connection(run: Runner[Any], tmp_path: Path, server_binary: str) -> None:
    with (
        RedisServer(tmp_path / "master", binary=server_binary) as master,
        RedisServer(
            tmp_path / "replica",
            binary=server_binary,
            config={"replicaof": f"{master.host} {master.port}"},
        ) as replica,
    ):

        async def scenario() -> None:
            conn = await LeanConnection.open(replica.url(0))
            with pytest.raises(StoreError, match="read-only replica"):
                await conn.execute("SET", "k", "v")
            assert conn.closed
            conn = await LeanConnection.open(replica.url(0))
            with pytest.raises(StoreError, match="read-only replica"):
                await conn.pipeline([Call(COUNT_AND_ECHO, ("counter",), ("x",))])
            assert conn.closed

        run(scenario())


def test_close_fails_waiting_requests(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url, name="closed-while-waiting")
        waiting = asyncio.ensure_future(conn.execute("BLPOP", "empty", 5))
        await eventually(lambda: blocked_in_blpop(redis_url, "closed-while-waiting"), what="BLPOP blocked")
        await conn.aclose()
        with pytest.raises(StoreError, match="closed by its owner"):
            await waiting
        assert conn.closed

    run(scenario())


# -- concurrency -------------------------------------------------------------


def test_concurrent_callers_get_their_own_replies(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url)
        try:

            async def one(i: int) -> None:
                await asyncio.sleep(0.001 * (i % 3))
                if i % 3 == 0:
                    assert await conn.execute("ECHO", f"echo-{i}") == f"echo-{i}".encode()
                elif i % 3 == 1:
                    reply = await conn.call(Call(COUNT_AND_ECHO, ("counter",), (i,)))
                    assert reply[1] == str(i).encode()
                else:
                    replies = await conn.pipeline([Call(SHAPES[2], (), (i, j)) for j in range(3)])
                    assert replies == [str(i).encode()] * 3

            await asyncio.gather(*(one(i) for i in range(300)))
        finally:
            await conn.aclose()

    run(scenario())
    assert counter(redis_url) == 100


def reads_processed(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("stats")["total_reads_processed"])


def test_requests_made_while_one_is_in_flight_go_out_in_one_write(run: Runner[Any], redis_url: str) -> None:
    """Auto-pipelining: Redis reads the 200 requests of one loop iteration in a handful of reads, not 200."""

    async def scenario() -> int:
        conn = await LeanConnection.open(redis_url)
        try:
            before = await asyncio.to_thread(reads_processed, redis_url)
            first = asyncio.ensure_future(conn.execute("ECHO", "first"))
            await asyncio.sleep(0)  # the first one is written alone, at once
            rest = [conn.execute("ECHO", f"e{i}") for i in range(200)]
            replies = await asyncio.gather(first, *rest)
            assert replies == [b"first"] + [f"e{i}".encode() for i in range(200)]
            # INFO itself is one read of its own connection (and one of its connect)
            return await asyncio.to_thread(reads_processed, redis_url) - before
        finally:
            await conn.aclose()

    assert run(scenario()) <= 10


def test_a_cancelled_caller_does_not_shift_the_replies_of_others(run: Runner[Any], redis_url: str) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url, name="cancelled-caller")
        try:
            blocked = asyncio.ensure_future(conn.execute("BLPOP", "empty", 0.2, timeout=2))
            await eventually(lambda: blocked_in_blpop(redis_url, "cancelled-caller"), what="BLPOP blocked")
            blocked.cancel()
            assert await conn.execute("ECHO", "after") == b"after"
            assert not conn.closed
        finally:
            await conn.aclose()

    run(scenario())


def test_without_a_socket_timeout_requests_wait_as_long_as_redis_takes(
    run: Runner[Any], redis_url: str
) -> None:
    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url)
        try:
            assert await conn.execute("BLPOP", "empty", 0.2) is None
            assert await conn.execute("BLPOP", "empty", 0.1, timeout=math.inf) is None
            assert not conn.closed
        finally:
            await conn.aclose()

    run(scenario())


def test_a_call_on_a_transport_closed_under_the_connection_is_not_sent_and_says_so(
    run: Runner[Any], redis_url: str
) -> None:
    """The campaign saw ``RuntimeError: unable to perform operation on <TCPTransport closed=True>``
    and ``AttributeError: 'NoneType' object has no attribute 'writelines'`` from a job's fenced
    write during a cluster failover: a write went out on a connection whose transport had been
    closed under it (before ``connection_lost``). Such a call is a ``NotSent`` (a ``StoreError``
    that provably did not run, which the cluster link sends again), on either event loop."""
    incr = script("return redis.call('INCR', KEYS[1])")

    async def scenario() -> None:
        conn = await LeanConnection.open(redis_url)
        try:
            assert await conn.call(Call(incr, ("closed-under",), ())) == 1
            conn._transport.close()  # type: ignore[union-attr]  # as a failing socket does
            call = Call(incr, ("closed-under",), ())
            with pytest.raises(NotSent):
                await conn.call(call)
            with pytest.raises(NotSent):
                await conn.pipeline([call])
            assert conn.closed or conn._transport is None or conn._transport.is_closing()
        finally:
            await conn.aclose()
        assert counter(redis_url, "closed-under") == 1  # neither ran

    run(scenario())
