"""Sharded pub/sub (``SSUBSCRIBE``) on a Redis Cluster: one plain subscription per node.

A queue's channels (``P:{Q}:cancel``, ``P:{Q}:done``) live in its slot, so a
listener of several queues listens on several primaries. redis-py 8.1's
``ClusterPubSub`` cannot serve the listeners: its ``get_message`` reads only
a connection that ``SSUBSCRIBE`` never opens ("pubsub connection not set"),
its ``get_sharded_message`` waits ``timeout`` on each node in turn, and a
channel whose slot moved (the server's ``sunsubscribe``) is subscribed again
only when its own cluster client happens to read the slot map again.

:class:`ClusterSubscriber` has the face of redis-py's asyncio ``PubSub`` the
listeners use (``ssubscribe``, ``get_message``, ``aclose``): it keeps one
plain pub/sub per node, subscribing each slot's channels with one
``SSUBSCRIBE`` (a node refuses channels of several slots in one); a reader
per node passes its messages on. When the server unsubscribes a channel
(its slot moved away) or refuses one (``MOVED``), the slot map is read again
and the channel subscribed where it lives now, its confirmation passed on
like the first (a listener reads again on it). A node's connection that
fails is reported by the next :meth:`ClusterSubscriber.get_message` and its
channels are subscribed again, from a fresh slot map, at the call after
(the listener's back-off paces the attempts), as redis-py's ``PubSub``
reconnects a single node. The readers are tasks of the subscriber's
:class:`~fencekit._aio.scope.TaskScope`, ended (and awaited) by
:meth:`ClusterSubscriber.aclose`.

:func:`sharded_pubsub` and :func:`channel_pubsub` give a plain client's own
``pubsub()`` unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.client
from redis.exceptions import RedisClusterException, ResponseError, SlotNotCoveredError

from fencekit._aio.closing import aclose_all
from fencekit._aio.scope import TaskScope
from fencekit._redis.cluster.batches import plain_node_client
from fencekit._redis.cluster.link import Address, redirect_of, slot_of
from fencekit._redis.run import Redirected, as_text
from fencekit.errors import StoreError

__all__ = ["READ_WAIT", "ClusterSubscriber", "channel_pubsub", "read_slot_map_again", "sharded_pubsub"]

READ_WAIT = 1.0
"""Seconds each node's reader waits for a message before it waits again."""
REPLACE_PAUSE = 0.05
"""Seconds before a channel a node refused is subscribed again (the slot map is settling)."""

_REPLACE = object()  # put in the inbox: subscribe the channels that have no node
_NOTHING = object()  # what _next gives when its timeout passed


_SYNC_CLUSTER: tuple[type, ...] = (redis.RedisCluster,)  # typed as redis.Redis (fencekit._redis.clients)
_ASYNC_CLUSTER: tuple[type, ...] = (redis.asyncio.RedisCluster,)


def sharded_pubsub(client: redis.asyncio.Redis) -> Any:
    """A pub/sub for ``SSUBSCRIBE`` on ``client``: its own ``pubsub()``, or a :class:`ClusterSubscriber`."""
    if isinstance(client, _ASYNC_CLUSTER):
        return ClusterSubscriber(cast(redis.asyncio.RedisCluster, client))
    return client.pubsub()


def channel_pubsub(client: redis.Redis, channel: str) -> redis.client.PubSub:
    """A synchronous pub/sub for one sharded ``channel``: the client's own, or its node's on a cluster."""
    if not isinstance(client, _SYNC_CLUSTER):
        return cast(redis.client.PubSub, client.pubsub())  # type: ignore[no-untyped-call,redundant-cast,unused-ignore]
    cluster = cast(redis.RedisCluster, client)
    try:
        node = cluster.get_node_from_key(channel)  # type: ignore[no-untyped-call]
    except (SlotNotCoveredError, RedisClusterException) as exc:
        raise StoreError(f"no Redis Cluster node serves the slot of {channel}: {exc}") from exc
    return cast(redis.client.PubSub, cluster.get_redis_connection(node).pubsub())  # type: ignore[no-untyped-call,redundant-cast,unused-ignore]


def read_slot_map_again(client: redis.Redis) -> None:
    """After a redirect or a server's ``sunsubscribe``: read a cluster client's slot map again."""
    if isinstance(client, _SYNC_CLUSTER):
        cast(redis.RedisCluster, client).nodes_manager.initialize()


class _Shard:
    """One node's pub/sub and the task reading it."""

    __slots__ = ("pubsub", "reader")

    def __init__(self, pubsub: redis.asyncio.client.PubSub) -> None:
        self.pubsub = pubsub
        self.reader: asyncio.Task[None] | None = None


