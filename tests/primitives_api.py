"""The primitives' test adapter: one scenario, both APIs.

``Api`` builds the sync or the asyncio primitives; ``await api(x)`` awaits only
when ``x`` is awaitable, so a scenario written once runs against
``DistributedLock``/``AsyncDistributedLock`` (and the guard and gate twins).
The ``api`` and ``raw`` fixtures live in ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis
import redis.asyncio

from fencekit.primitives.fence import AsyncFenceGate, FenceGate
from fencekit.primitives.idempotency import AsyncIdempotencyGuard, IdempotencyGuard
from fencekit.primitives.lock import AsyncDistributedLock, DistributedLock
from fencekit.primitives.tokens import LockHandle
from fencekit.testing import wait_until


class Api:
    """Builds the sync or the asyncio primitives; ``await api(x)`` awaits only if needed."""

    def __init__(self, kind: str, decode: bool, url: str) -> None:
        self.kind, self.decode, self.url = kind, decode, url
        self.is_async = kind == "async"
        self._clients: list[Any] = []
        self.client = self.connect(url)

    def connect(self, url: str | None = None) -> Any:
        """A new client of this API's kind (its own connection pool)."""
        factory = redis.asyncio.Redis if self.is_async else redis.Redis
        client = factory.from_url(url or self.url, decode_responses=self.decode)
        self._clients.append(client)
        return client

    def lock(self, client: Any = None, **kwargs: Any) -> Any:
        cls = AsyncDistributedLock if self.is_async else DistributedLock
        return cls(client or self.client, **kwargs)

    def gate(self, client: Any = None, **kwargs: Any) -> Any:
        cls = AsyncFenceGate if self.is_async else FenceGate
        return cls(client or self.client, **kwargs)

    def guard(self, client: Any = None, **kwargs: Any) -> Any:
        cls = AsyncIdempotencyGuard if self.is_async else IdempotencyGuard
        return cls(client or self.client, **kwargs)

    async def __call__(self, value: Any) -> Any:
        return await value if inspect.isawaitable(value) else value

    @asynccontextmanager
    async def hold(self, lock: Any, resource: str, **kwargs: Any) -> AsyncIterator[LockHandle]:
        if self.is_async:
            async with lock.hold(resource, **kwargs) as handle:
                yield handle
        else:
            with lock.hold(resource, **kwargs) as handle:
                yield handle

    async def race(self, n: int, contender: Callable[[Any], Any]) -> list[Any]:
        """Run ``contender(own_client)`` n times at once (threads or tasks).

        Returns each contender's result or exception.
        """
        clients = [self.connect() for _ in range(n)]
        if self.is_async:
            for client in clients:
                await client.ping()

            async def one(client: Any) -> Any:
                try:
                    return await contender(client)
                except Exception as exc:
                    return exc

            return list(await asyncio.gather(*(one(c) for c in clients)))
        results: list[Any] = [None] * n
        barrier = threading.Barrier(n)

        def run(i: int) -> None:
            clients[i].ping()
            barrier.wait()
            try:
                results[i] = contender(clients[i])
            except Exception as exc:
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return results

    async def close(self) -> None:
        for client in self._clients:
            await self(client.aclose() if self.is_async else client.close())


def expired(raw: redis.Redis, key: str) -> None:
    """Wait (without a fixed sleep) until Redis has expired ``key``."""
    wait_until(lambda: not raw.exists(key), timeout=30, what=f"{key} to expire")
