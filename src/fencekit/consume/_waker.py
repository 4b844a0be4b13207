"""Waking an idle consumer within about a millisecond of an enqueue, without polling.

Every enqueue (and every requeue, retry move or claim that leaves work
behind) pushes at most one marker onto its queue's wake list
(``lua/_wake.lua``). An idle consumer blocks in ``BLPOP`` on the wake lists
of all its queues over a connection of its own; the reply names the queue
that has work. The ``BLPOP`` times out every :data:`IDLE_POLL` seconds as a
safety re-poll, so a lost marker costs at most that long.

Claiming in the wake-up's round trip: when the consumer offers claims
(``claims()``: at most :data:`WAKE_CLAIM_QUEUES` queues, lean link, lease
fresh), the waker writes them behind its ``BLPOP`` in one write
(:meth:`~fencekit._redis.hotpath.LeanConnection.block_then`). Redis runs
them the moment the ``BLPOP`` returns, so the claimed tasks arrive with the
wake-up: one round trip from enqueue to claim instead of two (not on a
Redis Cluster, where one ``BLPOP`` may name one slot's keys only: there
each queue's wake list has a wait of its own, :meth:`Waker._run_per_slot`).
They are the
consumer's ordinary ``ack_claim.lua`` calls (fresh tokens, the in-flight
hash), so nothing about fencing changes; ``on_claimed`` hands the replies to
the consumer. A failure while claims were written tells ``on_lost`` (they
may have run: the consumer reconciles). :meth:`stop` unblocks a waiting
``BLPOP`` (``CLIENT UNBLOCK`` on the consumer's own connection) and waits
for its claims' replies, so a stop never leaves a claim running behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fencekit._aio.loops import Backoff
from fencekit._aio.scope import TaskScope
from fencekit._redis.cluster.link import slot_of
from fencekit._redis.link import Link, open_link
from fencekit._redis.run import as_text
from fencekit._redis.scripts import Call
from fencekit._redis.sentinel import MasterWatch
from fencekit._redis.url import RedisTarget
from fencekit.errors import FenceKitError, StoreError

__all__ = ["IDLE_POLL", "WAKE_CLAIM_QUEUES", "Waker"]

IDLE_POLL = 1.0
WAKE_CLAIM_QUEUES = 8
"""Most queues a consumer claims from behind its wake-up (each costs a script call per wake-up)."""

Claims = list[tuple[Any, Call]]  # (the consumer's claim item, its ack_claim call)


class Waker:
    """Blocks on the wake lists while :attr:`wanted` is set; tells ``on_wake`` what it learned.

    ``on_wake(queue)`` gets the queue that has work, or ``None`` when the
    consumer should look at every queue again (the safety poll, or Redis
    came back after a failure). With claims offered by ``claims()``, their
    replies go to ``on_claimed(items, replies)`` instead (see the module
    docstring); ``poll`` is then the BLPOP's timeout.
    """

    def __init__(
        self,
        target: RedisTarget,
        *,
        watch: MasterWatch | None,
        link_kind: str,
        name: str,
        wake_keys: Mapping[str, str],
        logger: logging.Logger,
        on_wake: Callable[[str | None], None],
        claims: Callable[[], Claims | None] = lambda: None,
        on_claimed: Callable[[list[Any], list[Any]], None] = lambda items, replies: None,
        on_lost: Callable[[], None] = lambda: None,
        poll: float = IDLE_POLL,
        scope: TaskScope | None = None,
    ) -> None:
        """``scope``: the consumer's task scope (a cluster's per-slot waits nest in it)."""
        self.target = target
        self.watch = watch
        self.link_kind = link_kind
        self.name = name
        self.wake_keys = dict(wake_keys)  # wake key -> queue
        self.on_wake = on_wake
        self.claims = claims
        self.on_claimed = on_claimed
        self.on_lost = on_lost
        self.poll = poll
        self.wanted = asyncio.Event()
        self._backoff = Backoff(logger, f"consumer {name}: waiting for work")
        self._logger = logger
        self._link: Link | None = None
        self._client_id: int | None = None  # of the wake connection, for CLIENT UNBLOCK
        self.claiming = False
        """True while claims wait behind the BLPOP (their tasks may be claimed at any moment)."""
        self._stopping = False
        self._scope = scope

    async def _connected(self) -> Link:
        if self._link is None or self._link.closed:
            self._client_id = None
            self._link = await open_link(self.target, name=f"fk:{self.name}:wake", kind=self.link_kind)
            if self.link_kind == "lean":
                try:
                    self._client_id = int(await self._link.execute("CLIENT", "ID"))
                except FenceKitError:
                    if self._link.closed:
                        raise
                    # an ACL without CLIENT ID: wake-ups without claims, as before
                    self._client_id = None
        return self._link

    async def run(self) -> None:
        """Wait for work until cancelled or :meth:`stop`."""
        try:
            if self.target.is_cluster:
                await self._run_per_slot()
            else:
                await self._run()
        finally:
            self._backoff.rest()

    async def _run(self) -> None:
        keys = list(self.wake_keys)
        while True:
            await self.wanted.wait()
            if self._stopping:
                return
            claims: Claims | None = None
            try:
                link = await self._connected()
                claims = self.claims() if self._client_id is not None else None
                if claims:
                    self.claiming = True
                    try:
                        reply, replies = await link.block_then(
                            ("BLPOP", *keys, self.poll), [call for _, call in claims], timeout=self.poll + 5.0
                        )
                    finally:
                        self.claiming = False
                else:
                    reply = await link.execute("BLPOP", *keys, IDLE_POLL, timeout=IDLE_POLL + 5.0)
            except Exception as exc:  # StoreError, or a bug: the back-off logs it; wake-ups go on
                if claims:
                    self.on_lost()
                await self._backoff.pause(exc)
                self.on_wake(None)
                continue
            self._backoff.succeeded()
            if claims:
                try:
                    self.on_claimed([item for item, _ in claims], replies)
                except Exception:  # a bug must not end the wake-ups or keep the slots reserved
                    self._logger.exception("consumer %s: taking the claims of a wake-up failed", self.name)
                    self.on_lost()
                    self.on_wake(None)
            else:
                self.on_wake(self.wake_keys[as_text(reply[0])] if reply else None)

    async def _run_per_slot(self) -> None:
        """On a Redis Cluster: one ``BLPOP`` per slot of the wake keys, each on its own link.

        One ``BLPOP`` may name keys of one slot only (and one queue is one
        slot), so each group waits on a connection of its own to the node
        that owns it; docs/design/cluster.md ("Waking idle consumers on a cluster")
        says why not one wait per node. No claims ride behind these waits:
        a wake-up makes the loop claim (two round trips instead of one).
        The waits are tasks of a scope of this call: one that fails ends
        the others (and this call, with its error); they end with it.
        """
        groups: dict[int, list[str]] = {}
        for key in self.wake_keys:
            groups.setdefault(slot_of(key), []).append(key)
        name = f"consumer {self.name}: wake-up waits"
        slots = self._scope.child(name) if self._scope is not None else TaskScope(name, logger=self._logger)
        async with slots:
            tasks = [
                slots.start(self._wait_slot(keys), name=f"fencekit-wake-{self.name}-{slot}", awaited=True)
                for slot, keys in groups.items()
            ]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # the first failure ends them all

    async def _wait_slot(self, keys: list[str]) -> None:
        # A lost BLPOP costs a wake-up at most (each failure wakes its queues): a failover under
        # it is a WARNING here; Redis going away is the process's outage (fencekit._aio.outage).
        backoff = Backoff(
            self._logger, f"consumer {self.name}: waiting for work on {keys[0]}", expected=(StoreError,)
        )
        link: Link | None = None
        try:
            while True:
                await self.wanted.wait()
                if self._stopping:
                    return
                try:
                    if link is None or link.closed:
                        link = await open_link(self.target, name=f"fk:{self.name}:wake", kind=self.link_kind)
                    reply = await link.execute("BLPOP", *keys, self.poll, timeout=self.poll + 5.0)
                except Exception as exc:  # StoreError, or a bug: the back-off logs it; wake-ups go on
                    await backoff.pause(exc)
                    for key in keys:
                        self.on_wake(self.wake_keys[key])
                    continue
                backoff.succeeded()
                woken = [as_text(reply[0])] if reply else keys  # a timeout: look at these queues again
                for key in woken:
                    self.on_wake(self.wake_keys[key])
        finally:  # cancelled by run()'s end: the link is this wait's alone
            backoff.rest()
            if link is not None:
                await link.aclose()

    async def interrupt(self, unblock: Callable[[int], Awaitable[Any]]) -> None:
        """End a wait with claims behind it now (they run at once), so that the next wait is
        armed with what the consumer knows now: a queue just paused gets no claims written behind
        a wait that was armed before the pause was seen (and would claim what it enqueues later)."""
        if self.claiming and self._client_id is not None:
            with contextlib.suppress(FenceKitError):  # not allowed, or Redis gone: within its poll
                await unblock(self._client_id)

    async def stop(self, task: asyncio.Task[None], unblock: Callable[[int], Awaitable[Any]]) -> None:
        """Make :meth:`run` (running as ``task``) end; with claims behind the BLPOP, unblock it and
        wait for their replies rather than leave them to run after the consumer is gone. The
        owner's scope then cancels ``task`` and awaits it."""
        self._stopping = True
        if self.claiming and self._client_id is not None:
            try:
                await unblock(self._client_id)
            except FenceKitError:
                pass  # not allowed (ACL) or Redis gone: the BLPOP returns within its poll anyway
            await asyncio.wait({task}, timeout=self.poll + 5.0)

    async def aclose(self) -> None:
        if self._link is not None:
            await self._link.aclose()
