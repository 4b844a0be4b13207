"""Helpers of the Redis Cluster tests: queues on every master, a plain enqueue call, a paused migration."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fencekit._redis import scripts
from fencekit._redis.cluster.link import slot_of
from fencekit._redis.keys import KeySpace, QueueKeys
from fencekit.testing import RedisServer
from fencekit.testing.cluster import LocalCluster

KEYS = KeySpace("fencekit")


def queues_on_every_master(local: LocalCluster, per_master: int = 1) -> list[str]:
    """Queue names whose slots cover every master, ``per_master`` each, grouped in the masters' order."""
    masters = local.masters
    found: dict[int, list[str]] = {m.port: [] for m in masters}
    n = 0
    while any(len(names) < per_master for names in found.values()):
        name = f"q{n}"
        n += 1
        names = found[local.owner(KEYS.queue(name).pending).port]
        if len(names) < per_master:
            names.append(name)
    return [name for m in masters for name in found[m.port]]


def enqueue(qk: QueueKeys, jid: str) -> scripts.Call:
    """``enqueue.lua`` of one minimal envelope to ``qk``'s queue, now."""
    envelope = f'{{"jid":"{jid}","queue":"{qk.name}","operation":"op","params":{{}}}}'.encode()
    return scripts.enqueue(
        pending=qk.pending,
        scheduled=qk.scheduled,
        stats=qk.stats,
        wake=qk.wake,
        delay_ms=0,
        envelopes=[envelope],
    )


@dataclass
class Migration:
    """A slot being moved (see :func:`migrating`): ``source`` still owns it, ``target`` imports it."""

    source: RedisServer
    target: RedisServer
    mover: asyncio.Future[None]
    go_on: threading.Event

    def move_by_hand(self, key: str) -> None:
        """``MIGRATE`` one key now: the source answers ``ASK`` for it from here on."""
        with self.source.client() as source:
            source.execute_command("MIGRATE", self.target.host, self.target.port, "", 0, 5000, "KEYS", key)

    def resume(self) -> None:
        """Let the migration move the rest of the keys (one per ``MIGRATE``, 20 ms apart)."""
        self.go_on.set()


@contextlib.asynccontextmanager
async def migrating(cluster: LocalCluster, key: str) -> AsyncIterator[Migration]:
    """Move ``key``'s slot to another master in a thread, held in MIGRATING/IMPORTING until ``resume()``.

    On exit the migration is resumed and awaited: the slot is the target's.
    """
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    go_on = threading.Event()
    source = cluster.owner(key)
    target = next(m for m in cluster.masters if m.port != source.port)

    def on_migrating() -> None:
        loop.call_soon_threadsafe(started.set)
        go_on.wait(10)

    mover = asyncio.ensure_future(
        asyncio.to_thread(
            cluster.move_slot, slot_of(key), target, batch=1, pause_between=0.02, on_migrating=on_migrating
        )
    )
    try:
        await asyncio.wait_for(started.wait(), 10)
        yield Migration(source, target, mover, go_on)
    finally:
        go_on.set()
        await mover
