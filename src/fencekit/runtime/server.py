"""``Server``: every component in one process and one event loop.

The consumer, heartbeat, reaper and scheduler run as tasks of one asyncio
loop (the pool places the same components in several processes instead).
``run()`` verifies Redis, runs the startup hooks, registers the consumer,
then works until SIGTERM/SIGINT (or :meth:`Server.stop`); on the way out it
stops claiming, lets running tasks finish within ``grace`` seconds, returns
the rest to their queues at once, deregisters, runs the shutdown hooks and
closes Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import signal
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace
from fencekit._redis.scripts import forget
from fencekit._redis.store import DEFAULT_URL, aclose_client, arun, async_client, parse_url, translated
from fencekit.errors import ConfigError, StoreError
from fencekit.queue import codec
from fencekit.queue.client import Client, QueueStats, default_logger
from fencekit.queue.consumer import Consumer
from fencekit.queue.heartbeat import HOSTNAME, Heartbeat, consumer_info
from fencekit.queue.reaper import Reaper
from fencekit.queue.scheduler import Scheduler
from fencekit.queue.settle import SettleSettings
from fencekit.queue.task import Task
from fencekit.queue.worker import WorkerRegistry

Hook = Callable[[], Awaitable[Any]]
H = TypeVar("H", bound=Hook)

DEFAULT_HEARTBEAT_TTL = 30.0
DEFAULT_GRACE = 5.0


def new_consumer_id(kind: str = "server") -> str:
    """A consumer id that is never reused: host, pid and a random incarnation."""
    return f"{HOSTNAME}:{os.getpid()}:{kind}:{uuid.uuid4().hex[:12]}"


def _check_number(name: str, value: object, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(f"{name} must be a number >= {minimum}, got {value!r}")
    return float(value)


class Server:
    """Runs workers against a Redis (see the module docstring)."""

    def __init__(
        self,
        redis_url: str = DEFAULT_URL,
        *,
        concurrency: int = 1,
        web_port: int | None = 3030,
        web_host: str = "127.0.0.1",
        admin_username: str | None = None,
        admin_password: str | None = None,
        heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL,
        grace: float = DEFAULT_GRACE,
        prefix: str = DEFAULT_PREFIX,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        link: str = "lean",
        settings: SettleSettings | None = None,
        durable_replicas: int = 0,
        durable_timeout: float = 1.0,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise ConfigError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if web_port is not None and (type(web_port) is not int or not 0 <= web_port < 65536):
            raise ConfigError(
                f"web_port must be an int from 0 to 65535 (or None for no web server), got {web_port!r}"
            )
        if link not in ("lean", "redis-py"):
            raise ConfigError(f"link must be 'lean' or 'redis-py', got {link!r}")
        self.target = parse_url(redis_url)
        self.concurrency = concurrency
        self.web_port = web_port
        self.web_host = web_host
        self.admin_username = admin_username
        self.admin_password = admin_password
        self.heartbeat_ttl = _check_number("heartbeat_ttl", heartbeat_ttl, 0.5)
        self.grace = _check_number("grace", grace, 0.0)
        self.keys = KeySpace(prefix)
        self.max_payload = max_payload
        self.link = link
        self.settings = settings or SettleSettings()
        self.registry = WorkerRegistry()
        self.logger = default_logger("fencekit.runtime.server")
        self.consumer_id = new_consumer_id()
        self.consumer: Consumer | None = None
        self.heartbeat: Heartbeat | None = None
        self.reaper: Reaper | None = None
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []
        self._stop = asyncio.Event()
        self._redis = async_client(self.target)
        self._client = Client(
            redis=self._redis,
            prefix=prefix,
            max_payload=max_payload,
            durable_replicas=durable_replicas,
            durable_timeout=durable_timeout,
        )
        self.durable = self._client.durable
        self.started = asyncio.Event()
        self.web: Any = None

    # configuration -----------------------------------------------------------
    def add_workers(self, *workers: object) -> None:
        """Register workers (classes or instances); bad settings raise :class:`ConfigError`."""
        self.registry.add(workers)

    def on_startup(self, hook: H) -> H:
        """Run ``hook`` after Redis is verified, before the consumer starts (decorator or call)."""
        self._startup.append(_check_hook(hook, "on_startup"))
        return hook

    def on_shutdown(self, hook: H) -> H:
        """Run ``hook`` after the consumer stops, before Redis is closed (decorator or call)."""
        self._shutdown.append(_check_hook(hook, "on_shutdown"))
        return hook

    # use -------------------------------------------------------------------
    async def enqueue(self, task: Task) -> str:
        """Enqueue on the server's own connection; returns the jid."""
        self._client.logger = self.logger
        return await self._client.enqueue(task)

    def queue(self, name: str) -> Any:
        """A :class:`~fencekit.queue.client.Queue` handle on the server's connection."""
        return self._client.queue(name)

    async def stats(self) -> QueueStats:
        return await self._client.stats()

    @property
    def web_port_enabled(self) -> bool:
        return self.web_port is not None

    def stop(self) -> None:
        """Ask :meth:`run` to shut down (what SIGTERM and SIGINT do)."""
        self._stop.set()

    async def run(self) -> None:
        """Serve until stopped (see the module docstring)."""
        if not len(self.registry):
            raise ConfigError("no workers registered: call server.add_workers(...) before run()")
        queues = self.registry.queues
        self._stop = asyncio.Event()
        removers = self._install_signals()
        loops: list[asyncio.Task[None]] = []
        consumer_task: asyncio.Task[None] | None = None
        try:
            with translated():
                await self._redis.ping()
            if self.web_port_enabled:
                from fencekit.web import web_for_server

                self.web = web_for_server(self)
                await self.web.start()
            for hook in self._startup:
                await hook()
            with translated():
                await self._redis.sadd(self.keys.queues, *queues)
            info = consumer_info(self.consumer_id, queues, self.concurrency, kind="server")
            self.heartbeat = Heartbeat(
                self._redis, self.keys, self.heartbeat_ttl, self.logger, lambda: {self.consumer_id: info}
            )
            await self.heartbeat.beat_once()
            self.consumer = Consumer(
                target=self.target,
                keys=self.keys,
                registry=self.registry,
                consumer_id=self.consumer_id,
                concurrency=self.concurrency,
                redis_client=self._redis,
                logger=self.logger,
                settings=self.settings,
                link_kind=self.link,
                lease_ok=self.heartbeat.healthy,
                durable=self.durable,
            )
            self.reaper = Reaper(
                self._redis,
                self.keys,
                self.registry,
                self.heartbeat_ttl,
                self.logger,
                self.settings,
                alive=lambda: (self.consumer_id,),
            )
            scheduler = Scheduler(self._redis, self.keys, queues, self.logger)
            loops = [
                asyncio.create_task(self.heartbeat.run(), name="fencekit-heartbeat"),
                asyncio.create_task(self.reaper.run(), name="fencekit-reaper"),
                asyncio.create_task(scheduler.run(), name="fencekit-scheduler"),
            ]
            consumer_task = asyncio.create_task(self.consumer.run(), name="fencekit-consumer")
            self.logger.info(
                "server %s started: queues %s, concurrency %d, %s",
                self.consumer_id,
                ", ".join(queues),
                self.concurrency,
                _describe(),
            )
            self.started.set()
            stop_wait = asyncio.create_task(self._stop.wait())
            await asyncio.wait({stop_wait, consumer_task}, return_when=asyncio.FIRST_COMPLETED)
            stop_wait.cancel()
            self.logger.info("server %s shutting down", self.consumer_id)
            await self._stop_consumer(consumer_task)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if consumer_task is not None and not consumer_task.done():
                consumer_task.cancel()
                await asyncio.gather(consumer_task, return_exceptions=True)
            try:
                for hook in self._shutdown:
                    await hook()
            finally:
                for remove in removers:
                    remove()
                if self.web is not None:
                    await self.web.stop()
                    self.web = None
                await aclose_client(self._redis)
                self.started.clear()
                self.logger.info("server %s stopped", self.consumer_id)

    async def _stop_consumer(self, consumer_task: asyncio.Task[None]) -> None:
        assert self.consumer is not None
        if not consumer_task.done():
            await self.consumer.stop(self.grace)
        try:
            await consumer_task
        except StoreError:
            return  # tasks stay in flight; peers' reapers return them
        try:
            await arun(
                self._redis,
                forget(
                    consumers=self.keys.consumers,
                    beats=self.keys.beats,
                    consumer_id=self.consumer_id,
                    ttl_ms=0,
                ),
            )
        except StoreError as exc:
            self.logger.warning("could not deregister %s: %s", self.consumer_id, exc)

    def _install_signals(self) -> list[Callable[[], object]]:
        loop = asyncio.get_running_loop()
        removers: list[Callable[[], object]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (RuntimeError, ValueError, NotImplementedError):
                continue  # not the main thread: the host owns signals
            removers.append(functools.partial(loop.remove_signal_handler, sig))
        return removers


def _check_hook(hook: object, what: str) -> Hook:
    if not callable(hook) or not inspect.iscoroutinefunction(hook):
        raise ConfigError(f"{what} takes an async function, got {hook!r}")
    return cast(Hook, hook)


def _describe() -> str:
    with contextlib.suppress(ImportError):
        from fencekit.compiled import describe

        return ", ".join(f"{k} {v}" for k, v in describe().items())
    return "codec unknown"
