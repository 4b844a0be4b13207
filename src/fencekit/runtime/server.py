"""``Server``: every component in one process and one event loop.

The consumer runs beside the shared services (heartbeat, reaper, scheduler,
web: :mod:`fencekit.runtime.services`) as tasks of one asyncio loop; the pool
places the same components in several processes instead. ``run()``
verifies Redis, starts the web server, runs the startup hooks, registers the
consumer, then works until SIGTERM/SIGINT (or :meth:`Server.stop`); on the
way out it stops claiming, lets running tasks finish within ``grace``
seconds, returns the rest to their queues at once, deregisters, runs the
shutdown hooks and closes Redis.

With ``burst=True`` it also stops by itself once every queue it serves is
drained (the rule of :mod:`fencekit.services.drain`, shared with the pool's
supervisor): ``run()`` then returns. Past ``burst_timeout`` with tasks left
it stops the same way and raises :class:`~fencekit.errors.DrainTimeout`.

Settings are those of :class:`fencekit.settings.ServerOptions`: a keyword
argument, else ``FENCEKIT_<NAME>``, else the default.

Every task of a run has an owner (:class:`~fencekit._aio.scope.TaskScope`):
the run's scope holds the services' (their loops) and the serving part's
(the consumer's task and the stop wait), which holds the consumer's own
(its jobs, waker and listener). Each is closed in the order above; the run's
scope last, which ends anything a part left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from typing_extensions import Unpack

from fencekit._aio.loops import Loop
from fencekit._aio.scope import TaskScope
from fencekit._log import default_logger
from fencekit._redis import scripts
from fencekit._redis.clients import async_client
from fencekit._redis.run import arun
from fencekit._redis.url import parse_url
from fencekit.consume._consumer import Consumer
from fencekit.consume._returns import RETURN_WAIT
from fencekit.errors import ConfigError, DrainTimeout, StoreError
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.jobs._registry import ConsumerRecord, consumer_id
from fencekit.jobs.functions import attach_client
from fencekit.jobs.histogram import DurationHistogram, QueueDurations
from fencekit.jobs.task import Task
from fencekit.jobs.worker import WorkerRegistry
from fencekit.produce.client import Client
from fencekit.produce.handle import Queue, QueueStats
from fencekit.runtime.hooks import H, Hook, check_hook, run_hooks
from fencekit.runtime.services import Services
from fencekit.services.drain import BurstWatch, Observation
from fencekit.settings import ServerOptions, ServerSettings, resolve_connecting

if TYPE_CHECKING:
    from fencekit.web._serve import WebServer
    from fencekit.web.source import ChildView

__all__ = ["Server"]


class Server:
    """Runs workers against a Redis (see the module docstring)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        hooks: FenceKitHooks | None = None,
        **options: Unpack[ServerOptions],
    ) -> None:
        """``hooks`` (:mod:`fencekit.hooks`) are told of its jobs, enqueues and reaps."""
        self.hooks = check_hooks(hooks)
        self.settings: ServerSettings = resolve_connecting(ServerSettings, redis_url, options, "Server")
        settings = self.settings
        self.target = parse_url(settings["redis_url"])
        self.concurrency = settings["concurrency"]
        self.heartbeat_ttl = settings["heartbeat_ttl"]
        self.grace = settings["grace"]
        self.web_host = settings["web_host"]
        self.web_port = settings["web_port"]
        self.registry = WorkerRegistry()
        self.logger = default_logger("fencekit.server")
        self.consumer_id = consumer_id("server")
        self.consumer: Consumer | None = None
        self.started = asyncio.Event()
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []
        self._stop = asyncio.Event()
        self._skipped = False  # a second stop signal skipped the grace
        self._redis = async_client(self.target)
        self._client = Client.sharing(settings, self._redis, self.hooks)
        self.keys = self._client.keys
        self.durable = self._client.durable
        self.services: Services | None = None
        self.scope: TaskScope | None = None
        """The task scope of the current run (every task it started is in it or nested in it)."""
        self._left: Observation | None = None  # what a burst run left at its timeout

    # configuration -----------------------------------------------------------
    def add_workers(self, *workers: object) -> None:
        """Register workers (classes or instances); bad settings raise :class:`ConfigError`."""
        self.registry.add(workers)

    def on_startup(self, hook: H) -> H:
        """Run ``hook`` after Redis is verified, before the consumer starts (decorator or call)."""
        self._startup.append(check_hook(hook, "on_startup"))
        return hook

    def on_shutdown(self, hook: H) -> H:
        """Run ``hook`` after the consumer stops, before Redis is closed (decorator or call)."""
        self._shutdown.append(check_hook(hook, "on_shutdown"))
        return hook

    # use -------------------------------------------------------------------
    @property
    def web(self) -> WebServer | None:
        """The running web server (None before :meth:`run` or with ``web_port=None``)."""
        return self.services.web if self.services is not None else None

    async def enqueue(self, task: Task, *, delay: float | timedelta | None = None) -> str:
        """Enqueue on the server's own connection (``delay`` as ``Client.enqueue``); returns the jid."""
        self._client.logger = self.logger
        return await self._client.enqueue(task, delay=delay)

    def queue(self, name: str) -> Queue:
        """A :class:`~fencekit.produce.handle.Queue` handle on the server's connection."""
        return self._client.queue(name)

    async def stats(self) -> QueueStats:
        """Counters summed over every queue (as ``Client.stats``)."""
        return await self._client.stats()

    def stop(self) -> None:
        """Ask :meth:`run` to shut down: running tasks get ``grace`` s to finish."""
        self._stop.set()

    def handle_term(self) -> None:
        """SIGTERM or SIGINT: :meth:`stop`; a second one cancels the running tasks at once."""
        if self._stop.is_set() and self.consumer is not None and not self._skipped:
            self._skipped = True
            self.logger.warning(
                "a second stop signal: stopping now, without the rest of the grace "
                "(running tasks cancelled; they go back to their queues)"
            )
            self.consumer.skip_grace()
        self.stop()

    handle_int = handle_term

    async def run(self) -> None:
        """Serve until stopped, or in burst mode until drained (see the module docstring)."""
        if not len(self.registry):
            raise ConfigError("no workers registered: call server.add_workers(...) before run()")
        self._stop = asyncio.Event()
        self._skipped = False
        self._left = None
        await self._serve()
        left = self.burst_left()
        if left is not None:
            timeout = self.settings["burst_timeout"]
            text = left.left()
            raise DrainTimeout(f"burst_timeout {timeout:g}s passed with tasks left: {text}", text)

    def burst_left(self) -> Observation | None:
        """What the last burst run left when its ``burst_timeout`` passed (None: it drained)."""
        return self._left

    async def _serve(self) -> None:
        self.scope = scope = TaskScope(f"server {self.consumer_id}", logger=self.logger)
        try:
            await self._serve_in(scope)
        finally:
            await scope.aclose()  # what a part left behind (each part closed its own)

    async def _serve_in(self, scope: TaskScope) -> None:
        serving = scope.child("serving")  # the consumer's task and the stop wait
        services = Services(
            self,
            settings=self.settings,
            target=self.target,
            keys=self.keys,
            registry=self.registry,
            logger=self.logger,
            redis=self._redis,
            hooks=self.hooks,
            scope=scope,
        )
        self.services = services
        removers = self._install_signals()
        consumer_task: asyncio.Task[None] | None = None
        detach = attach_client(self.registry, self._client)  # its task functions enqueue here
        try:
            await services.open()
            await services.start_web()
            await run_hooks(self._startup, self._client)
            self.consumer = Consumer(
                target=self.target,
                keys=self.keys,
                registry=self.registry,
                consumer_id=self.consumer_id,
                settings=self.settings,
                redis_client=services.redis,
                logger=self.logger,
                lease_ok=services.heartbeat.healthy,
                resets=lambda: services.heartbeat.resets,
                hooks=self.hooks,
                scope=serving,
            )
            await services.beat_once()
            services.start_loops(self._burst_loops(services))
            consumer_task = serving.start(self.consumer.run(), name="fencekit-consumer", awaited=True)
            self.logger.info(
                "server %s started: queues %s, concurrency %d, %s",
                self.consumer_id,
                ", ".join(self.registry.queues),
                self.concurrency,
                _describe(),
            )
            self.started.set()
            stop_wait = serving.start(self._stop.wait(), name="fencekit-stop-wait", awaited=True)
            await asyncio.wait({stop_wait, consumer_task}, return_when=asyncio.FIRST_COMPLETED)
            stop_wait.cancel()
            self.logger.info("server %s shutting down", self.consumer_id)
            await self._stop_consumer(consumer_task)
        finally:
            try:
                await serving.aclose()  # the consumer's task if it still runs (its scope too), the stop wait
            finally:
                try:
                    await run_hooks(self._shutdown, self._client)
                finally:
                    for remove in removers:
                        remove()
                    detach()
                    # its result waiter and batcher, before the connections they use are closed
                    await services.bounded("closing the server's client", self._client.close())
                    await services.close()
                    self.started.clear()
                    self.logger.info("server %s stopped", self.consumer_id)

    def _burst_loops(self, services: Services) -> list[Loop]:
        """The burst watch (``burst=True``), which calls :meth:`stop` once the queues are drained."""
        if not self.settings["burst"]:
            return []

        def timed_out(left: Observation) -> None:
            self._left = left
            self.stop()

        watch = BurstWatch(
            services.redis,
            self.keys,
            self.registry.queues,
            self.logger,
            on_drained=self.stop,
            on_timeout=timed_out,
            timeout=self.settings["burst_timeout"],
        )
        return [watch.loop()]

    async def _stop_consumer(self, consumer_task: asyncio.Task[None]) -> None:
        assert self.consumer is not None
        assert self.services is not None
        if not consumer_task.done():
            await self.consumer.stop(self.grace)
        try:
            await consumer_task
        except StoreError:
            return  # tasks stay in flight; peers' reapers return them
        forget = scripts.forget(
            consumers=self.keys.consumers, beats=self.keys.beats, consumer_id=self.consumer_id, ttl_ms=0
        )
        try:
            await self.services.scope.wait_for(
                arun(self.services.redis, forget), RETURN_WAIT, name="fencekit-deregister"
            )
        except asyncio.TimeoutError:
            self.logger.warning(
                "could not deregister %s: Redis did not answer within %gs", self.consumer_id, RETURN_WAIT
            )
        except StoreError as exc:
            self.logger.warning("could not deregister %s: %s", self.consumer_id, exc)

    def _install_signals(self) -> list[Callable[[], object]]:
        loop = asyncio.get_running_loop()
        removers: list[Callable[[], object]] = []
        for sig, handler in ((signal.SIGTERM, self.handle_term), (signal.SIGINT, self.handle_int)):
            try:
                loop.add_signal_handler(sig, handler)
            except (RuntimeError, ValueError, NotImplementedError):
                continue  # not the main thread: the host owns signals
            removers.append(functools.partial(loop.remove_signal_handler, sig))
        return removers

    # the Placement of the shared services ------------------------------------
    def beat_entries(self) -> Mapping[str, ConsumerRecord]:
        record = ConsumerRecord.new(self.consumer_id, self.registry.queues, self.concurrency, "server")
        return {self.consumer_id: record}

    def alive_consumers(self) -> Collection[str]:
        return (self.consumer_id,)

    def on_beat(self, when: float) -> None:
        return None

    def running(self) -> int:
        return self.consumer.running if self.consumer is not None else 0

    def on_reset(self, resets: int) -> None:
        return None  # the consumer reads services.heartbeat.resets

    def durations(self) -> DurationHistogram:
        return self.consumer.stats.durations if self.consumer is not None else DurationHistogram()

    def queue_durations(self) -> QueueDurations:
        return self.consumer.stats.by_queue if self.consumer is not None else QueueDurations()

    def children_view(self) -> tuple[ChildView, ...] | None:
        return None

    def desired_workers(self) -> int:
        return 1


def _describe() -> str:
    with contextlib.suppress(ImportError):
        from fencekit.compiled import describe

        return ", ".join(f"{k} {v}" for k, v in describe().items())
    return "codec unknown"
