"""Micro-benchmarks of the primitives: ``idempotency_key``, lock acquire+release, ``FenceGate.set_if_fresh``.

Sync primitives run on ``redis.Redis``, the asyncio twins on ``redis.asyncio.Redis``
(one uvloop loop per module), against a private Redis. One benchmark call is one
operation (one round trip for the fence, two for acquire+release).

    python -m pytest bench/bench_primitives.py --benchmark-only
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio

from fencekit import (
    AsyncDistributedLock,
    AsyncFenceGate,
    DistributedLock,
    FenceGate,
    idempotency_key,
)
from fencekit.testing import RedisServer

PAYLOAD = {
    "order": 4242,
    "customer": "c-17",
    "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-9", "qty": 1}],
    "total": "31.40",
    "currency": "EUR",
}
TTL = timedelta(seconds=30)


@pytest.fixture(scope="module")
def sync_client(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def async_client(server: RedisServer, loop: asyncio.AbstractEventLoop) -> Iterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(server.url())
    yield client
    loop.run_until_complete(client.aclose())


def test_idempotency_key(benchmark: Any) -> None:
    benchmark.group = "idempotency_key"
    key = benchmark(idempotency_key, PAYLOAD, namespace="orders")
    assert key.startswith("orders:")


def test_lock_acquire_release_sync(benchmark: Any, sync_client: redis.Redis) -> None:
    benchmark.group = "lock acquire+release"
    lock = DistributedLock(sync_client)

    def cycle() -> None:
        lock.release(lock.acquire("bench-resource", ttl=TTL))

    benchmark(cycle)


def test_lock_acquire_release_async(
    benchmark: Any, async_client: redis.asyncio.Redis, loop: asyncio.AbstractEventLoop
) -> None:
    benchmark.group = "lock acquire+release"
    lock = AsyncDistributedLock(async_client)

    async def cycle() -> None:
        await lock.release(await lock.acquire("bench-resource-a", ttl=TTL))

    benchmark(lambda: loop.run_until_complete(cycle()))


def test_fence_set_if_fresh_sync(benchmark: Any, sync_client: redis.Redis) -> None:
    benchmark.group = "FenceGate.set_if_fresh"
    token = DistributedLock(sync_client).acquire("bench-fence", ttl=timedelta(hours=1)).token
    gate = FenceGate(sync_client)
    values = itertools.count()
    benchmark(lambda: gate.set_if_fresh(token, "{bench-fence}:value", next(values)))


def test_fence_set_if_fresh_async(
    benchmark: Any, async_client: redis.asyncio.Redis, loop: asyncio.AbstractEventLoop
) -> None:
    benchmark.group = "FenceGate.set_if_fresh"
    lock = AsyncDistributedLock(async_client)
    token = loop.run_until_complete(lock.acquire("bench-fence-a", ttl=timedelta(hours=1))).token
    gate = AsyncFenceGate(async_client)
    values = itertools.count()
    benchmark(
        lambda: loop.run_until_complete(gate.set_if_fresh(token, "{bench-fence-a}:value", next(values)))
    )
