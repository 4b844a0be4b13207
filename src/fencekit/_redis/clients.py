"""redis-py clients for a :class:`~fencekit._redis.url.RedisTarget`, with retries off.

Every client built here sends a command once: a lost reply surfaces as
:class:`~fencekit.errors.StoreError` (invariant I4 of ``docs/design.md``),
never as a second send. The hot path does not use these clients: it has its
own connection (:mod:`fencekit._redis.hotpath`).
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.exceptions import RedisError

from fencekit._redis.url import RedisTarget, parse_url
from fencekit.errors import StoreError

__all__ = ["aclose_client", "async_client", "resolve_address", "sync_client"]


def sync_client(target: RedisTarget | str, **overrides: Any) -> redis.Redis:
    """A synchronous redis-py client for ``target`` with retries off."""
    if isinstance(target, str):
        target = parse_url(target)
    kwargs = target.connection_kwargs() | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(), **kwargs
        )
        return cast(redis.Redis, sentinel.master_for(target.master_name, **kwargs))  # type: ignore[no-untyped-call]
    return redis.Redis(**kwargs)


def async_client(target: RedisTarget | str, **overrides: Any) -> redis.asyncio.Redis:
    """An asyncio redis-py client for ``target`` with retries off."""
    if isinstance(target, str):
        target = parse_url(target)
    kwargs = target.connection_kwargs() | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(), **kwargs
        )
        return cast(redis.asyncio.Redis, sentinel.master_for(target.master_name, **kwargs))
    return redis.asyncio.Redis(**kwargs)


async def resolve_address(target: RedisTarget) -> tuple[str, int] | str:
    """Where the master is now: ``(host, port)``, or a socket path for ``unix://``.

    For Sentinel this asks the sentinels (each is tried; one that is down is
    skipped); raises :class:`StoreError` when none knows the master.
    """
    if target.path is not None:
        return target.path
    if not target.is_sentinel:
        return (target.host, target.port)
    assert target.master_name is not None
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs()
    )
    try:
        host, port = await sentinel.discover_master(target.master_name)
    except (RedisError, OSError) as exc:
        raise StoreError(f"no sentinel knows master {target.master_name!r}: {exc}") from exc
    finally:
        for conn in sentinel.sentinels:
            await conn.aclose()
    return (str(host), int(port))


async def aclose_client(client: redis.asyncio.Redis) -> None:
    """Close an asyncio client, and the sentinel connections of a Sentinel-managed one."""
    await client.aclose()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()
