"""redis-py batches on a Redis Cluster: the raw executor of ``batch_steps``, node by node.

redis-py's cluster pipeline refuses ``EVALSHA`` and ``SCRIPT LOAD``, so a
batch on a ``redis.RedisCluster`` (or ``redis.asyncio.RedisCluster``) is not
sent through it. :func:`cluster_steps` -- I/O-free, like
:func:`~fencekit._redis.cluster.routing.route_steps`, the routing rule it follows --
splits the ops of one batch by node: an op's slot is that of its first key
(a ``Call``'s ``keys[0]``, a ``Cmd``'s ``args[0]``); each node's share is
sent as one plain pipeline on a plain client of that node, the nodes'
shares at once on asyncio; the replies come back in the ops' order, an
error reply in its op's slot. Redirects are followed as on the hot path
(``MOVED``: the slot map is read again; ``ASK``: ``ASKING`` then the op, on
the named node, in one pipeline; ``TRYAGAIN``: a short pause), never a
re-send of anything that may have run (I4).

Ops without a key: ``script_load`` runs once through the cluster client
itself, which loads the script on every primary; ``WAIT`` (the durability
check :func:`~fencekit._redis.steps.batch_steps` appends) ends the pipeline
of *every* node that was sent ops, on the connection that wrote them (WAIT
counts the writes of its own connection), and the batch's WAIT reply is the
fewest replicas any of them confirmed; any other keyless op (``time``) rides
with the ops of the batch's first keyed slot (slot 0 without one).

The rule is the generator; :func:`execute` and :func:`aexecute` only answer
its requests (through :func:`~fencekit._redis.steps.drive` and ``adrive``).

The plain clients of the nodes belong to the cluster client: on redis-py's
synchronous cluster each node already has one (``ClusterNode.redis_connection``);
on asyncio a ``redis.asyncio.Redis`` per node borrows the node's own
connections (:class:`NodePool`), so closing the cluster client closes them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, NamedTuple, TypeAlias, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import (
    ConnectionError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
)

from fencekit._redis.cluster.routing import REFRESH, Address, Refresh, redirect_of, route_steps, slot_of
from fencekit._redis.scripts import Call
from fencekit._redis.steps import Cmd, Op, adrive, aexecute_ops, drive, execute_ops, register_executors
from fencekit.errors import ConfigError, StoreError

__all__ = [
    "ASKING",
    "Load",
    "NodePool",
    "Pipes",
    "aexecute",
    "anode_client",
    "cluster_steps",
    "execute",
    "node_client",
    "plain_node_client",
]

ASKING = Cmd("execute_command", ("ASKING",))

Pipes = list[tuple[Address, list[Op]]]
"""A request of :func:`cluster_steps`: each node's ops as one pipeline; answered with each pipeline's
raw replies (errors in their slots), in order."""


class Load(NamedTuple):
    """A request of :func:`cluster_steps`: load one script on every primary; answered with the reply.

    An error reply is thrown into the steps, which keep it in the op's slot.
    """

    source: str


Request: TypeAlias = "Load | Pipes | Refresh | float"
"""What :func:`cluster_steps` asks its driver for."""
AnyCluster: TypeAlias = "redis.RedisCluster | redis.asyncio.RedisCluster"  # either driver's client

_LOAD = "load"
_WAIT = "wait"


def _where(op: Op) -> int | str | None:
    """The slot ``op`` is routed by; :data:`_LOAD`, :data:`_WAIT`, or None for any node."""
    if isinstance(op, Call):
        if not op.keys:
            raise ConfigError(f"script {op.script.name} has no key to route it by on a Redis Cluster")
        return slot_of(op.keys[0])
    if op.method == "script_load":
        return _LOAD
    args = op.args
    if op.method == "execute_command":
        if args and str(args[0]).upper() == "WAIT":
            return _WAIT
        args = args[1:]
    if not args:
        return None
    key = args[0]
    return slot_of(key if isinstance(key, (bytes, str)) else str(key))


def cluster_steps(ops: Sequence[Op], owner: Callable[[int], Address]) -> Generator[Request, Any, list[Any]]:
    """The raw replies of ``ops`` on a cluster, in order (the module docstring gives the rule).

    Yields :class:`Load`, :data:`Pipes`, :data:`~fencekit._redis.cluster.routing.REFRESH`
    (read the slot map again) or a pause in seconds; ``owner`` answers from
    the current slot map.
    """
    replies: list[Any] = [None] * len(ops)
    loads: list[int] = []
    waits: list[int] = []
    routed: list[int] = []
    slots: list[int | None] = []
    for i, op in enumerate(ops):
        where = _where(op)
        if where == _LOAD:
            loads.append(i)
        elif where == _WAIT:
            waits.append(i)
        else:
            routed.append(i)
            slots.append(cast("int | None", where))
    for i in loads:
        try:
            replies[i] = yield Load(str(cast(Cmd, ops[i]).args[0]))
        except ResponseError as exc:  # the load's error reply: in its slot
            replies[i] = exc
    wait: Op | None = ops[waits[0]] if waits else None
    if wait is not None and not routed:  # a WAIT alone: on one node
        routed, slots, wait = waits[:1], [None], None
        waits = waits[1:]
    if routed:
        first = next((slot for slot in slots if slot is not None), 0)
        keyed = [first if s is None else s for s in slots]
        results, counts = yield from _routed([ops[i] for i in routed], keyed, owner, wait)
        for i, reply in zip(routed, results, strict=True):
            replies[i] = reply
        fewest = _fewest(counts)
        for i in waits:
            replies[i] = fewest
    return replies


def _routed(
    ops: list[Op], slots: list[int], owner: Callable[[int], Address], wait: Op | None
) -> Generator[Pipes | Refresh | float, Any, tuple[list[Any], list[Any]]]:
    """:func:`~fencekit._redis.cluster.routing.route_steps` over ``ops``, each pipeline ended by ``wait``.

    Returns the ops' replies and the WAIT replies of the pipelines in which
    something ran (one whose every op was redirected wrote nothing; when
    nothing ran anywhere, every pipeline's).
    """
    counts: list[Any] = []
    idle: list[Any] = []
    routes = route_steps(slots, owner)
    try:
        request = next(routes)
        while True:
            answer: Any = None
            if isinstance(request, list):
                pipes: Pipes = []
                for address, idx, asking in request:
                    node_ops: list[Op] = []
                    for i in idx:
                        if asking:
                            node_ops.append(ASKING)
                        node_ops.append(ops[i])
                    if wait is not None:
                        node_ops.append(wait)
                    pipes.append((address, node_ops))
                raw = yield pipes
                answer = []
                for (_, _, asking), got in zip(request, raw, strict=True):
                    got = list(got)
                    count = got.pop() if wait is not None else None
                    mine = got[1::2] if asking else got
                    if wait is not None:
                        ran = any(redirect_of(reply) is None for reply in mine)
                        (counts if ran else idle).append(count)
                    answer.append(mine)
            else:
                yield request
            request = routes.send(answer)
    except StopIteration as done:
        return cast("list[Any]", done.value), counts or idle


def _fewest(counts: list[Any]) -> Any:
    """The batch's WAIT reply: the first error, else the fewest replicas any node confirmed."""
    for count in counts:
        if isinstance(count, BaseException):
            return count
    return min((int(count) for count in counts), default=0)


# -- both drivers, and the synchronous one ---------------------------------------


_STALE: weakref.WeakSet[Any] = weakref.WeakSet()
"""Cluster clients whose slot map is read again before their next batch (a node's connection failed)."""


def _owner(client: AnyCluster, slot: int) -> Address:
    """The address of the primary serving ``slot`` in ``client``'s slot map (no I/O, either kind)."""
    try:
        node = client.nodes_manager.get_node_from_slot(slot)
    except SlotNotCoveredError as exc:
        reason = f"no Redis Cluster node serves hash slot {slot} (cluster down or being set up?): {exc}"
        raise StoreError(reason) from exc
    return (node.host, int(node.port))


def _batch_steps(client: AnyCluster, ops: list[Op]) -> Generator[Request, Any, list[Any]]:
    """:func:`cluster_steps` on ``client``, its slot map read again first if its last batch lost a node."""
    if client in _STALE:
        _STALE.discard(client)
        yield REFRESH
    if not ops:
        return []
    return (yield from cluster_steps(ops, functools.partial(_owner, client)))


@contextlib.contextmanager
def _failures(client: AnyCluster) -> Iterator[None]:
    """``RedisClusterException`` (not a RedisError) translated; a lost node's client re-reads its map next."""
    try:
        yield
    except RedisClusterException as exc:
        _STALE.add(client)
        raise StoreError(f"{type(exc).__name__}: {exc}") from exc
    except (ConnectionError, TimeoutError, OSError):
        _STALE.add(client)
        raise


def node_client(client: redis.RedisCluster, address: Address) -> redis.Redis:
    """The plain client of the node at ``address`` (the slot map read again once if it is unknown)."""
    node = client.get_node(host=address[0], port=address[1])  # type: ignore[no-untyped-call]
    if node is None:
        client.nodes_manager.initialize()
        node = client.get_node(host=address[0], port=address[1])  # type: ignore[no-untyped-call]
        if node is None:
            raise StoreError(f"no Redis Cluster node at {address[0]}:{address[1]} in the slot map")
    return client.get_redis_connection(node)


def _answer(client: redis.RedisCluster, request: Request) -> Any:
    """A request of :func:`cluster_steps` answered on a synchronous cluster client."""
    if isinstance(request, Load):
        return client.script_load(request.source)
    if isinstance(request, list):
        return [execute_ops(node_client(client, address), part) for address, part in request]
    if isinstance(request, Refresh):
        client.nodes_manager.initialize()
    else:
        time.sleep(request)
    return None


def execute(client: redis.RedisCluster, ops: list[Op]) -> list[Any]:
    """The raw replies of ``ops`` run on a synchronous cluster client (:func:`cluster_steps`)."""
    with _failures(client):
        return drive(client, _batch_steps(client, ops), functools.partial(_answer, client))


# -- the asyncio driver ----------------------------------------------------------


class NodePool:
    """What a plain ``redis.asyncio.Redis`` (its pipelines, its pub/sub) needs of a connection pool,
    over the connections of one node of an asyncio cluster client.

    The node owns the connections (retries off, as the cluster client made
    them); closing the cluster client closes them, so this pool closes
    nothing itself.
    """

    def __init__(self, node: redis.asyncio.cluster.ClusterNode) -> None:
        self.node = node
        self.connection_kwargs: dict[str, Any] = node.connection_kwargs
        self.himport_registry = node.connection_kwargs.get("himport_registry")

    def get_encoder(self) -> Any:
        return self.node.get_encoder()

    def get_protocol(self) -> Any:
        return self.connection_kwargs.get("protocol")

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection = self.node.acquire_connection()
        try:
            await self.node.disconnect_if_needed(connection)  # one the slot map's refresh marked
            await connection.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            await connection.disconnect()
            self.node.release(connection)
            raise
        return connection

    async def release(self, connection: Any) -> None:
        self.node.release(connection)

    def reset(self) -> None:
        pass

    async def disconnect(self, inuse_connections: bool = True) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def set_retry(self, retry: Any) -> None:
        pass

    async def re_auth_callback(self, token: Any) -> None:
        pass

    def get_connection_count(self) -> list[tuple[int, dict[str, Any]]]:
        return []


_NodeClients = dict[str, tuple[redis.asyncio.cluster.ClusterNode, redis.asyncio.Redis]]
_NODE_CLIENTS: weakref.WeakKeyDictionary[redis.asyncio.RedisCluster, _NodeClients] = (
    weakref.WeakKeyDictionary()
)


def plain_node_client(
    client: redis.asyncio.RedisCluster, node: redis.asyncio.cluster.ClusterNode
) -> redis.asyncio.Redis:
    """A plain asyncio client of ``node`` over the node's own connections (one per node, kept)."""
    clients = _NODE_CLIENTS.get(client)
    if clients is None:
        clients = _NODE_CLIENTS[client] = {}
    entry = clients.get(node.name)
    if entry is None or entry[0] is not node:  # a node the slot map replaced: its own connections
        entry = (node, redis.asyncio.Redis(connection_pool=cast(Any, NodePool(node))))
        clients[node.name] = entry
    return entry[1]


async def anode_client(client: redis.asyncio.RedisCluster, address: Address) -> redis.asyncio.Redis:
    """The plain client of the node at ``address`` (the slot map read again once if it is unknown)."""
    node = client.get_node(host=address[0], port=address[1])
    if node is None:
        await client.nodes_manager.initialize()
        node = client.get_node(host=address[0], port=address[1])
        if node is None:
            raise StoreError(f"no Redis Cluster node at {address[0]}:{address[1]} in the slot map")
    return plain_node_client(client, node)


async def _apipe(client: redis.asyncio.RedisCluster, address: Address, ops: list[Op]) -> list[Any]:
    return await aexecute_ops(await anode_client(client, address), ops)


async def _aanswer(client: redis.asyncio.RedisCluster, request: Request) -> Any:
    """A request of :func:`cluster_steps` answered on an asyncio cluster client (all nodes at once)."""
    if isinstance(request, Load):
        return await client.script_load(request.source)
    if isinstance(request, list):
        results = await asyncio.gather(
            *(_apipe(client, address, part) for address, part in request), return_exceptions=True
        )
        for result in results:  # every node's share has settled: raise the first failure
            if isinstance(result, BaseException):
                raise result
        return results
    if isinstance(request, Refresh):
        await client.nodes_manager.initialize()
    else:
        await asyncio.sleep(request)
    return None


async def aexecute(client: redis.asyncio.RedisCluster, ops: list[Op]) -> list[Any]:
    """The raw replies of ``ops`` run on an asyncio cluster client (:func:`cluster_steps`)."""
    with _failures(client):
        if ops:
            await client.initialize()  # at once when it is already
        return await adrive(client, _batch_steps(client, ops), functools.partial(_aanswer, client))


register_executors(redis.RedisCluster, execute, redis.asyncio.RedisCluster, aexecute)
