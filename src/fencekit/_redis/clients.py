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

from fencekit._redis.sentinel import MasterWatch, newest_master
from fencekit._redis.sentinel_pool import (
    ROLE_RECHECK,
    RoleCheckedConnection,
    SyncRoleCheckedConnection,
    WatchedRedis,
    WatchedSentinelPool,
    WatchedSyncSentinelPool,
    WatchThread,
)
from fencekit._redis.url import RedisTarget, parse_url

__all__ = [
    "aclose_client",
    "async_client",
    "close_sync_client",
    "connect",
    "connect_async",
    "loopless_client",
    "resolve_address",
    "sync_client",
    "watch_of",
]


def sync_client(target: RedisTarget | str, **overrides: Any) -> redis.Redis:
    """A synchronous redis-py client for ``target`` with retries off.

    For a Sentinel target it follows the master as the asyncio clients do: a
    :class:`~fencekit._redis.sentinel.MasterWatch` on a thread of its own
    (started at first use, stopped by ``close()``) drops every connection
    when the master is moving, and connections check ``ROLE``.
    """
    if isinstance(target, str):
        target = parse_url(target)
    kwargs = target.connection_kwargs() | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(), **kwargs
        )
        client = sentinel.master_for(  # type: ignore[no-untyped-call]
            target.master_name,
            redis_class=WatchedRedis,
            connection_pool_class=WatchedSyncSentinelPool,
            connection_class=SyncRoleCheckedConnection,
            watcher=WatchThread(target),
            health_check_interval=ROLE_RECHECK,
            **kwargs,
        )
        return cast(redis.Redis, client)
    return redis.Redis(**kwargs)


def loopless_client(target: RedisTarget | str, **overrides: Any) -> redis.Redis:
    """A synchronous redis-py client with retries off that runs no event loop, not even in a thread.

    For ``SyncClient`` (WSGI workers, scripts, Celery tasks). Behind Sentinel
    it follows the master as far as redis-py's synchronous Sentinel allows,
    without the :class:`~fencekit._redis.sentinel.MasterWatch` of
    :func:`sync_client`: each new connection asks the sentinels where the
    master is and checks ``ROLE`` (so does a connection idle for
    :data:`~fencekit._redis.sentinel_pool.ROLE_RECHECK` s), and a ``READONLY``
    reply from a demoted master drops the connection. What it lacks is the
    watch's early move: a connection in steady use keeps writing to the old
    master until the sentinels demote it (their INFO period, about ten
    seconds), instead of refusing writes from the moment a promotion starts.
    Close it with :func:`close_sync_client`.
    """
    if isinstance(target, str):
        target = parse_url(target)
    kwargs = target.connection_kwargs() | overrides
    if not target.is_sentinel:
        return redis.Redis(**kwargs)
    assert target.master_name is not None
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(), **kwargs
    )
    client = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.master_name,
        connection_class=SyncRoleCheckedConnection,
        health_check_interval=ROLE_RECHECK,
        **kwargs,
    )
    return cast(redis.Redis, client)


def close_sync_client(client: redis.Redis) -> None:
    """Close a synchronous client, and the sentinel connections of a Sentinel-managed one."""
    client.close()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()


def connect(url: str, **overrides: Any) -> redis.Redis:
    """A synchronous redis-py client for any fencekit URL, for the primitives.

    ``redis://``, ``rediss://``, ``unix://`` or ``redis+sentinel://``, with
    fencekit's rules: no command re-sent, and behind Sentinel the master
    followed through a failover (the old master left at once). ``overrides``
    are redis-py connection arguments (``decode_responses=True``, ...).
    """
    return sync_client(url, **overrides)


def connect_async(url: str, **overrides: Any) -> redis.asyncio.Redis:
    """The asyncio twin of :func:`connect` (close it with ``await client.aclose()``)."""
    return async_client(url, **overrides)


def async_client(target: RedisTarget | str, **overrides: Any) -> redis.asyncio.Redis:
    """An asyncio redis-py client for ``target`` with retries off.

    For a Sentinel target its pool follows a :class:`~fencekit._redis.sentinel.MasterWatch`
    (:func:`watch_of`), which leaves a demoted master at once; close it with
    :func:`aclose_client`.
    """
    if isinstance(target, str):
        target = parse_url(target)
    kwargs = target.connection_kwargs() | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(), **kwargs
        )
        client = sentinel.master_for(
            target.master_name,
            connection_pool_class=WatchedSentinelPool,
            connection_class=RoleCheckedConnection,
            watch=MasterWatch(target),
            health_check_interval=ROLE_RECHECK,
            **kwargs,
        )
        return cast(redis.asyncio.Redis, client)
    return redis.asyncio.Redis(**kwargs)


def watch_of(client: redis.asyncio.Redis) -> MasterWatch | None:
    """The master watch of a client made by :func:`async_client` for a Sentinel target, else None."""
    watch = getattr(client.connection_pool, "watch", None)
    return watch if isinstance(watch, MasterWatch) else None


async def resolve_address(target: RedisTarget) -> tuple[str, int] | str:
    """Where the master is now: ``(host, port)``, or a socket path for ``unix://``.

    For Sentinel this asks every sentinel and takes the address named with
    the highest config epoch (one that is down is skipped, one that lags
    loses); raises :class:`StoreError` when none knows the master.
    """
    if target.path is not None:
        return target.path
    if not target.is_sentinel:
        return (target.host, target.port)
    return await newest_master(target)


async def aclose_client(client: redis.asyncio.Redis) -> None:
    """Close an asyncio client, and the sentinel connections and master watch of a Sentinel-managed one."""
    await client.aclose()  # a watched Sentinel pool stops its master watch too
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()
