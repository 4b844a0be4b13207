"""Redis Cluster routing without I/O: slots, the slot map, and the one rule that follows redirects.

Every fencekit script keeps its keys under one queue's hash tag (I5 of
docs/design.md), so an op belongs to one slot and a slot to one primary.
:class:`SlotMap` says which; :func:`route_steps` sends ops to their owners
and follows the answers (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``)
without ever re-sending something that may have run. Two drivers run it:
the lean :class:`~fencekit._redis.cluster.link.ClusterLink` and redis-py's batches
(:mod:`fencekit._redis.cluster.batches`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Generator, Sequence
from typing import Any

from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

from fencekit._redis.run import Redirected, TryAgain, as_text, translate_error
from fencekit.errors import StoreError

__all__ = [
    "HASH_SLOTS",
    "MAX_REDIRECTS",
    "REFRESH",
    "TRYAGAIN_LIMIT",
    "TRYAGAIN_PAUSE",
    "Address",
    "Refresh",
    "Send",
    "SlotMap",
    "redirect_of",
    "route_steps",
    "slot_of",
]

Address = tuple[str, int]

HASH_SLOTS = 16384

MAX_REDIRECTS = 8
"""Redirects one call may follow before the link gives up (a map that keeps moving): from the
second on, each after a pause of :data:`TRYAGAIN_PAUSE` times its number (0.7 s in all)."""
TRYAGAIN_PAUSE = 0.02
TRYAGAIN_LIMIT = 25
"""``TRYAGAIN`` retries of one call (x :data:`TRYAGAIN_PAUSE`: about 0.5 s of a migration); then the
``TryAgain`` stays in its slot: a consumer sends that settle or claim with its next turn, so one queue
whose keys are being moved holds the others' turns up by half a second at most."""


def slot_of(key: str | bytes) -> int:
    """The hash slot of ``key`` (its ``{tag}`` when it has one), as the servers compute it."""
    return key_slot(key.encode() if isinstance(key, str) else key)


class SlotMap:
    """Which primary serves each of the 16384 slots (I/O-free)."""

    __slots__ = ("_owners", "_starts", "served")

    def __init__(self, ranges: Sequence[tuple[int, int, Address]]) -> None:
        ordered = sorted(ranges)
        self._starts = [start for start, _, _ in ordered]
        self._owners = [(end, owner) for _, end, owner in ordered]
        self.served = sum(end - start + 1 for start, end, _ in ordered)
        """How many slots have an owner in it (:data:`HASH_SLOTS` when the node asked knew all)."""

    @classmethod
    def from_reply(cls, reply: Any, asked: Address) -> SlotMap:
        """Parse ``CLUSTER SLOTS``; a node announced without an address is the one ``asked``."""
        ranges: list[tuple[int, int, Address]] = []
        for entry in reply or ():
            start, end, primary = int(entry[0]), int(entry[1]), entry[2]
            host = as_text(primary[0]) or asked[0]
            ranges.append((start, end, (host, int(primary[1]))))
        if not ranges:
            raise StoreError(f"the Redis Cluster node at {asked[0]}:{asked[1]} has no slots assigned yet")
        return cls(ranges)

    def get(self, slot: int) -> Address | None:
        """The primary serving ``slot``; None when this map names none."""
        i = bisect.bisect_right(self._starts, slot) - 1
        if i >= 0:
            end, owner = self._owners[i]
            if slot <= end:
                return owner
        return None

    def owner(self, slot: int) -> Address:
        """The primary serving ``slot``; :class:`StoreError` when this map names none.

        A map may lack a slot for a moment in a failover (read from a node that dropped
        the old primary's slots before it heard of the new one): routing reads it again.
        """
        owner = self.get(slot)
        if owner is None:
            raise StoreError(f"no Redis Cluster node serves hash slot {slot} (cluster down or being set up?)")
        return owner

    @property
    def primaries(self) -> set[Address]:
        return {owner for _, owner in self._owners}


class Refresh:
    """A request of :func:`route_steps`: read the slot map again, then answer ``None``."""


