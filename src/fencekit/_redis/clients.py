"""redis-py clients for a :class:`~fencekit._redis.url.RedisTarget`, with retries off.

A ``redis+cluster://`` target gets redis-py's cluster client
(``redis.RedisCluster``, ``redis.asyncio.RedisCluster``), typed here as the
plain client whose command methods it shares, so the queue's steps and
loops take either without a union in every signature.

Every client built here sends a command once: a lost reply surfaces as
:class:`~fencekit.errors.StoreError` (invariant I4 of ``docs/design.md``),
never as a second send. The hot path does not use these clients: it has its
own connection (:mod:`fencekit._redis.hotpath`).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.retry import Retry

from fencekit._aio.closing import finish
from fencekit._redis.run import translate_error
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
from fencekit.errors import ConfigError, StoreError

__all__ = [
    "aclose_client",
    "async_client",
    "check_topology",
    "close_sync_client",
    "connect",
    "connect_async",
    "is_cluster_client",
    "loopless_client",
    "resolve_address",
    "sync_client",
    "watch_of",
]


def _cluster_kwargs(target: RedisTarget, overrides: dict[str, Any], *, aio: bool = False) -> dict[str, Any]:
    """redis-py cluster arguments: the URL's credentials, TLS and timeouts, nothing re-sent.

    redis-py's cluster client re-sends a command after a connection error or
    timeout unless its ``retry`` allows none (I4); redirects (``MOVED``,
    ``ASK``) and ``TRYAGAIN`` are still followed: the node did not run the
    command.
    """
    kwargs = target.connection_kwargs(aio=aio) | overrides
    kwargs.pop("db", None)
    kwargs.pop("retry", None)
    return kwargs


def _cluster_client(target: RedisTarget, overrides: dict[str, Any]) -> redis.Redis:
    kwargs = _cluster_kwargs(target, overrides)
    nodes = [redis.cluster.ClusterNode(host, port) for host, port in target.seeds]  # type: ignore[no-untyped-call]
    client = redis.RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **kwargs)
    return cast(redis.Redis, client)  # the same command methods; see the module docstring


def _async_cluster_client(target: RedisTarget, overrides: dict[str, Any]) -> redis.asyncio.Redis:
    kwargs = _cluster_kwargs(target, overrides, aio=True)
    nodes = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in target.seeds]
    client = redis.asyncio.RedisCluster(startup_nodes=nodes, retry=AsyncRetry(NoBackoff(), 0), **kwargs)
    return cast(redis.asyncio.Redis, client)


_ASYNC_CLUSTER: tuple[type, ...] = (redis.asyncio.RedisCluster,)  # typed as the plain client here


def is_cluster_client(client: object) -> bool:
    """True for a redis-py cluster client (sync or asyncio)."""
    return isinstance(client, (redis.RedisCluster, redis.asyncio.RedisCluster))


def sync_client(target: RedisTarget | str, **overrides: Any) -> redis.Redis:
    """A synchronous redis-py client for ``target`` with retries off.

    For a Sentinel target it follows the master as the asyncio clients do: a
    :class:`~fencekit._redis.sentinel.MasterWatch` on a thread of its own
    (started at first use, stopped by ``close()``) drops every connection
    when the master is moving, and connections check ``ROLE``.
    """
    if isinstance(target, str):
        target = parse_url(target)
    if target.is_cluster:
        return _cluster_client(target, overrides)
    kwargs = target.connection_kwargs() | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(), **kwargs
        )
        client = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]
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
    if target.is_cluster:
        return _cluster_client(target, overrides)
    kwargs = target.connection_kwargs() | overrides
    if not target.is_sentinel:
        return redis.Redis(**kwargs)
    assert target.master_name is not None
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(), **kwargs
    )
    client = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]
        target.master_name,
        connection_class=SyncRoleCheckedConnection,
        health_check_interval=ROLE_RECHECK,
        **kwargs,
    )
    return cast(redis.Redis, client)


def close_sync_client(client: redis.Redis) -> None:
    """Close a synchronous client, and the sentinel connections of a Sentinel-managed one."""
    client.close()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()


def connect(url: str, **overrides: Any) -> redis.Redis:
    """A synchronous redis-py client for any fencekit URL, for the primitives.

    ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://`` or
    ``redis+cluster://`` (``rediss+cluster://``), with fencekit's rules: no
    command re-sent, behind Sentinel the master followed through a failover
    (the old master left at once), on a cluster a ``redis.RedisCluster``
    (typed as ``redis.Redis``: the same command methods) that follows
    redirects. ``overrides``
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
    if target.is_cluster:
        return _async_cluster_client(target, overrides)
    kwargs = target.connection_kwargs(aio=True) | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(aio=True), **kwargs
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
    watch = getattr(getattr(client, "connection_pool", None), "watch", None)
    return watch if isinstance(watch, MasterWatch) else None


