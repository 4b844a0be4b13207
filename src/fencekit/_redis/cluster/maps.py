"""Reading a Redis Cluster's slot map (``CLUSTER SLOTS``) from its nodes: the I/O half of
:class:`~fencekit._redis.cluster.routing.SlotMap`, for :class:`~fencekit._redis.cluster.link.ClusterLink`.

A node's map may lack slots for a moment in a failover: one that hears the old
primary say it is a replica before it hears the new primary claim its slots drops
them, and ``CLUSTER SLOTS`` leaves them out. So a read again prefers a node whose
map names an owner for every slot (:func:`read_fullest`); a link that kept the
other would send nothing to those slots until something else made it read again.
"""

from __future__ import annotations

from collections.abc import Iterable

from fencekit._redis.cluster.routing import HASH_SLOTS, Address, SlotMap
from fencekit._redis.hotpath import LeanConnection
from fencekit._redis.url import RedisTarget
from fencekit.errors import ConfigError, StoreError

__all__ = ["read_fullest", "read_slot_map"]


async def read_slot_map(target: RedisTarget, *, name: str | None = None) -> tuple[SlotMap, LeanConnection]:
    """The slot map from the first seed of ``target`` that answers, and the connection that read it.

    A server that is not a cluster node is a :class:`ConfigError` (the URL is
    wrong, not Redis); no seed answering is a :class:`StoreError` naming each.
    """
    failures: list[str] = []
    for host, port in target.seeds:
        try:
            conn = await LeanConnection.open(target.node(host, port), name=name)
        except StoreError as exc:
            failures.append(str(exc))
            continue
        try:
            reply = await conn.execute("CLUSTER", "SLOTS")
            return SlotMap.from_reply(reply, (host, port)), conn
        except StoreError as exc:
            conn.close()
            if "cluster support disabled" in str(exc):
                raise ConfigError(
                    f"Redis at {host}:{port} is not a Redis Cluster node (cluster support disabled): "
                    f"use a redis:// URL for it, not {target.redacted()}"
                ) from exc
            failures.append(f"{host}:{port}: {exc}")
        except BaseException:  # cancelled (a closing link's map read): the connection is nobody's
            conn.close()
            raise
    raise StoreError(f"no seed node of {target.redacted()} answered: {'; '.join(failures)}")


async def read_fullest(
    conns: Iterable[tuple[Address, LeanConnection]], target: RedisTarget, *, name: str | None = None
) -> SlotMap:
    """The map of the first of ``conns`` whose node names an owner for every slot, else the fullest
    one read (the cluster may really lack some: being set up, or a shard lost), else a seed's."""
    fullest: SlotMap | None = None
    for address, conn in conns:
        if conn.closed:
            continue
        try:
            slots = SlotMap.from_reply(await conn.execute("CLUSTER", "SLOTS"), address)
        except StoreError:
            continue
        if slots.served == HASH_SLOTS:
            return slots
        if fullest is None or slots.served > fullest.served:
            fullest = slots
    if fullest is None:
        fullest, conn = await read_slot_map(target, name=name)
        conn.close()
    return fullest
