"""DistributedLock and AsyncDistributedLock on a real Redis.

Every scenario is written once and runs against both APIs (sync and asyncio)
and both ``decode_responses`` modes through the ``api`` adapter; Redis is read
directly (``raw``) to check what happened, not the code under test.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio
from tests.primitives_api import Api, expired

from fencekit.errors import ConfigError, LockNotAcquired, LockNotOwned, StoreError
from fencekit.primitives.lock import AsyncDistributedLock, DistributedLock
from fencekit.primitives.tokens import FenceToken, LockHandle
from fencekit.testing import RedisServer

TTL = timedelta(seconds=30)
SHORT = timedelta(milliseconds=200)


async def test_acquire_grants_a_lease_and_a_fencing_token(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    handle = await api(lock.acquire("batch-42", ttl=TTL, owner_id="worker-1"))

    assert isinstance(handle, LockHandle)
    assert handle.resource == "batch-42"
    assert handle.owner_id == "worker-1"
    assert handle.ttl == TTL
    assert handle.token == FenceToken(handle.token.value, "batch-42")
    assert lock.lock_key("batch-42") == "fencekit:lock:{batch-42}"
    assert raw.get("fencekit:lock:{batch-42}") == f"{handle.token.value}:worker-1"
    assert 0 < raw.pttl("fencekit:lock:{batch-42}") <= 30_000
    assert raw.get("fencekit:lock:{batch-42}:seq") == str(handle.token.value)


async def test_owner_id_defaults_to_a_fresh_uuid4_hex(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    first = await api(lock.acquire("a", ttl=TTL))
    second = await api(lock.acquire("b", ttl=TTL))
    assert uuid.UUID(hex=first.owner_id).version == 4
    assert first.owner_id == uuid.UUID(hex=first.owner_id).hex
    assert first.owner_id != second.owner_id
    assert raw.get(lock.lock_key("a")) == f"{first.token.value}:{first.owner_id}"


async def test_tokens_grow_with_every_grant(api: Api) -> None:
    lock = api.lock()
    tokens = []
    for _ in range(5):
        handle = await api(lock.acquire("r", ttl=TTL))
        tokens.append(handle.token.value)
        await api(lock.release(handle))
    assert tokens == sorted(set(tokens))
    assert len(set(tokens)) == 5


async def test_tokens_keep_growing_when_the_token_counter_is_lost(api: Api, raw: redis.Redis) -> None:
    """A failover that lost the counter's last writes (I2): the next grant still outgrows the last
    one, from the Redis clock in µs that a token is at least."""
    lock = api.lock()
    first = await api(lock.acquire("r", ttl=TTL))
    await api(lock.release(first))
    raw.delete(lock.lock_key("r") + ":seq")
    seconds, micros = raw.time()
    before = int(seconds) * 1_000_000 + int(micros)
    second = await api(lock.acquire("r", ttl=TTL))
    assert second.token.value > first.token.value
    assert second.token.value >= before
    assert raw.get(lock.lock_key("r") + ":seq") == str(second.token.value)


async def test_a_held_lock_refuses_a_second_owner_and_issues_no_token(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    first = await api(lock.acquire("r", ttl=TTL, owner_id="a"))
    with pytest.raises(LockNotAcquired, match="'r'"):
        await api(lock.acquire("r", ttl=TTL, owner_id="b"))
    with pytest.raises(LockNotAcquired):
        await api(lock.acquire("r", ttl=TTL, owner_id="a"))  # not re-entrant either
    assert raw.get(lock.lock_key("r")) == f"{first.token.value}:a"
    assert raw.get(lock.lock_key("r") + ":seq") == str(first.token.value)


async def test_blocking_acquire_gets_the_lock_once_the_lease_ends(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    first = await api(lock.acquire("r", ttl=SHORT, owner_id="a"))
    second = await api(
        lock.acquire(
            "r",
            ttl=TTL,
            owner_id="b",
            blocking=True,
            wait=timedelta(seconds=30),
            retry_interval=timedelta(milliseconds=20),
        )
    )
    assert second.token.value > first.token.value
    assert raw.get(lock.lock_key("r")) == f"{second.token.value}:b"


async def test_blocking_acquire_gives_up_after_wait(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    first = await api(lock.acquire("r", ttl=TTL, owner_id="a"))
    with pytest.raises(LockNotAcquired, match="within"):
        await api(
            lock.acquire(
                "r",
                ttl=TTL,
                owner_id="b",
                blocking=True,
                wait=timedelta(milliseconds=150),
                retry_interval=timedelta(milliseconds=30),
            )
        )
    assert raw.get(lock.lock_key("r")) == f"{first.token.value}:a"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ttl": timedelta(0)}, ConfigError, "ttl must be positive"),
        ({"ttl": timedelta(seconds=-1)}, ConfigError, "ttl must be positive"),
        ({"ttl": 30}, TypeError, "timedelta"),
        ({"ttl": TTL, "blocking": True}, ConfigError, "needs wait"),
        ({"ttl": TTL, "wait": TTL}, ConfigError, "only applies with blocking=True"),
        ({"ttl": TTL, "blocking": True, "wait": 5}, TypeError, "timedelta"),
        (
            {"ttl": TTL, "blocking": True, "wait": TTL, "retry_interval": timedelta(0)},
            ConfigError,
            "retry_interval",
        ),
        ({"ttl": TTL, "owner_id": ""}, ConfigError, "owner_id"),
    ],
)
async def test_bad_arguments_are_refused_before_redis_is_touched(
    api: Api, raw: redis.Redis, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    lock = api.lock()
    with pytest.raises(error, match=message):
        await api(lock.acquire("r", **kwargs))
    assert raw.keys("*") == []


@pytest.mark.parametrize("resource", ["", "has space", "tab\t", 42])
async def test_bad_resource_names_are_refused(api: Api, resource: Any) -> None:
    with pytest.raises(ConfigError, match="resource"):
        await api(api.lock().acquire(resource, ttl=TTL))


async def test_release_ends_the_lease_once(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    handle = await api(lock.acquire("r", ttl=TTL))
    await api(lock.release(handle))
    assert not raw.exists(lock.lock_key("r"))
    with pytest.raises(LockNotOwned):
        await api(lock.release(handle))
    again = await api(lock.acquire("r", ttl=TTL))
    assert again.token.value > handle.token.value


async def test_extend_restarts_the_lease_with_the_same_token(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    handle = await api(lock.acquire("r", ttl=timedelta(seconds=5)))
    extended = await api(lock.extend(handle, ttl=timedelta(hours=1)))
    assert extended.token == handle.token
    assert extended.owner_id == handle.owner_id
    assert extended.ttl == timedelta(hours=1)
    assert raw.pttl(lock.lock_key("r")) > 5_000
    assert raw.get(lock.lock_key("r")) == f"{handle.token.value}:{handle.owner_id}"
    await api(lock.release(extended))
    assert not raw.exists(lock.lock_key("r"))


async def test_an_expired_lease_cannot_be_extended_or_revived(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    handle = await api(lock.acquire("r", ttl=SHORT))
    expired(raw, lock.lock_key("r"))
    with pytest.raises(LockNotOwned):
        await api(lock.extend(handle, ttl=TTL))
    assert not raw.exists(lock.lock_key("r"))


async def test_a_stale_holder_cannot_release_or_extend_the_new_holders_lease(
    api: Api, raw: redis.Redis
) -> None:
    # Both grants use the same owner id: the token alone tells them apart.
    lock = api.lock()
    stale = await api(lock.acquire("r", ttl=SHORT, owner_id="worker"))
    expired(raw, lock.lock_key("r"))
    current = await api(lock.acquire("r", ttl=timedelta(seconds=20), owner_id="worker"))
    assert current.token.value > stale.token.value

    with pytest.raises(LockNotOwned):
        await api(lock.release(stale))
    with pytest.raises(LockNotOwned):
        await api(lock.extend(stale, ttl=timedelta(hours=1)))

    assert raw.get(lock.lock_key("r")) == f"{current.token.value}:worker"
    assert 0 < raw.pttl(lock.lock_key("r")) <= 20_000
    await api(lock.release(current))
    assert not raw.exists(lock.lock_key("r"))


async def test_a_handle_with_another_owner_id_is_not_the_holder(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    handle = await api(lock.acquire("r", ttl=TTL, owner_id="a"))
    forged = LockHandle("r", "b", handle.token, TTL)
    with pytest.raises(LockNotOwned):
        await api(lock.release(forged))
    with pytest.raises(LockNotOwned):
        await api(lock.extend(forged, ttl=TTL))
    assert raw.get(lock.lock_key("r")) == f"{handle.token.value}:a"


async def test_release_and_extend_want_a_handle(api: Api) -> None:
    lock = api.lock()
    with pytest.raises(TypeError, match="LockHandle"):
        await api(lock.release("r"))
    with pytest.raises(TypeError, match="LockHandle"):
        await api(lock.extend(object(), ttl=TTL))


async def test_hold_releases_on_exit(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    async with api.hold(lock, "r", ttl=TTL, owner_id="w") as handle:
        assert raw.get(lock.lock_key("r")) == f"{handle.token.value}:w"
    assert not raw.exists(lock.lock_key("r"))


async def test_hold_releases_when_the_body_raises(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    with pytest.raises(RuntimeError, match="boom"):
        async with api.hold(lock, "r", ttl=TTL):
            raise RuntimeError("boom")
    assert not raw.exists(lock.lock_key("r"))


async def test_hold_does_not_mask_the_body_error_when_the_lease_was_lost(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()

    async def lose_the_lease_then_fail() -> None:
        async with api.hold(lock, "r", ttl=SHORT):
            expired(raw, lock.lock_key("r"))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom") as info:
        await lose_the_lease_then_fail()
    assert any("releasing the lock also failed" in note for note in info.value.__notes__)


async def test_hold_reports_a_lost_lease_when_the_body_succeeded(api: Api, raw: redis.Redis) -> None:
    lock = api.lock()
    with pytest.raises(LockNotOwned):
        async with api.hold(lock, "r", ttl=SHORT):
            expired(raw, lock.lock_key("r"))


async def test_hold_raises_lock_not_acquired_without_running_the_body(api: Api) -> None:
    lock = api.lock()
    await api(lock.acquire("r", ttl=TTL))
    ran = False
    with pytest.raises(LockNotAcquired):
        async with api.hold(lock, "r", ttl=TTL):
            ran = True
    assert not ran


async def test_prefix_names_every_key(api: Api, raw: redis.Redis) -> None:
    lock = api.lock(prefix="app")
    assert lock.prefix == "app"
    handle = await api(lock.acquire("r", ttl=TTL))
    assert sorted(raw.keys("*")) == ["app:lock:{r}", "app:lock:{r}:seq"]
    assert raw.get("app:lock:{r}") == f"{handle.token.value}:{handle.owner_id}"
    # A resource carrying its own hash tag keeps it.
    assert lock.lock_key("{batch}:x") == "app:lock:{batch}:x"
    with pytest.raises(ConfigError, match="braces"):
        api.lock(prefix="{bad}")


async def test_n_concurrent_contenders_exactly_one_wins(api: Api, raw: redis.Redis) -> None:
    n = 16
    results = await api.race(n, lambda client: api.lock(client).acquire("hot", ttl=TTL))
    winners = [r for r in results if isinstance(r, LockHandle)]
    losers = [r for r in results if isinstance(r, LockNotAcquired)]
    assert len(winners) == 1
    assert len(losers) == n - 1
    (winner,) = winners
    assert raw.get("fencekit:lock:{hot}") == f"{winner.token.value}:{winner.owner_id}"
    assert raw.get("fencekit:lock:{hot}:seq") == str(winner.token.value)


def _process_contender(url: str, decode: bool, is_async: bool, start: Any, results: Any) -> None:
    """One spawned process: its own client, wait at the barrier, try once."""

    async def attempt_async() -> str:
        client = redis.asyncio.Redis.from_url(url, decode_responses=decode)
        try:
            await client.ping()
            start.wait(120)
            try:
                handle = await AsyncDistributedLock(client).acquire("hot", ttl=TTL)
            except LockNotAcquired:
                return "lost"
            return f"won {handle.token.value}:{handle.owner_id}"
        finally:
            await client.aclose()

    def attempt_sync() -> str:
        client = redis.Redis.from_url(url, decode_responses=decode)
        try:
            client.ping()
            start.wait(120)
            try:
                handle = DistributedLock(client).acquire("hot", ttl=TTL)
            except LockNotAcquired:
                return "lost"
            return f"won {handle.token.value}:{handle.owner_id}"
        finally:
            client.close()

    try:
        results.put(asyncio.run(attempt_async()) if is_async else attempt_sync())
    except Exception as exc:
        results.put(f"error {exc!r}")


async def test_n_processes_racing_exactly_one_wins(api: Api, raw: redis.Redis) -> None:
    n = 6
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(n + 1)
    results = ctx.Queue()
    args = (api.url, api.decode, api.is_async, start, results)
    procs = [ctx.Process(target=_process_contender, args=args) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        start.wait(120)  # every contender is connected and waiting: go
        outcomes = [results.get(timeout=60) for _ in range(n)]
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
        results.join_thread()
    assert all(proc.exitcode == 0 for proc in procs)
    wins = [o for o in outcomes if o.startswith("won ")]
    assert len(wins) == 1, outcomes
    assert outcomes.count("lost") == n - 1, outcomes
    assert raw.get("fencekit:lock:{hot}") == wins[0].removeprefix("won ")


async def test_redis_errors_surface_as_store_error(api: Api, private_redis: RedisServer) -> None:
    lock = api.lock(api.connect(private_redis.url()))
    handle = await api(lock.acquire("r", ttl=TTL))
    private_redis.kill()
    calls: list[Callable[[], Any]] = [
        lambda: lock.acquire("r2", ttl=TTL),
        lambda: lock.release(handle),
        lambda: lock.extend(handle, ttl=TTL),
    ]
    for call in calls:
        with pytest.raises(StoreError):
            await api(call())


async def test_the_wrong_kind_of_client_is_refused(api: Api) -> None:
    other = redis.Redis() if api.is_async else redis.asyncio.Redis()
    cls = AsyncDistributedLock if api.is_async else DistributedLock
    with pytest.raises(TypeError, match="client"):
        cls(other)
    with pytest.raises(TypeError):
        cls(object())
    await api(other.aclose() if not api.is_async else other.close())
