"""The reaper: returns the in-flight tasks of dead consumers.

It runs on a fixed interval (several times per heartbeat TTL) over bounded
batches: it lists consumers whose beat is older than the TTL (server clock),
and for each one moves every task of its in-flight hashes back to its queue.
A crash counts as a failed attempt under the retry policy of *this* reaper's
workers (the default policy for a worker it does not have): the task goes
back at once with ``attempt + 1``, or is finished as failed. Each move is
fenced (``requeue.lua``/``fail.lua`` act only while the delivery is still in
flight), so two reapers never return a task twice, and each raises the job's
fence so the dead consumer's late writes are refused.

The consumer is forgotten last, and only if its beat is still missing at that
moment (``forget.lua``): a consumer that comes back keeps its registration,
while its returned deliveries stay fenced out.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Iterable

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun, as_text, translated
from fencekit._redis.steps import apipeline
from fencekit.consume import _settle as settle
from fencekit.consume._observe import event_of_raw
from fencekit.consume._settle import Delivery, Retention
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.jobs._registry import ConsumerRecord, known_queues
from fencekit.jobs.worker import WorkerRegistry

__all__ = ["REAPS_PER_TTL", "Reaper"]

REAPS_PER_TTL = 3
BATCH = 50
SCAN_COUNT = 200


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


class Reaper:
    """Finds dead consumers and returns their tasks (see the module docstring)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        registry: WorkerRegistry,
        ttl: float,
        logger: logging.Logger,
        retention: Retention,
        alive: Callable[[], Collection[str]] | None = None,
        hooks: FenceKitHooks | None = None,
    ) -> None:
        """``hooks``: told of each task taken from a dead consumer (``on_reaped``)."""
        self.client = client
        self.hooks = check_hooks(hooks)
        self.keys = keys
        self.registry = registry
        self.ttl = ttl
        self.logger = logger
        self.retention = retention
        # Consumers this process knows are alive (its own, its children): never reaped here,
        # even when their beats went stale during an outage that just ended.
        self.alive = alive or (lambda: ())
        self.reaped_consumers = 0
        self.returned = 0
        self.failed = 0

    def loop(self) -> Loop:
        """The periodic reap, ``REAPS_PER_TTL`` times per TTL with jitter (peers do not reap in step)."""
        backoff = Backoff(self.logger, "reaper", base=1.0, cap=self.ttl / REAPS_PER_TTL)
        return Loop(
            "reaper", self.reap_once, lambda: self.ttl / REAPS_PER_TTL * random.uniform(0.8, 1.2), backoff
        )

    async def reap_once(self) -> int:
        """Reap every consumer whose beat expired; return how many tasks moved."""
        moved = 0
        while True:
            dead = await arun(
                self.client, scripts.expired(beats=self.keys.beats, ttl_ms=int(self.ttl * 1000), limit=BATCH)
            )
            ours = self.alive()
            for consumer_id in dead:
                if as_text(consumer_id) not in ours:
                    moved += await self.reap(as_text(consumer_id), forget_if_silent=True)
            if len(dead) < BATCH:
                return moved

    async def reap(
        self,
        consumer_id: str,
        *,
        forget_if_silent: bool,
        crashed: bool = True,
        queues: Iterable[str] | None = None,
    ) -> int:
        """Return the tasks of ``consumer_id`` and forget it.

        ``forget_if_silent`` False forgets it unconditionally (the supervisor
        knows its child is dead); True only if its beat is still missing.
        ``crashed`` False returns the tasks as they were (the supervisor cut a
        stop short) instead of counting a failed attempt.
        """
        if queues is None:
            queues = await self._queues_of(consumer_id)
        moved = 0
        for queue in queues:
            moved += await self._reap_queue(consumer_id, queue, crashed)
        ttl_ms = int(self.ttl * 1000) if forget_if_silent else 0
        forgotten = await arun(
            self.client,
            scripts.forget(
                consumers=self.keys.consumers, beats=self.keys.beats, consumer_id=consumer_id, ttl_ms=ttl_ms
            ),
        )
        if forgotten:
            self.reaped_consumers += 1
        if moved:
            why = (
                f"no heartbeat for {self.ttl:g}s: it died, or is paused or cut off from Redis"
                if forget_if_silent
                else "its process died"
                if crashed
                else "it exited on request with tasks still in flight"
            )
            self.logger.warning(
                "reaped consumer %s (%s): %d task(s) returned or failed%s",
                consumer_id,
                why,
                moved,
                "" if forgotten else " (it is alive again: kept registered)",
            )
        elif forgotten and forget_if_silent:
            self.logger.warning("forgot silent consumer %s (it had no tasks in flight)", consumer_id)
        return moved

    async def _queues_of(self, consumer_id: str) -> Iterable[str]:
        with translated():
            raw = await self.client.hget(self.keys.consumers, consumer_id)
        queues = ConsumerRecord.from_json(consumer_id, raw).queues
        if queues is not None:
            return queues
        return await known_queues(self.client, self.keys)  # no usable record: every queue ever used

    async def _reap_queue(self, consumer_id: str, queue: str, crashed: bool) -> int:
        inflight = self.keys.queue(queue).inflight(consumer_id)
        moved = 0
        cursor = 0
        while True:
            with translated():
                next_cursor, entries = await self.client.hscan(inflight, cursor, count=SCAN_COUNT)
            cursor = int(next_cursor)
            assert isinstance(entries, dict)
            verdicts = [self._judge(queue, inflight, field, raw, crashed) for field, raw in entries.items()]
            if verdicts:
                results = await apipeline(self.client, [v.call for v in verdicts])
                for verdict, result, (field, raw) in zip(verdicts, results, entries.items()):
                    if not isinstance(result, BaseException):
                        moved += 1
                        self._log(verdict, queue, consumer_id)
                        if self.hooks is not None:
                            token = settle.delivery_token(field)
                            self.hooks.job("reaped", event_of_raw(queue, token, raw))
            if cursor == 0:
                return moved

    def _judge(
        self, queue: str, inflight: str, field: bytes | str, raw: bytes | str, crashed: bool
    ) -> settle.Verdict:
        token = settle.delivery_token(field)
        if token is None:
            call = settle.corrupt(self.keys, queue, inflight, field, retention=self.retention)
            return settle.Verdict(call, None, False, "its in-flight entry is not a delivery token")
        delivery = Delivery(queue, inflight, token, _bytes(raw))
        if crashed:
            return settle.after_crash(self.keys, delivery, self.registry.policy, retention=self.retention)
        return settle.after_stop(self.keys, delivery, retention=self.retention)

    def _log(self, verdict: settle.Verdict, queue: str, consumer_id: str) -> None:
        """One line per task the reap did move (a move another reaper made first is not logged)."""
        if verdict.returned:
            self.returned += 1
            self.logger.warning(
                "task %s returned to queue %s from consumer %s (%s)",
                verdict.jid,
                queue,
                consumer_id,
                verdict.reason,
            )
        else:
            self.failed += 1
            self.logger.error(
                "task %s on queue %s failed permanently: %s", verdict.jid, queue, verdict.reason
            )
