"""The dependency loop: releases the tasks held for their parents (``Task(depends_on=...)``).

Each round reads the waiting hash of every registered queue that holds any
(``HLEN`` of each, then the entries of the non-empty ones), then the state and
result of every parent named there (one round trip), and decides per task
(:func:`decide`): every parent ``done`` -- release it with their results
(``dep_release.lua``); a parent that will never succeed (failed for good,
dead, cancelled, expired, or its record gone) -- cancel it naming that parent
(``dep_cancel.lua``), or, with ``on_parent_failure="run"``, release it once
every parent is final. Both scripts act only on a task still waiting, so
several loops (one per supervisor or ``Server``) release each task once. A
round runs every :data:`BUSY` s after one that moved a task, every
:data:`IDLE` s otherwise; its cost grows with the tasks held, not the queues'
length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson
import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, adrive, arun_batch, cmd
from fencekit.errors import PayloadError
from fencekit.jobs import codec
from fencekit.jobs._registry import queue_names
from fencekit.jobs.records import JobError, encode_error

__all__ = ["BUSY", "IDLE", "Decision", "DependencyLoop", "decide"]

BUSY, IDLE = 0.01, 0.5
QUEUES_EVERY = 5.0
"""Seconds between two reads of the queue registry."""
NEVER = frozenset({"failed", "dead", "cancelled", "expired"})
"""Parent states that will not become ``done``."""


class Decision(NamedTuple):
    """What to do with one held task: ``wait``, ``release`` (with ``results``) or ``cancel`` (``reason``)."""

    action: str
    results: dict[str, Any] | None = None
    reason: str = ""


def decide(parents: Sequence[str], states: dict[str, tuple[str | None, bytes | None]], run: bool) -> Decision:
    """The rule for one held task, given each parent's (state, result); a missing state is a
    parent whose record is gone."""
    if not run:
        for parent in parents:
            state = states[parent][0]
            if state is None or state in NEVER:
                what = "is gone (its record expired or was deleted)" if state is None else state
                return Decision("cancel", reason=f"parent {parent} {what}")
    results: dict[str, Any] = {}
    for parent in parents:
        state, result = states[parent]
        if state == "done":
            if result is not None:
                results[parent] = orjson.loads(result)
        elif state is not None and state not in NEVER:
            return Decision("wait")
    return Decision("release", results)


class DependencyLoop:
    """Releases or cancels held tasks (see the module docstring); :meth:`loop` runs it."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        logger: logging.Logger,
        *,
        max_payload: int,
        keep_finished: int,
    ) -> None:
        self.client = client
        self.keys = keys
        self.logger = logger
        self.max_payload = max_payload
        self.keep_finished = keep_finished
        self.released = 0
        self.cancelled = 0
        self._queues: list[str] = []
        self._queues_at = 0.0
        self._busy = False

    def loop(self) -> Loop:
        return Loop(
            "dependencies",
            self.resolve,
            lambda: BUSY if self._busy else IDLE,
            Backoff(self.logger, "dependency loop"),
        )

    async def resolve(self) -> int:
        """One round over every held task; how many it released or cancelled."""
        if time.monotonic() - self._queues_at > QUEUES_EVERY:
            self._queues = await adrive(self.client, queue_names(self.keys))  # poison names left out
            self._queues_at = time.monotonic()
        if not self._queues:
            return 0
        sizes = await arun_batch(
            self.client, Batch([cmd("hlen", self.keys.queue(q).waiting()) for q in self._queues])
        )
        held = [q for q, n in zip(self._queues, sizes, strict=True) if int(n)]
        if not held:
            self._busy = False
            return 0
        hashes = await arun_batch(
            self.client, Batch([cmd("hgetall", self.keys.queue(q).waiting()) for q in held])
        )
        tasks: list[tuple[str, str, dict[str, Any]]] = []
        for queue, entries in zip(held, hashes, strict=True):
            for jid, raw in entries.items():
                try:
                    tasks.append((queue, as_text(jid), orjson.loads(raw)))
                except orjson.JSONDecodeError:
                    self.logger.error(
                        "held task %s of queue %s is unreadable: left waiting", as_text(jid), queue
                    )
        parents = sorted({(q, p) for _, _, entry in tasks for q, p in entry["parents"]})
        read = await arun_batch(
            self.client,
            Batch([cmd("hmget", self.keys.queue(q).job(p), "state", "result") for q, p in parents]),
        )
        states = {
            p: (as_text(s) if s is not None else None, r)
            for (_, p), (s, r) in zip(parents, read, strict=True)
        }
        calls = []
        for queue, jid, entry in tasks:
            decision = decide([p for _, p in entry["parents"]], states, bool(entry.get("run")))
            if decision.action == "release":
                call = self._release(queue, jid, entry["env"], decision.results or {})
                calls.append(call if call is not None else self._cancel(queue, jid, self._too_big))
            elif decision.action == "cancel":
                calls.append(self._cancel(queue, jid, decision.reason))
        moved = 0
        if calls:
            for call, reply in zip(
                calls, await arun_batch(self.client, Batch(calls, slots=True)), strict=True
            ):
                if isinstance(reply, BaseException):
                    self.logger.error("dependency loop: %s failed: %s", call.script.name, reply)
                elif int(reply):
                    moved += 1
                    if call.script.name == "dep_release":
                        self.released += 1
                    else:
                        self.cancelled += 1
        self._busy = moved > 0
        return moved

    _too_big = "the parents' results make the task larger than max_payload"

    def _release(self, queue: str, jid: str, env: str, results: dict[str, Any]) -> scripts.Call | None:
        qk = self.keys.queue(queue)
        try:
            envelope = codec.decode(env)._replace(parents=results).encode()
        except PayloadError as exc:
            self.logger.error("held task %s of queue %s cannot be released: %s", jid, queue, exc)
            return None
        if len(envelope) > self.max_payload:
            return None
        return scripts.dep_release(
            waiting=qk.waiting(),
            pending=qk.pending,
            wake=qk.wake,
            record=qk.job(jid),
            jid=jid,
            envelope=envelope,
        )

    def _cancel(self, queue: str, jid: str, reason: str) -> scripts.Call:
        qk = self.keys.queue(queue)
        return scripts.dep_cancel(
            waiting=qk.waiting(),
            stats=qk.stats,
            record=qk.job(jid),
            finished=qk.finished,
            jid=jid,
            reason=encode_error(JobError("ParentFailed", reason)),
            keep_finished=self.keep_finished,
            done=qk.done_channel,
        )
