"""The hot path on Redis Cluster: the slot map, and a :class:`~fencekit._redis.link.Link` routing by slot.

Every script keeps its keys under one queue's hash tag (I5 of
docs/design.md), so a call belongs to exactly one slot, and a slot to one
primary. :class:`ClusterLink` holds one lean connection
(:class:`~fencekit._redis.hotpath.LeanConnection`) per primary it has
needed, opened on first use from the slot map (:class:`SlotMap`, read with
``CLUSTER SLOTS`` from the first seed node that answers). A pipeline is split
by node, each node's share written at once and the shares awaited together,
so queues whose slots live on different primaries are served concurrently;
the replies come back in the calls' order.

Redirects are followed, never re-sent blindly (I4): ``MOVED`` means the node
did not run the command, so the map is read again and the call goes to the
new owner; ``ASK`` (a slot being migrated) sends that call once to the named
node behind ``ASKING``; ``TRYAGAIN`` (a migration has split the call's keys)
waits a little and sends it again, since it did not run. A slot the map names
no owner for (read from a node amid a failover) is not a failure of the call
either: the map is read again as for a ``MOVED``, from a node that knows every
slot's owner when one does (:mod:`~fencekit._redis.cluster.maps`).

A node that fails fails alone: the calls sent to it get
:class:`~fencekit._redis.run.NodeLost` (a ``StoreError``: they may have run)
in their slots, the other nodes' replies arrive as usual, and the link stays
open. The node is then left alone for a short back-off (100 ms doubling to
:data:`NODE_RETRY_MAX`; its calls fail at once meanwhile, so a node that
hangs does not hold up the others' work on every turn), and the slot map is
read again from the nodes still answering, so a replica the cluster promotes
is found without waiting for a ``MOVED``. The consumer reconciles the queues
of that node only (:mod:`fencekit.consume._consumer`).

The connections being opened and the slot map being read again are tasks
of the link's :class:`~fencekit._aio.scope.TaskScope` (several callers may
wait for one), cancelled and awaited by :meth:`ClusterLink.aclose`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from fencekit._aio.closing import finish
from fencekit._aio.scope import TaskScope
from fencekit._redis.cluster.maps import read_fullest, read_slot_map
from fencekit._redis.cluster.routing import (
    MAX_REDIRECTS,
    REFRESH,
    TRYAGAIN_PAUSE,
    Address,
    Refresh,
    Send,
    SlotMap,
    redirect_of,
    route_steps,
    slot_of,
)
from fencekit._redis.hotpath import LeanConnection
from fencekit._redis.run import NodeLost, NotSent, Redirected, TryAgain, Unblocked
from fencekit._redis.scripts import Call
from fencekit._redis.url import RedisTarget
from fencekit.errors import ConfigError, FenceKitError, StoreError

__all__ = [  # the routing names are re-exported: the link's users need them beside it
    "REFRESH",
    "Address",
    "ClusterLink",
    "Refresh",
    "Send",
    "SlotMap",
    "read_slot_map",
    "redirect_of",
    "route_steps",
    "slot_of",
]

NODE_RETRY_MIN = 0.1
NODE_RETRY_MAX = 0.5
"""After a node failed, its calls fail at once for this long (doubling from :data:`NODE_RETRY_MIN`)."""


class ClusterLink:
    """A :class:`~fencekit._redis.link.Link` over every primary of a Redis Cluster (module docstring)."""

    def __init__(self, target: RedisTarget, name: str | None, slots: SlotMap) -> None:
        self._target = target
        self._name = name
        self._map = slots
        self._conns: dict[Address, LeanConnection] = {}
        self._opening: dict[Address, asyncio.Task[LeanConnection]] = {}
        self._closed = False
        self._refreshing: asyncio.Task[None] | None = None
        self._down: dict[Address, tuple[float, float]] = {}  # node -> (failing fast until, next back-off)
        self._scope = TaskScope(f"cluster link {name or ''}".rstrip())  # opening connections, map reads
        self.redirects = {"moved": 0, "ask": 0, "tryagain": 0}
        """How many times this link followed each answer (map reads, ASK sends, TRYAGAIN pauses)."""

    @classmethod
    async def open(cls, target: RedisTarget, *, name: str | None = None) -> ClusterLink:
        """Read the slot map and keep the connection that read it when it is a primary's."""
        slots, conn = await read_slot_map(target, name=name)
        link = cls(target, name, slots)
        address = _address(conn)
        if address in slots.primaries:
            link._conns[address] = conn
        else:
            conn.close()
        return link

    # -- the Link contract ------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def slot_map(self) -> SlotMap:
        return self._map

    async def call(self, call: Call) -> Any:
        owner = self._owner(call)
        conn = None if owner is None else self._conns.get(owner)
        if conn is not None and not conn.closed:  # the common case: straight to the owner
            try:
                return await conn.call(call)
            except Redirected as exc:  # it did not run: the routing rule follows the answer
                if exc.kind == "MOVED":
                    self.redirects["moved"] += 1
                    await self._refresh()
            except TryAgain:  # NotSent too: closed before or under the write, so it did not run
                pass
            except StoreError as exc:
                if conn.closed:
                    raise self._node_failed(_address(conn), exc) from exc
                raise
        (reply,) = await self._route((call,))
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def pipeline(self, calls: Sequence[Call]) -> list[Any]:
        """Each node's calls in one write, the nodes at once; replies (errors in their slots) in order."""
        if not calls:
            return []
        owners = {self._owner(call) for call in calls}
        owner = owners.pop() if len(owners) == 1 else None
        if owner is not None:  # one node (one queue's turn): its connection alone, no routing round
            conn = self._conns.get(owner)
            if conn is not None and not conn.closed:
                replies = await self._send_part(_address(conn), list(calls), False)
                again = [i for i, reply in enumerate(replies) if redirect_of(reply) is not None]
                if any(getattr(replies[i], "kind", "") == "MOVED" for i in again):
                    self.redirects["moved"] += 1
                    await self._refresh()
                if again:
                    for i, reply in zip(again, await self._route([calls[i] for i in again]), strict=True):
                        replies[i] = reply
                return replies
        return await self._route(calls)

    async def _route(self, calls: Sequence[Call]) -> list[Any]:
        """:func:`route_steps` driven over this link's connections."""
        steps = route_steps([self._slot(call) for call in calls], lambda slot: self._map.owner(slot))
        request = next(steps)
        while True:
            if isinstance(request, list):
                sends = [
                    self._send_part(addr, [calls[i] for i in idx], asking) for addr, idx, asking in request
                ]
                self.redirects["ask"] += sum(len(idx) for _, idx, asking in request if asking)
                answer: Any = await self._gather(sends)
            elif isinstance(request, Refresh):
                self.redirects["moved"] += 1
                await self._refresh()
                answer = None
            else:
                self.redirects["tryagain"] += 1
                await asyncio.sleep(request)
                answer = None
            try:
                request = steps.send(answer)
            except StopIteration as done:
                return cast("list[Any]", done.value)

    async def execute(self, *args: Any, timeout: float | None = None) -> Any:
        """One command on the node of its key (``args[1]``); ``WAIT`` on every open node (the fewest)."""
        name = str(args[0]).upper() if args else ""
        if name == "WAIT":
            conns = list(self._conns.values())
            counts = await self._gather([conn.execute(*args, timeout=timeout) for conn in conns])
            return min((int(count) for count in counts), default=int(args[1]))
        if name not in _KEYED or len(args) < 2:
            raise ConfigError(f"{name or 'an empty command'} has no key to route it by on a Redis Cluster")
        slot = slot_of(_key_bytes(args[1]))
        moved_to: Address | None = None  # as in route_steps: a MOVED's word beats a stale map
        for attempt in range(MAX_REDIRECTS + 1):
            address = moved_to or await self._owner_of(slot)
            conn = await self._node(address)
            try:
                return await conn.execute(*args, timeout=timeout)
            except Redirected as exc:
                self.redirects["ask" if exc.kind == "ASK" else "moved"] += 1
                if exc.kind == "ASK":
                    return await (await self._node(exc.address)).execute_asking(*args, timeout=timeout)
                moved_to = exc.address
                if attempt:
                    await asyncio.sleep(TRYAGAIN_PAUSE * attempt)
                await self._refresh()
            except Unblocked:  # its node became a replica (a failover): nothing was popped
                self.redirects["moved"] += 1
                moved_to = None
                await asyncio.sleep(TRYAGAIN_PAUSE * (attempt + 1))
                await self._refresh()
            except StoreError as exc:
                if conn.closed:
                    raise self._node_failed(address, exc) from exc
                raise
        raise StoreError(
            f"{name} on slot {slot}: more than {MAX_REDIRECTS} redirects (the slot keeps moving)"
        )

    async def block_then(
        self, command: Sequence[Any], calls: Sequence[Call], timeout: float
    ) -> tuple[Any, list[Any]]:
        """The lean link's :meth:`~fencekit._redis.hotpath.LeanConnection.block_then`, on one node:
        the blocking command's key and every call's keys must share its slot."""
        slot = slot_of(_key_bytes(command[1]))
        if any(self._slot(call) != slot for call in calls):
            raise ConfigError("block_then on a Redis Cluster needs every call in the blocking command's slot")
        address = await self._owner_of(slot)
        conn = await self._node(address)
        try:
            return await conn.block_then(command, calls, timeout)
        except StoreError as exc:
            if conn.closed:
                raise self._node_failed(address, exc) from exc
            raise

    async def aclose(self) -> None:
        self._closed = True
        try:
            await self._scope.aclose()  # connections being opened, a map read: cancelled and awaited
        finally:
            for task in self._opening.values():  # opened, but no caller took it: close it too
                if task.done() and not task.cancelled() and task.exception() is None:
                    task.result().close()
            self._opening.clear()
            conns = list(self._conns.values())
            self._conns.clear()
            await finish(asyncio.gather(*(conn.aclose() for conn in conns), return_exceptions=True))

    # -- routing ----------------------------------------------------------

    def _slot(self, call: Call) -> int:
        if not call.keys:
            raise ConfigError(f"script {call.script.name} has no key to route it by on a Redis Cluster")
        return slot_of(call.keys[0])

    def _owner(self, call: Call) -> Address | None:
        return self._map.get(self._slot(call))  # None: routed anyway, route_steps reads the map again

    async def _owner_of(self, slot: int) -> Address:
        """The slot's primary; a map naming none (read from a node amid a failover) is read again."""
        for attempt in range(MAX_REDIRECTS):
            owner = self._map.get(slot)
            if owner is not None:
                return owner
            await asyncio.sleep(TRYAGAIN_PAUSE * attempt)
            await self._refresh()
        return self._map.owner(slot)  # still none: StoreError, and the next call reads the map again

    async def _send_part(self, address: Address, calls: list[Call], asking: bool) -> list[Any]:
        """``calls`` on one node in one write (behind ``ASKING`` each, for an ``ASK``).

        A failure of the node comes back as :class:`NodeLost` in each of its
        calls' slots (the module docstring says why it is not raised).
        """
        try:
            conn = await self._node(address)
        except NodeLost as exc:
            return [exc] * len(calls)
        try:
            if not asking:
                replies = await conn.pipeline(calls)
            else:
                replies = []
                for call in calls:  # ASK redirects are rare: one round trip each
                    try:
                        replies.append(await conn.call_asking(call))
                    except FenceKitError as exc:
                        if conn.closed:
                            raise
                        replies.append(exc)
        except NotSent as exc:  # not written: route_steps sends them again, on a new connection
            if self._conns.get(address) is conn:
                del self._conns[address]
            return [exc] * len(calls)
        except StoreError as exc:
            if not conn.closed:
                raise
            return [self._node_failed(address, exc)] * len(calls)
        self._down.pop(address, None)
        return replies

    async def _gather(self, parts: list[Any]) -> list[Any]:
        """Await ``parts`` together; a part that raised (not a node's failure: a bug) is raised after all."""
        results = await asyncio.gather(*parts, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def _node(self, address: Address) -> LeanConnection:
        """The connection to ``address``; :class:`NodeLost` while it is backing off or cannot connect."""
        down = self._down.get(address)
        if down is not None and asyncio.get_running_loop().time() < down[0]:
            raise NodeLost(f"Redis Cluster node {address[0]}:{address[1]} failed just now; retrying shortly")
        try:
            return await self._conn(address)
        except NodeLost:
            raise
        except StoreError as exc:
            if self._closed:
                raise
            raise self._node_failed(address, exc) from exc

    def _node_failed(self, address: Address, exc: BaseException) -> NodeLost:
        """Forget the node's connection, back off from it, read the slot map again (in the background)."""
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()
        now = asyncio.get_running_loop().time()
        _, pause = self._down.get(address, (0.0, NODE_RETRY_MIN))
        self._down[address] = (now + pause, min(pause * 2, NODE_RETRY_MAX))
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = self._scope.start(self._read_map_quietly(), name="fencekit-cluster-map")
        return NodeLost(f"Redis Cluster node {address[0]}:{address[1]}: {exc}")

    async def _read_map_quietly(self) -> None:
        try:
            await self._read_map()
        except FenceKitError:
            pass  # no node answers yet: the next failure tries again

    async def _conn(self, address: Address) -> LeanConnection:
        if self._closed:
            raise StoreError("cluster link is closed")
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        task = self._opening.get(address)
        if task is None:
            node = self._target.node(*address)
            task = self._scope.start(
                LeanConnection.open(node, name=self._name), name="fencekit-cluster-open", awaited=True
            )
            self._opening[address] = task
        try:
            conn = await asyncio.shield(task)
        except BaseException:
            if task.done():  # it finished as this caller was cancelled: keep what it opened
                self._opening.pop(address, None)
                if not task.cancelled() and task.exception() is None:
                    self._conns[address] = task.result()
                    if self.closed:
                        self._conns.pop(address).close()
            raise
        self._opening.pop(address, None)
        if self.closed:  # closed while it was opening
            conn.close()
            raise StoreError("cluster link is closed")
        self._conns[address] = conn
        return conn

    async def _refresh(self) -> None:
        """Read the slot map again (once for every caller waiting on it)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = self._scope.start(self._read_map(), name="fencekit-cluster-map", awaited=True)
        await asyncio.shield(self._refreshing)

    async def _read_map(self) -> None:
        """Read the map again from the open nodes, preferring a full one (:func:`read_fullest`)."""
        self._map = await read_fullest(list(self._conns.items()), self._target, name=self._name)


_KEYED = frozenset(("BLPOP", "HGETALL", "LLEN", "GET", "HGET", "EXISTS", "DEL", "LPUSH", "RPUSH", "ZCARD"))


def _key_bytes(key: Any) -> bytes:
    return key if isinstance(key, bytes) else str(key).encode()


def _address(conn: LeanConnection) -> Address:
    host, _, port = conn.address.rpartition(":")
    return (host.strip("[]"), int(port))
