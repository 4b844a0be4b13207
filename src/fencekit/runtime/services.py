"""The components that are not the hot path, assembled once for ``Server`` and the supervisor.

Heartbeat, reaper, scheduler, history sampler, the batches' note mover and
reconciler (:mod:`fencekit.services._batches`), the dependency loop
(:mod:`fencekit.services._deps`), the periodic jobs' ticker (when a
worker declares ``cron``/``every``) and web server are built here, from the
settings and from a :class:`Placement` -- what the process that hosts them
knows: which consumers it beats for and knows alive, the job durations it
can see, its pool children (none for a ``Server``). Both placements start and
stop them in the same order:

1. :meth:`Services.open` -- Redis answers, the queue names are registered,
   the history has its first sample (the counters it books from);
2. :meth:`Services.start_web` -- the web port is bound (a busy port fails
   here, before any consumer or child starts);
3. the placement registers its consumers (:meth:`Services.beat_once`) and
   starts them;
4. :meth:`Services.start_loops` -- the periodic loops (plus the
   placement's own, such as the supervisor's hang watch);
5. :meth:`Services.close` -- each step bounded, so a stop always ends.

The loops are tasks of the services' own :class:`~fencekit._aio.scope.TaskScope`
(nested in the placement's when it passes one), which :meth:`Services.close`
closes: every loop cancelled and awaited, one that swallows its cancellation
cancelled again, and named if it still runs after :data:`STOP_STEP`. The web
server owns its task (:class:`~fencekit.web._serve.WebServer`) and stops it
gracefully.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import redis.asyncio

from fencekit._aio.loops import Loop
from fencekit._aio.scope import TaskScope
from fencekit._redis.clients import aclose_client, async_client, check_topology
from fencekit._redis.keys import KeySpace
from fencekit._redis.url import RedisTarget
from fencekit.consume._settle import Retention
from fencekit.errors import ConfigError, StoreError
from fencekit.hooks import FenceKitHooks
from fencekit.jobs._registry import ConsumerRecord, register_queues
from fencekit.jobs.histogram import DurationHistogram, QueueDurations
from fencekit.jobs.worker import WorkerRegistry
from fencekit.services._batches import BatchLoops
from fencekit.services._deps import DependencyLoop
from fencekit.services._heartbeat import Heartbeat
from fencekit.services._reaper import Reaper
from fencekit.services._sampler import HistorySampler
from fencekit.services._scheduler import Scheduler
from fencekit.services._ticker import Ticker

if TYPE_CHECKING:
    from fencekit.services.relay import Relay
    from fencekit.web._serve import WebServer
    from fencekit.web._views import BatchCounts, LoopView
    from fencekit.web.source import ChildView

__all__ = ["GRACE_MARGIN", "STOP_STEP", "Placement", "Services"]

STOP_STEP = 5.0  # the most one step of a shutdown may take
GRACE_MARGIN = 5.0
"""Seconds past ``grace`` a process that runs jobs may take to stop: the pool's supervisor kills
a child still running then. A consumer gives Redis :data:`~fencekit.consume._returns.RETURN_WAIT`
of it, so a ``Server`` or a child whose Redis hangs still stops before ``grace`` + this."""


class Placement(Protocol):
    """What the process hosting the services tells them (a ``Server`` or a ``Supervisor``)."""

    def beat_entries(self) -> Mapping[str, ConsumerRecord]:
        """The consumers to register and beat for now."""

    def alive_consumers(self) -> Collection[str]:
        """Consumers this process knows are alive: its own reaper never reaps them."""

    def on_beat(self, when: float) -> None:
        """A beat reached Redis at ``when`` (monotonic); the supervisor tells its children."""

    def running(self) -> int:
        """Tasks running in this process or its children now."""

    def on_reset(self, resets: int) -> None:
        """Redis lost its data (the ``resets``-th time); the supervisor tells its children."""

    def durations(self) -> DurationHistogram:
        """Job durations this process can see, for /admin and /metrics."""

    def queue_durations(self) -> QueueDurations:
        """The same per queue, for the history (``queue.history``)."""

    def children_view(self) -> tuple[ChildView, ...] | None:
        """The pool's children, or None for a ``Server``."""

    def desired_workers(self) -> int:
        """Worker processes this host would run now: 1 for a ``Server``, the pool's (autoscaled) count."""


