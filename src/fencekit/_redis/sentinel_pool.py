"""redis-py clients of a Sentinel-managed master that follow a :class:`~fencekit._redis.sentinel.MasterWatch`.

The asyncio pool (:class:`WatchedSentinelPool`) asks the watch where the
master is and drops every connection, in use or idle, when the watch says
the master is moving; every connection checks ``ROLE`` when it connects and
after an idle spell (:class:`RoleCheckedConnection`). The synchronous
twins do the same for :func:`fencekit.connect`, whose watch runs on an event
loop in a thread of its own (:class:`WatchThread`), so a synchronous program
follows a failover as an asyncio one does. The asyncio pool's drops run as tasks
of its :class:`~fencekit._aio.scope.TaskScope`, ended by its ``aclose``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import redis
import redis.asyncio.sentinel
import redis.exceptions
import redis.sentinel

from fencekit._aio.scope import TaskScope
from fencekit._redis.sentinel import Address, Change, MasterWatch, _text
from fencekit._redis.url import RedisTarget
from fencekit.errors import StoreError

__all__ = [
    "ROLE_RECHECK",
    "RoleCheckedConnection",
    "SyncRoleCheckedConnection",
    "WatchThread",
    "WatchedRedis",
    "WatchedSentinelPool",
    "WatchedSyncSentinelPool",
]


ROLE_RECHECK = 5.0  # seconds a connection may sit idle before its next use checks ROLE again


def role_error(reply: Any, where: str) -> redis.exceptions.ConnectionError | None:
    """The error to raise when a ``ROLE`` reply says the node is not a master, else None."""
    name = _text(reply[0]) if isinstance(reply, (list, tuple)) and reply else _text(reply)
    if name == "master":
        return None
    return redis.exceptions.ConnectionError(
        f"{where}, named as master by the sentinels, says its role is {name!r} (failover in progress?)"
    )


class RoleCheckedConnection(redis.asyncio.sentinel.SentinelManagedConnection):
    """A connection to a Sentinel-managed master that asks the node for its ``ROLE`` after any doubt.

    The sentinels may name a node that is not the master any more (a failover
    under way, a sentinel that lags); writing to it would be lost and reading
    from it would show old data. Every new connection -- the first one, and
    every reconnect after an error -- and every connection idle for longer
    than :data:`ROLE_RECHECK` (redis-py's health check, with ``ROLE`` in place
    of ``PING``) therefore asks the node itself, as the hot-path connection
    does when it connects.
    """

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        await super().on_connect_check_health(check_health=check_health)
        await self._check_role()

    async def _send_ping(self) -> None:
        await self._check_role()

    async def _check_role(self) -> None:
        await self.send_command("ROLE", check_health=False)
        error = role_error(await self.read_response(), f"{self.host}:{self.port}")
        if error is not None:
            await self.disconnect()
            raise error


class WatchedSentinelPool(redis.asyncio.sentinel.SentinelConnectionPool):
    """redis-py's Sentinel pool, asking a :class:`MasterWatch` where the master is.

    While a failover is under way no connection is made (ConnectionError, a
    :class:`~fencekit.errors.StoreError` to fencekit's callers); when the
    watch reports a change, every connection of the pool, in use or idle, is
    dropped, so the next command goes to the new master.
    """

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        self.watch: MasterWatch = kwargs.pop("watch")
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._dropping = TaskScope(f"sentinel pool of {service_name!r}")  # drops asked for by the watch
        self.watch.listen(self._on_change)

    async def get_master_address(self) -> Address:
        try:
            await self.watch.start()
            address = self.watch.writable()
        except StoreError as exc:
            raise redis.exceptions.ConnectionError(str(exc)) from exc
        if self.master_address != address:
            self.master_address = address
            await self.disconnect(inuse_connections=False)
        return address

    def _on_change(self, change: Change) -> None:
        self._dropping.start(self.disconnect(inuse_connections=True), name="fencekit-sentinel-drop")

    async def aclose(self) -> None:
        """Close the pool and stop its watch (what ``client.aclose()`` calls)."""
        try:
            await self.watch.aclose()
        finally:
            try:
                await self._dropping.aclose()
            finally:
                await super().aclose()


# -- the synchronous twins (fencekit.connect) ------------------------------------------------


class WatchThread:
    """A :class:`MasterWatch` running on an event loop of its own thread (for synchronous clients)."""

    def __init__(self, target: RedisTarget) -> None:
        self.watch = MasterWatch(target)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ensure_started(self, timeout: float = 10.0) -> None:
        """Start the thread and read the master once (StoreError when no sentinel knows it)."""
        with self._lock:
            if self._thread is not None:
                return
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="fencekit-sentinel-watch", daemon=True)
            thread.start()
            try:
                asyncio.run_coroutine_threadsafe(self.watch.start(), loop).result(timeout)
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(5)
                loop.close()
                raise
            self._loop, self._thread = loop, thread

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.watch.aclose(), loop).result(10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


class SyncRoleCheckedConnection(redis.sentinel.SentinelManagedConnection):
    """The synchronous :class:`RoleCheckedConnection`."""

    def on_connect_check_health(self, check_health: bool = True) -> None:
        super().on_connect_check_health(check_health=check_health)
        self._check_role()

    def _send_ping(self) -> None:
        self._check_role()

    def _check_role(self) -> None:
        self.send_command("ROLE", check_health=False)  # type: ignore[no-untyped-call]
        error = role_error(self.read_response(), f"{self.host}:{self.port}")
        if error is not None:
            self.disconnect()  # type: ignore[no-untyped-call]
            raise error


class _WatchedProxy(redis.sentinel.SentinelConnectionPoolProxy):
    def __init__(self, watcher: WatchThread, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self.watcher = watcher

    def get_master_address(self) -> Address:
        try:
            self.watcher.ensure_started()
            return self.watcher.watch.writable()
        except StoreError as exc:
            raise redis.exceptions.ConnectionError(str(exc)) from exc


class WatchedSyncSentinelPool(redis.sentinel.SentinelConnectionPool):
    """The synchronous :class:`WatchedSentinelPool` (its watch on a :class:`WatchThread`)."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        self.watcher: WatchThread = kwargs.pop("watcher")
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self.proxy = _WatchedProxy(
            self.watcher,
            connection_pool=self,
            is_master=self.is_master,
            check_connection=self.check_connection,
            service_name=service_name,
            sentinel_manager=sentinel_manager,
        )
        self.connection_kwargs["connection_pool"] = self.proxy
        self.watcher.watch.listen(self._on_change)

    def _on_change(self, change: Change) -> None:  # in the watch's thread
        redis.ConnectionPool.disconnect(self, inuse_connections=True)


class WatchedRedis(redis.Redis):
    """``redis.Redis`` whose ``close()`` also stops the master watch of its pool."""

    def close(self) -> None:
        super().close()
        watcher = getattr(self.connection_pool, "watcher", None)
        if isinstance(watcher, WatchThread):
            watcher.stop()