class ClusterSubscriber:
    """``SSUBSCRIBE`` over every primary of an asyncio cluster client (the module docstring)."""

    def __init__(self, client: redis.asyncio.RedisCluster) -> None:
        self._client = client
        self._wanted: dict[str, None] = {}  # every channel subscribed, in order
        self._placed: dict[str, str] = {}  # channel -> name of the node it is subscribed on
        self._hints: dict[str, Address] = {}  # channel -> the node a MOVED named
        self._shards: dict[str, _Shard] = {}  # node name -> its subscription
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._stale = False  # read the slot map before the next subscription
        self._closed = False
        self._scope = TaskScope("cluster sharded pub/sub")  # the nodes' readers

    @property
    def channels(self) -> list[str]:
        return list(self._wanted)

    async def ssubscribe(self, *channels: str | bytes) -> None:
        """Subscribe ``channels`` on their nodes; each confirmation comes as an ``ssubscribe`` message."""
        names = [as_text(channel) for channel in channels]
        for name in names:
            self._wanted[name] = None
        async with self._lock:
            await self._place(names)

    async def get_message(self, timeout: float | None = 0.0, **_: Any) -> dict[str, Any] | None:
        """The next message of any node (subscribe confirmations included), or None after ``timeout``.

        Raises what broke a node's connection (once), and while the channels
        it held cannot be subscribed again.
        """
        if self._closed:
            raise StoreError("the cluster subscriber is closed")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._inbox.empty() and any(channel not in self._placed for channel in self._wanted):
                async with self._lock:
                    await self._place([channel for channel in self._wanted if channel not in self._placed])
            try:
                item = self._inbox.get_nowait()
            except asyncio.QueueEmpty:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return None
                item = await self._next(left)
                if item is _NOTHING:
                    return None
            if item is _REPLACE:
                continue
            if isinstance(item, BaseException):
                raise item
            return item  # type: ignore[no-any-return]

    async def _next(self, timeout: float | None) -> Any:
        """The next inbox item, or ``_NOTHING`` after ``timeout`` seconds.

        Not ``asyncio.wait_for``: on Python < 3.12 it swallows a cancellation that
        meets an item arriving at the same moment, and a listener cancelled at
        shutdown then never ends (a stopping Server hung on it). The getter is
        a task of a scope of this call: cancelled and awaited when it returns.
        """
        async with TaskScope("cluster sharded pub/sub read") as scope:
            getter = scope.start(self._inbox.get(), awaited=True)
            done, _ = await asyncio.wait({getter}, timeout=timeout)
            return getter.result() if done else _NOTHING

    async def aclose(self) -> None:
        """Stop every reader and close every node's subscription."""
        self._closed = True
        shards = list(self._shards.values())
        self._shards.clear()
        self._placed.clear()
        try:
            await self._scope.aclose()  # every reader, cancelled and awaited
        finally:
            await aclose_all(*(shard.pubsub for shard in shards))

    # -- subscribing ------------------------------------------------------

    async def _place(self, channels: list[str]) -> None:
        """``SSUBSCRIBE`` ``channels`` on the nodes serving them now, one command per slot (locked)."""
        if self._closed or not channels:
            return
        try:
            await self._client.initialize()
            if self._stale:
                self._stale = False
                await self._client.nodes_manager.initialize()
            groups: dict[str, tuple[redis.asyncio.cluster.ClusterNode, dict[int, list[str]]]] = {}
            for channel in channels:
                node = self._node_of(channel)
                groups.setdefault(node.name, (node, {}))[1].setdefault(slot_of(channel), []).append(channel)
        except RedisClusterException as exc:  # not a RedisError
            self._stale = True
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._stale = True
            raise
        for name, (node, by_slot) in groups.items():
            shard = self._shards.get(name)
            fresh = shard is None
            if shard is None:
                shard = _Shard(plain_node_client(self._client, node).pubsub())
            try:
                for names in by_slot.values():
                    await shard.pubsub.ssubscribe(*names)
            except BaseException:
                self._stale = True
                if fresh:
                    await aclose_all(shard.pubsub)
                raise
            if fresh:
                self._shards[name] = shard
                shard.reader = self._scope.start(self._read(name, shard), name=f"fencekit-ssubscribe-{name}")
            for names in by_slot.values():
                for channel in names:
                    self._placed[channel] = name

    def _node_of(self, channel: str) -> redis.asyncio.cluster.ClusterNode:
        hint = self._hints.pop(channel, None)
        if hint is not None:
            hinted = self._client.get_node(host=hint[0], port=hint[1])
            if hinted is not None:
                return hinted
        try:
            node = self._client.get_node_from_key(channel)
        except SlotNotCoveredError as exc:
            raise StoreError(f"no Redis Cluster node serves the slot of {channel}: {exc}") from exc
        if node is None:
            raise StoreError(f"no Redis Cluster node serves the slot of {channel}")
        return node

    # -- reading ------------------------------------------------------------

    async def _read(self, name: str, shard: _Shard) -> None:
        """Pass the node's messages on; follow a moved slot; report a failed connection and stop."""
        while True:
            try:
                message = await shard.pubsub.get_message(timeout=READ_WAIT)
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                redirect = redirect_of(exc)
                if redirect is None:
                    await self._failed(name, shard, exc)
                    return
                self._refused(name, redirect)
                continue
            except Exception as exc:
                await self._failed(name, shard, exc)
                return
            if message is None:
                continue
            if as_text(message.get("type", b"")) == "sunsubscribe":
                channel = as_text(message.get("channel", b""))
                if channel in self._wanted and self._placed.get(channel) == name:  # its slot moved away
                    del self._placed[channel]
                    self._stale = True
                    self._inbox.put_nowait(_REPLACE)
                continue
            self._inbox.put_nowait(message)

    def _refused(self, name: str, redirect: Any) -> None:
        """A node refused an ``SSUBSCRIBE`` (``MOVED``, ``ASK``, ``TRYAGAIN``): subscribe it again."""
        slot = redirect.slot if isinstance(redirect, Redirected) else None
        for channel, where in list(self._placed.items()):
            if where == name and (slot is None or slot_of(channel) == slot):
                del self._placed[channel]
                if isinstance(redirect, Redirected) and redirect.kind == "MOVED":
                    self._hints[channel] = redirect.address
        self._stale = True
        asyncio.get_running_loop().call_later(REPLACE_PAUSE, self._inbox.put_nowait, _REPLACE)

    async def _failed(self, name: str, shard: _Shard, exc: BaseException) -> None:
        if self._shards.get(name) is shard:
            del self._shards[name]
            for channel in [c for c, where in self._placed.items() if where == name]:
                del self._placed[channel]
        self._stale = True
        await aclose_all(shard.pubsub)
        if not self._closed:
            self._inbox.put_nowait(exc)
