"""Burst mode's one rule: when are the queues of an app drained?

``Server(burst=True)`` and ``fencekit pool APP --burst`` serve until every
queue they serve is empty -- nothing pending, nothing scheduled, nothing in
flight in any consumer -- and then stop as on SIGTERM. The ``Server`` and
the pool's supervisor both decide with :class:`BurstWatch` (a pool's
children are simply stopped); :func:`fencekit.testing.drain` is a ``Server``
in burst mode.

**One observation** (:func:`observe`) is, per queue, one ``drain_probe.lua``
call -- LLEN of the list, ZCARD of the scheduled set, the summed HLEN of the
in-flight hashes of every registered consumer, and the queue's counters --
all read at one instant, since the keys of one queue share a hash tag. A
task is always in exactly one of those places (invariant I1), so one
queue's probe cannot miss a task of that queue that is still unfinished.

**Two races** remain between queues and over time, and the rule closes
both: *drained* means two consecutive all-empty observations **with every
queue's counters unchanged between them**.

- A task of queue A, running while B is probed, may enqueue into B and
  finish before A is probed: that observation sees both empty. The
  enqueue raised B's ``enqueued`` counter after B's first probe, so the
  next observation differs and the run goes on.
- A retry waits in the scheduled set (counted: a scheduled task is not
  drained) and the scheduler moves it into the list: the probe of one
  queue sees either place at one instant.

Anything that happened between the two observations changes a counter, so
"unchanged" means "nothing ran, nothing arrived". (On one Redis node the
probes of one pipeline mostly run back to back, so the first race needs
Redis Cluster, where each queue's probe goes to its own node, or a busy
server; the rule does not rely on either.)

**Tasks scheduled far ahead** (a delayed enqueue, a long retry delay) keep
the queue not drained: burst mode waits for them, as arq does, since a
batch run that drops or strands work silently is worse than a slow one.
``burst_timeout`` bounds the wait: past it the run stops anyway (tasks left
stay in Redis untouched) and reports what is left -- the pool exits with
:attr:`~fencekit.runtime.exits.ExitCode.LEFT`, ``Server.run()`` raises
:class:`~fencekit.errors.DrainTimeout`.

Cost: one HKEYS and one pipeline of one script per queue every
:data:`POLL` seconds, in the ``Server``'s or the supervisor's loop only,
never on a consumer's hot path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import redis.asyncio

from fencekit._aio.loops import Backoff, Loop
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import as_text, translated
from fencekit._redis.steps import apipeline

__all__ = ["POLL", "BurstWatch", "DrainRule", "Observation", "QueueLeft", "observe"]

POLL = 0.1
"""Seconds between two observations of burst mode."""


@dataclass(frozen=True, slots=True)
class QueueLeft:
    """What one queue holds at one instant, and its counters then."""

    name: str
    pending: int
    scheduled: int
    in_flight: int
    next_due: float | None = None
    """Unix time (s) of the earliest scheduled task, None when none is."""
    stats: Mapping[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.pending or self.scheduled or self.in_flight)

    def __str__(self) -> str:
        parts = [f"{self.pending} pending", f"{self.scheduled} scheduled", f"{self.in_flight} in flight"]
        if self.next_due is not None:
            parts.append(f"next due in {max(0.0, self.next_due - time.time()):.1f}s")
        return f"{self.name}: {', '.join(parts)}"


@dataclass(frozen=True, slots=True)
class Observation:
    """One look at every queue (see the module docstring)."""

    queues: tuple[QueueLeft, ...]

    @property
    def empty(self) -> bool:
        return all(q.empty for q in self.queues)

    def counters(self) -> tuple[Mapping[str, int], ...]:
        return tuple(q.stats for q in self.queues)

    def left(self) -> str:
        """The queues that still hold tasks, one clause each (``"work: 0 pending, 1 scheduled, ..."``)."""
        return "; ".join(str(q) for q in self.queues if not q.empty) or "nothing"


async def observe(client: redis.asyncio.Redis, keys: KeySpace, queues: Sequence[str]) -> Observation:
    """Probe every queue of ``queues`` once: HKEYS of the registry, then one pipeline."""
    with translated():
        consumers = [as_text(c) for c in await client.hkeys(keys.consumers)]
    calls = []
    for name in queues:
        qk = keys.queue(name)
        inflight = [qk.inflight(c) for c in consumers]
        calls.append(
            scripts.drain_probe(pending=qk.pending, scheduled=qk.scheduled, stats=qk.stats, inflight=inflight)
        )
    replies = await apipeline(client, calls)
    out = []
    for name, reply in zip(queues, replies):
        if isinstance(reply, BaseException):
            raise reply
        pending, scheduled, in_flight, due, flat = reply
        stats = {as_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        next_due = float(due) / 1000 if due else None
        out.append(QueueLeft(name, int(pending), int(scheduled), int(in_flight), next_due, stats))
    return Observation(tuple(out))


class DrainRule:
    """Drained: two consecutive all-empty observations with unchanged counters (module docstring)."""

    __slots__ = ("last", "previous")

    def __init__(self) -> None:
        self.previous: Observation | None = None
        self.last: Observation | None = None

    def drained(self, now: Observation) -> bool:
        """Take observation ``now``; True when it and the one before say the queues are drained."""
        before, self.previous, self.last = self.previous, now, now
        return before is not None and before.empty and now.empty and before.counters() == now.counters()


class BurstWatch:
    """Observes the queues every :data:`POLL` s and ends a burst run: drained, or out of time.

    ``ready()`` gates the first observation (a pool waits for its children);
    ``on_drained()`` is called once when the rule says drained,
    ``on_timeout(observation)`` once when ``timeout`` seconds passed first.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        queues: Sequence[str],
        logger: logging.Logger,
        *,
        on_drained: Callable[[], None],
        on_timeout: Callable[[Observation], None],
        timeout: float | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.keys = keys
        self.queues = list(queues)
        self.logger = logger
        self.on_drained = on_drained
        self.on_timeout = on_timeout
        self.timeout = timeout
        self.ready = ready
        self.rule = DrainRule()
        self.done = False
        self._started = time.monotonic()

    def loop(self) -> Loop:
        return Loop("burst", self.step, lambda: POLL, Backoff(self.logger, "burst watch", POLL, 1.0))

    async def step(self) -> None:
        """One observation; ends the run when drained or out of time."""
        if self.done or not self.ready():
            return
        now = await observe(self.client, self.keys, self.queues)
        if self.rule.drained(now):
            self.done = True
            self.logger.info("burst: every queue is empty (%s): stopping", ", ".join(self.queues))
            self.on_drained()
        elif self.timeout is not None and time.monotonic() - self._started >= self.timeout:
            self.done = True
            self.logger.error("burst: burst_timeout %gs passed with tasks left: %s", self.timeout, now.left())
            self.on_timeout(now)