async def resolve_address(target: RedisTarget) -> tuple[str, int] | str:
    """Where the master is now: ``(host, port)``, or a socket path for ``unix://``.

    For Sentinel this asks every sentinel and takes the address named with
    the highest config epoch (one that is down is skipped, one that lags
    loses); raises :class:`StoreError` when none knows the master.
    """
    if target.path is not None:
        return target.path
    if target.is_cluster:
        raise ConfigError(f"a Redis Cluster has no single address: {target.redacted()}")
    if not target.is_sentinel:
        return (target.host, target.port)
    return await newest_master(target)


async def check_topology(client: redis.asyncio.Redis, target: RedisTarget) -> None:
    """Redis answers, and is what the URL says: a cluster for ``redis+cluster://``, else not one.

    A plain URL on a cluster node would half work (the keys of that node's
    slots) and fail with ``MOVED`` elsewhere, so both mismatches are a
    :class:`ConfigError` at start-up; an ACL that refuses ``INFO`` skips the
    plain-URL check. Other failures raise :class:`StoreError`.
    """
    try:
        await client.ping()
    except RedisClusterException as exc:
        if "not enabled" in str(exc):
            raise ConfigError(
                f"{target.redacted()} names a Redis Cluster, but its nodes have cluster mode off "
                "(use a redis:// URL)"
            ) from exc
        raise StoreError(f"{type(exc).__name__}: {exc}") from exc
    except ResponseError as exc:  # e.g. SELECT of a database it does not have: a ConfigError
        raise translate_error(exc) from exc
    except (RedisError, OSError) as exc:
        raise StoreError(f"{type(exc).__name__}: {exc}") from exc
    if target.is_cluster:
        return
    try:
        info = await client.info("cluster")
    except ResponseError:
        return
    except (RedisError, OSError) as exc:
        raise StoreError(f"{type(exc).__name__}: {exc}") from exc
    if str(info.get("cluster_enabled", "0")) == "1":
        raise ConfigError(
            f"Redis at {target.redacted()} is a Redis Cluster node: use a redis+cluster:// URL "
            "(every node of the cluster, or some, as seeds)"
        )


async def aclose_client(client: redis.asyncio.Redis) -> None:
    """Close an asyncio client, and the sentinel connections and master watch of a Sentinel-managed one.

    A cluster client's nodes are disconnected here whatever its state:
    redis-py 8.1's ``RedisCluster.aclose()`` does nothing while the client
    waits to re-read the slot map, which a timeout or a lost connection leaves
    it doing, so every node connection would leak. The close runs to its end
    even if the caller is cancelled meanwhile (:func:`~fencekit._aio.closing.finish`).
    """
    await finish(_aclose_client(client))


async def _aclose_client(client: redis.asyncio.Redis) -> None:
    await client.aclose()  # a watched Sentinel pool stops its master watch too
    if isinstance(client, _ASYNC_CLUSTER):
        manager = cast(Any, client).nodes_manager
        nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
        await asyncio.gather(*(node.disconnect() for node in nodes), return_exceptions=True)
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()
