"""FenceGate and AsyncFenceGate on a real Redis, with the stale-holder race.

Every scenario runs against both APIs and both ``decode_responses`` modes
through the ``api`` adapter; outcomes are checked by reading Redis directly.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio
from tests.primitives_api import Api, expired

from fencekit.errors import ConfigError, FencedOutError, LockNotOwned, StoreError
from fencekit.primitives.tokens import FenceToken
from fencekit.testing import RedisServer

TTL = timedelta(seconds=30)
SHORT = timedelta(milliseconds=200)
FENCE = "fencekit:fence:{batch-42}"
TARGET = "{batch-42}:status"


def token(value: int, resource: str = "batch-42") -> FenceToken:
    return FenceToken(value, resource)


async def test_a_stale_holder_is_fenced_out_and_changes_nothing(api: Api, raw: redis.Redis) -> None:
    """The seed's race: A's lease expires while B acquires a larger token."""
    lock, gate = api.lock(), api.gate()

    a = await api(lock.acquire("batch-42", ttl=SHORT, owner_id="worker"))
    await api(gate.set_if_fresh(a.token, TARGET, "a: started"))
    assert raw.get(TARGET) == "a: started"

    # A pauses; its lease expires; B (same owner id, a new grant) takes over.
    expired(raw, lock.lock_key("batch-42"))
    b = await api(lock.acquire("batch-42", ttl=timedelta(seconds=20), owner_id="worker"))
    assert b.token.value > a.token.value
    await api(gate.set_if_fresh(b.token, TARGET, "b: running"))

    # A wakes up and carries on as if it still held the lock.
    with pytest.raises(FencedOutError):
        await api(gate.set_if_fresh(a.token, TARGET, "a: finished"))
    with pytest.raises(FencedOutError):
        await api(gate.check_and_advance(a.token))
    with pytest.raises(FencedOutError):
        await api(gate.check(a.token))
    with pytest.raises(LockNotOwned):
        await api(lock.extend(a, ttl=timedelta(hours=1)))
    with pytest.raises(LockNotOwned):
        await api(lock.release(a))

    # Nothing A did after the takeover landed.
    assert raw.get(TARGET) == "b: running"
    assert raw.get(FENCE) == str(b.token.value)
    assert await api(gate.current_max("batch-42")) == b.token.value
    assert raw.get(lock.lock_key("batch-42")) == f"{b.token.value}:worker"
    assert 0 < raw.pttl(lock.lock_key("batch-42")) <= 20_000

    # B is unaffected and finishes normally.
    await api(gate.set_if_fresh(b.token, TARGET, "b: done"))
    await api(lock.release(b))
    assert raw.get(TARGET) == "b: done"
    assert not raw.exists(lock.lock_key("batch-42"))


async def test_set_if_fresh_writes_and_advances_the_fence(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    await api(gate.set_if_fresh(token(100), TARGET, "v1"))
    assert raw.get(TARGET) == "v1"
    assert raw.get(FENCE) == "100"
    assert raw.ttl(FENCE) == -1  # no fence_ttl: the fence never forgets


async def test_equal_tokens_pass_so_one_grant_may_write_many_times(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    for i in range(3):
        await api(gate.set_if_fresh(token(100), TARGET, f"v{i}"))
    await api(gate.check_and_advance(token(100)))
    assert await api(gate.check(token(100))) == 100
    assert raw.get(TARGET) == "v2"
    assert raw.get(FENCE) == "100"


async def test_an_older_token_changes_nothing(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    await api(gate.set_if_fresh(token(100), TARGET, "new"))
    with pytest.raises(FencedOutError, match="99"):
        await api(gate.set_if_fresh(token(99), TARGET, "old"))
    with pytest.raises(FencedOutError):
        await api(gate.set_if_fresh(token(1), "{batch-42}:other", "old"))
    assert raw.get(TARGET) == "new"
    assert not raw.exists("{batch-42}:other")
    assert raw.get(FENCE) == "100"


async def test_a_newer_token_passes_and_raises_the_fence(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    await api(gate.set_if_fresh(token(100), TARGET, "a"))
    await api(gate.set_if_fresh(token(2**52), TARGET, "b"))
    assert raw.get(TARGET) == "b"
    assert raw.get(FENCE) == str(2**52)


@pytest.mark.parametrize(
    ("value", "stored"),
    [("text", "text"), (b"\x00bytes\xff", None), (42, "42"), (1.5, "1.5"), ("", "")],
    ids=["str", "bytes", "int", "float", "empty"],
)
async def test_set_if_fresh_stores_str_bytes_int_and_float(
    api: Api, redis_url: str, value: Any, stored: str | None
) -> None:
    await api(api.gate().set_if_fresh(token(7), TARGET, value))
    with redis.Redis.from_url(redis_url) as binary:
        expected = value if isinstance(value, bytes) else stored.encode()  # type: ignore[union-attr]
        assert binary.get(TARGET) == expected


@pytest.mark.parametrize(
    "value",
    [True, None, [1], {"a": 1}, object()],
    ids=lambda v: type(v).__name__ if type(v) is object else repr(v),
)
async def test_set_if_fresh_refuses_other_values(api: Api, raw: redis.Redis, value: Any) -> None:
    with pytest.raises(TypeError, match="value must be"):
        await api(api.gate().set_if_fresh(token(7), TARGET, value))
    assert raw.keys("*") == []


async def test_the_target_cannot_be_the_fence_key(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    with pytest.raises(ConfigError, match="fence key"):
        await api(gate.set_if_fresh(token(7), gate.fence_key("batch-42"), "x"))
    with pytest.raises(ConfigError, match="key"):
        await api(gate.set_if_fresh(token(7), "", "x"))
    assert raw.keys("*") == []


async def test_a_token_must_be_a_fence_token(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    for bad in (100, "100", None):
        with pytest.raises(TypeError, match="FenceToken"):
            await api(gate.set_if_fresh(bad, TARGET, "x"))
        with pytest.raises(TypeError, match="FenceToken"):
            await api(gate.check(bad))
        with pytest.raises(TypeError, match="FenceToken"):
            await api(gate.check_and_advance(bad))
    assert raw.keys("*") == []


async def test_check_is_diagnostic_and_does_not_advance(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    assert await api(gate.check(token(50))) == 0
    assert not raw.exists(FENCE)
    await api(gate.check_and_advance(token(60)))
    assert await api(gate.check(token(70))) == 60
    assert raw.get(FENCE) == "60"
    with pytest.raises(FencedOutError):
        await api(gate.check(token(59)))


async def test_check_and_advance_records_the_newest_token(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    await api(gate.check_and_advance(token(10)))
    await api(gate.check_and_advance(token(30)))
    with pytest.raises(FencedOutError):
        await api(gate.check_and_advance(token(20)))
    assert raw.get(FENCE) == "30"
    assert raw.keys("*") == [FENCE]


async def test_current_max_is_zero_until_a_token_is_accepted(api: Api) -> None:
    gate = api.gate()
    assert await api(gate.current_max("batch-42")) == 0
    await api(gate.check_and_advance(token(5)))
    assert await api(gate.current_max("batch-42")) == 5
    assert await api(gate.current_max("other")) == 0


async def test_each_resource_has_its_own_fence(api: Api, raw: redis.Redis) -> None:
    gate = api.gate()
    await api(gate.check_and_advance(token(1000, "a")))
    await api(gate.check_and_advance(token(5, "b")))
    assert raw.get("fencekit:fence:{a}") == "1000"
    assert raw.get("fencekit:fence:{b}") == "5"


async def test_fence_ttl_puts_an_expiry_on_the_fence_key(api: Api, raw: redis.Redis) -> None:
    gate = api.gate(fence_ttl=timedelta(hours=1))
    await api(gate.set_if_fresh(token(5), TARGET, "x"))
    assert 0 < raw.pttl(FENCE) <= 3_600_000
    assert raw.ttl(TARGET) == -1
    await api(gate.check_and_advance(token(6)))
    assert 0 < raw.pttl(FENCE) <= 3_600_000
    with pytest.raises(ConfigError, match="fence_ttl"):
        api.gate(fence_ttl=timedelta(0))


async def test_prefix_names_the_fence_key(api: Api, raw: redis.Redis) -> None:
    gate = api.gate(prefix="app")
    assert gate.prefix == "app"
    await api(gate.check_and_advance(token(3)))
    assert raw.keys("*") == ["app:fence:{batch-42}"]


async def test_tokens_from_the_lock_pass_the_gate_in_grant_order(api: Api, raw: redis.Redis) -> None:
    lock, gate = api.lock(), api.gate()
    grants = []
    for _ in range(3):
        handle = await api(lock.acquire("batch-42", ttl=TTL))
        await api(gate.set_if_fresh(handle.token, TARGET, str(handle.token.value)))
        await api(lock.release(handle))
        grants.append(handle)
    for old in grants[:-1]:
        with pytest.raises(FencedOutError):
            await api(gate.set_if_fresh(old.token, TARGET, "stale"))
    assert raw.get(TARGET) == str(grants[-1].token.value)


async def test_concurrent_writers_the_newest_token_wins(api: Api, raw: redis.Redis) -> None:
    n = 12
    base = 1_000_000

    def writer(i: int) -> Callable[[Any], Any]:
        return lambda client: api.gate(client).set_if_fresh(token(base + i), TARGET, str(i))

    counter = iter(range(n))
    results = await api.race(n, lambda client: writer(next(counter))(client))
    assert len(results) == n
    assert all(r is None or isinstance(r, FencedOutError) for r in results), results
    assert raw.get(FENCE) == str(base + n - 1)
    assert raw.get(TARGET) == str(n - 1)


async def test_redis_errors_surface_as_store_error(api: Api, private_redis: RedisServer) -> None:
    gate = api.gate(api.connect(private_redis.url()))
    await api(gate.check_and_advance(token(5)))
    private_redis.kill()
    calls: list[Callable[[], Any]] = [
        lambda: gate.set_if_fresh(token(6), TARGET, "x"),
        lambda: gate.check(token(6)),
        lambda: gate.check_and_advance(token(6)),
        lambda: gate.current_max("batch-42"),
    ]
    for call in calls:
        with pytest.raises(StoreError):
            await api(call())