class Services:
    """Heartbeat, reaper, scheduler, history and web of one placement (see the module docstring)."""

    def __init__(
        self,
        placement: Placement,
        *,
        settings: Mapping[str, Any],
        target: RedisTarget,
        keys: KeySpace,
        registry: WorkerRegistry,
        logger: logging.Logger,
        redis: redis.asyncio.Redis | None = None,
        hooks: FenceKitHooks | None = None,
        scope: TaskScope | None = None,
    ) -> None:
        """``redis``: the client to use (and close at the end) instead of a new one.

        ``hooks``: the reaper's (:mod:`fencekit.hooks`). ``scope``: the placement's task
        scope; the services' own is nested in it.
        """
        self.placement = placement
        self.settings = settings
        self.target = target
        self.keys = keys
        self.queues = registry.queues
        self.logger = logger
        ttl = settings["heartbeat_ttl"]
        self.redis = redis if redis is not None else async_client(target)
        self.heartbeat = Heartbeat(
            self.redis,
            keys,
            ttl,
            logger,
            placement.beat_entries,
            placement.on_beat,
            queues=self.queues,
            running=placement.running,
            on_reset=placement.on_reset,
        )
        self.reaper = Reaper(
            self.redis,
            keys,
            registry,
            ttl,
            logger,
            Retention.of(settings),
            alive=placement.alive_consumers,
            hooks=hooks,
        )
        self.scheduler = Scheduler(self.redis, keys, self.queues, logger)
        self.history = HistorySampler(self.redis, keys, self.queues, logger, placement.queue_durations)
        # the batch and dependency loops poll: a client of their own, so that their retries while
        # a cluster fails over never hold up the heartbeat's
        self.polling = async_client(target)
        self.batches = BatchLoops(self.polling, keys, self.queues, logger)
        self.dependencies = DependencyLoop(
            self.polling,
            keys,
            logger,
            max_payload=settings["max_payload"],
            keep_finished=settings["keep_finished"],
        )
        self.loops: list[Loop] = [
            self.heartbeat.loop(),
            self.reaper.loop(),
            self.scheduler.loop(),
            self.history.loop(),
            *self.batches.loops(),
            self.dependencies.loop(),
        ]
        # A burst run drains what is there: it starts no new periodic runs (docs/guides/periodic.md).
        schedules = [] if settings.get("burst") else registry.schedules()
        self.ticker = (
            Ticker(self.redis, keys, schedules, logger, max_payload=settings["max_payload"])
            if schedules
            else None
        )
        if self.ticker is not None:
            self.loops.append(self.ticker.loop())
        self.relay: Relay | None = None
        if settings.get("outbox_url"):
            from fencekit.services.relay import Relay  # needs SQLAlchemy: only with an outbox

            self.relay = Relay(
                self.redis,
                keys,
                settings["outbox_url"],
                table=settings["outbox_table"],
                batch=settings["outbox_batch"],
                poll=settings["outbox_poll"],
                logger=logger,
            )
            self.loops.append(self.relay.loop())
        self.web: WebServer | None = None
        self.scope = scope.child("services") if scope is not None else TaskScope("services", logger=logger)
        self.scope.close_wait = STOP_STEP
        self._tasks: list[asyncio.Task[None]] = []

    async def open(self) -> None:
        """Check that Redis answers (and is a cluster exactly when the URL says so: ConfigError
        otherwise), register the queue names and take the history's first sample; raises StoreError.

        A queue's first sample has no earlier counters to compare with and books nothing, so it
        is taken here, before any consumer or pool child can finish a job: the jobs that end
        before the loop's first round are booked by it. A queue whose sample fails (a foreign key
        under its name) is logged and left to the loop: it must not stop the other queues.
        """
        await self._wait_for_redis()
        await register_queues(self.redis, self.keys, self.queues)
        try:
            await self.history.sample()
        except StoreError as exc:
            self.logger.warning("history: the first sample failed (%s); the loop samples again", exc)

    async def _wait_for_redis(self) -> None:
        """``check_topology``, again and again for ``wait_for_redis`` seconds while Redis does not
        answer (one line when the wait begins, one when it ends); a ConfigError at once."""
        patience = self.settings.get("wait_for_redis", 0.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay = 0.1
        while True:
            try:
                await check_topology(self.redis, self.target)
            except StoreError as exc:
                waited = loop.time() - started
                if waited + delay > patience:
                    raise
                if delay == 0.1:
                    self.logger.warning(
                        "Redis at %s does not answer (%s): waiting up to %gs (wait_for_redis)",
                        self.target.redacted(),
                        exc,
                        patience,
                    )
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            if delay > 0.1:
                self.logger.info(
                    "Redis at %s answered after %.1fs", self.target.redacted(), loop.time() - started
                )
            return

    async def start_web(self) -> None:
        """Start /live /ready /admin /metrics on ``web_port`` (unless None); ConfigError if it is busy."""
        if self.settings["web_port"] is None:
            return
        from fencekit.web._security import allowed_hosts
        from fencekit.web._serve import WebServer
        from fencekit.web.app import create_app
        from fencekit.web.source import AdminSource

        source = AdminSource(
            self.redis,
            self.keys,
            self.queues,
            children=self.placement.children_view,
            durations=self.placement.durations,
            loops=self.loop_health,
            batches=self.batch_counts,
            target=self.target,
            heartbeat_ttl=self.settings["heartbeat_ttl"],
            logger=self.logger,
            keep_finished=self.settings["keep_finished"],
        )
        source.desired_workers = self.placement.desired_workers
        app = create_app(
            source,
            admin_username=self.settings["admin_username"],
            admin_password=self.settings["admin_password"],
            hosts=allowed_hosts(self.settings["web_hosts"], self.settings["web_host"]),
        )
        if self.relay is not None:
            from fencekit.web._metrics import RelayCollector

            app.state.registry.register(RelayCollector(self.relay.stats))
        host, port = self.settings["web_host"], self.settings["web_port"]
        web = WebServer(app, host, port, logger=self.logger)
        try:
            await web.start()
        except OSError as exc:
            raise ConfigError(
                f"web_port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                "choose another port (--web-port, FENCEKIT_WEB_PORT) or off"
            ) from exc
        self.web = web

    async def beat_once(self) -> None:
        """Register the placement's consumers now, before they may claim; raises StoreError."""
        await self.heartbeat.beat_once()

    def start_loops(self, extra: Sequence[Loop] = ()) -> None:
        """Run the heartbeat, reaper, scheduler and history loops (and ``extra``) until :meth:`close`."""
        self.loops.extend(extra)
        self._tasks = [self.scope.start(loop.run(), name=f"fencekit-{loop.name}") for loop in self.loops]

    def loops_alive(self) -> bool:
        """True while every started loop runs (a loop that ended is a bug: the watchdog must notice)."""
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    def loop_health(self) -> tuple[LoopView, ...]:
        """Each started loop's rounds, survived errors and liveness (for /metrics)."""
        from fencekit.web._views import LoopView

        return tuple(
            LoopView(loop.name, loop.runs, loop.errors, not task.done())
            for loop, task in zip(self.loops, self._tasks)
        )

    def batch_counts(self) -> BatchCounts:
        """What the batch loops did: notes applied, batches finished, notes dropped (for /metrics)."""
        from fencekit.web._views import BatchCounts

        return BatchCounts(self.batches.applied, self.batches.finished, self.batches.malformed)

    async def close(self) -> None:
        """Stop the loops and the web server and close Redis, each step within :data:`STOP_STEP`."""
        await self.scope.aclose()  # within STOP_STEP; names a loop that does not end
        self._tasks = []
        if self.relay is not None:
            await self.bounded("closing the outbox relay's database connections", self.relay.close())
        if self.web is not None:
            await self.bounded("stopping the web server", self.web.stop())
            self.web = None
        await self.bounded("closing the Redis connections", aclose_client(self.redis))
        await self.bounded("closing the polling loops' connections", aclose_client(self.polling))

    async def bounded(self, what: str, awaitable: Awaitable[Any]) -> None:
        """One step of a shutdown, given at most :data:`STOP_STEP` seconds: a stop must end."""
        try:
            await asyncio.wait_for(awaitable, STOP_STEP)
        except asyncio.TimeoutError:
            self.logger.error("stop: %s took longer than %.0fs; going on without it", what, STOP_STEP)