REFRESH = Refresh()
Send = list[tuple[Address, list[int], bool]]
"""A request of :func:`route_steps`: per node, the ops (indices) to send there and whether behind
``ASKING``; answered with each part's replies (errors in their slots), in order."""


def redirect_of(reply: Any) -> Redirected | TryAgain | None:
    """The redirect or ``TRYAGAIN`` a reply stands for (ours or redis-py's exception), else None."""
    if isinstance(reply, (Redirected, TryAgain)):
        return reply
    if isinstance(reply, (MovedError, AskError, TryAgainError, ClusterDownError)):
        mapped = translate_error(reply)
        if isinstance(mapped, (Redirected, TryAgain)):
            return mapped
    return None


def route_steps(
    slots: Sequence[int], owner: Callable[[int], Address]
) -> Generator[Send | Refresh | float, Any, list[Any]]:
    """Send ops of the given hash ``slots`` to their nodes, following redirects; their replies in order.

    The one routing rule of both cluster drivers (the lean :class:`ClusterLink`
    and redis-py's batches, :mod:`fencekit._redis.steps`). Yields a
    :data:`Send` (answered with the replies), :data:`REFRESH` (read the map
    again: ``owner`` then answers from the new one) or a pause in seconds
    (``TRYAGAIN``). Nothing is re-sent that a node may have run: ``MOVED`` and
    ``ASK`` say the node did not run it, and so do ``TRYAGAIN`` and ``CLUSTERDOWN``
    (a failed primary not replaced yet: paused on like ``TRYAGAIN``). A ``MOVED``
    op goes next to the node the answer named (the map read next may come from a
    node that has not heard of a failover yet). An op whose slot ``owner`` says no
    node serves (a ``StoreError``: a map read from a node amid a failover) is
    not sent: the map is read again, as for a ``MOVED``. An op still
    redirected or unserved after :data:`MAX_REDIRECTS` map reads, or refused with
    ``TRYAGAIN`` :data:`TRYAGAIN_LIMIT` times, keeps that error in its slot.
    """
    replies: list[Any] = [None] * len(slots)
    todo = list(range(len(slots)))
    redirects = tries = 0
    moved_to: dict[int, Address] = {}  # a MOVED's word beats a map read from a node not told yet
    while todo:
        groups: dict[Address, list[int]] = {}
        unserved: list[int] = []
        for i in todo:
            slot = slots[i]
            try:
                address = moved_to.get(slot) or owner(slot)
            except StoreError as exc:  # the map names no owner: not sent, the map is read again
                replies[i] = exc
                unserved.append(i)
                continue
            groups.setdefault(address, []).append(i)
        results = (yield [(addr, idx, False) for addr, idx in groups.items()]) if groups else []
        todo = unserved
        asks: dict[Address, list[int]] = {}
        moved = bool(unserved)
        for idx, result in zip(groups.values(), results, strict=True):
            for i, reply in zip(idx, result, strict=True):
                replies[i] = reply
                redirect = redirect_of(reply)
                if isinstance(redirect, Redirected) and redirect.kind == "ASK":
                    asks.setdefault(redirect.address, []).append(i)
                elif redirect is not None:
                    if isinstance(redirect, Redirected):
                        moved = True
                        moved_to[slots[i]] = redirect.address
                    todo.append(i)
        if asks:
            results = yield [(addr, idx, True) for addr, idx in asks.items()]
            for idx, result in zip(asks.values(), results, strict=True):
                for i, reply in zip(idx, result, strict=True):
                    replies[i] = reply
                    if isinstance(redirect_of(reply), TryAgain):
                        todo.append(i)
        if not todo:
            break
        if moved:
            redirects += 1
            if redirects > MAX_REDIRECTS:
                break
            if redirects > 1:  # the nodes disagree while a failover settles: give it a moment
                yield TRYAGAIN_PAUSE * redirects
            yield REFRESH
        else:
            tries += 1
            if tries > TRYAGAIN_LIMIT:
                break
            yield TRYAGAIN_PAUSE
        todo.sort()
    return replies
