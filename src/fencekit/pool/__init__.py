"""The multiprocess pool: ``python -m fencekit.pool APP`` and the embedding API.

Command line::

    python -m fencekit.pool APP [--procs N] [--concurrency C] [--redis-url URL]
        [--prefix P] [--heartbeat-ttl S] [--grace S] [--hang-timeout S]
        [--web-port P] [--web-host H] [--log-level L] [--data-dir D]

``APP`` is ``module:attribute`` naming a sequence of workers (classes or
instances), a callable returning one, or a :class:`fencekit.runtime.app.App`.
``--redis-url`` defaults to ``$FENCEKIT_REDIS_URL``, then
``redis://127.0.0.1:6379/0``; when nothing answers there and a server binary
is at hand (the ``embedded`` extra ships Valkey), the pool starts a private
Redis with its data in ``--data-dir`` and says so. Signals: SIGTERM/SIGINT
stop gracefully (a second one stops at once), SIGHUP restarts the children
one by one. Exit codes: 0 stopped, 2 bad usage or configuration, 3 a child
could not boot, 4 Redis unreachable.

Embedding: :class:`Pool` runs the supervisor inside an existing asyncio
service (``await pool.start()`` / ``await pool.stop()`` or ``async with``) or
a synchronous one (``start_sync()`` / ``stop_sync()``). Its children are
exec'd, not forked, since a host may have threads; it installs no signal
handler and never calls ``waitpid(-1)``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from fencekit._redis.store import DEFAULT_URL
from fencekit.errors import ConfigError, FenceKitError, StoreError
from fencekit.pool.supervisor import PoolSettings, Supervisor
from fencekit.queue.client import Client
from fencekit.queue.settle import SettleSettings
from fencekit.queue.worker import WorkerRegistry
from fencekit.runtime.app import App, import_path, load_app_full

EXIT_USAGE = 2
EXIT_BOOT = 3
EXIT_REDIS = 4


def _web_factory(supervisor: Supervisor) -> Any:
    """Build the supervisor's web server (probes, admin, metrics)."""
    from fencekit.web import web_for_supervisor

    return web_for_supervisor(supervisor)


class Pool:
    """A supervisor and its children inside a host process (see the module docstring)."""

    def __init__(
        self,
        workers: str | Sequence[object],
        *,
        procs: int | None = None,
        redis_url: str | None = None,
        concurrency: int = 1,
        prefix: str = "fencekit",
        heartbeat_ttl: float = 30.0,
        grace: float = 10.0,
        hang_timeout: float | None = None,
        web_port: int | None = None,
        web_host: str = "127.0.0.1",
        admin_username: str | None = None,
        admin_password: str | None = None,
        log_level: str = "INFO",
        link: str = "lean",
        settle: SettleSettings | None = None,
        durable_replicas: int = 0,
        durable_timeout: float = 1.0,
        logger: logging.Logger | None = None,
    ) -> None:
        app: str | None = None
        paths: tuple[str, ...] = ()
        if isinstance(workers, str):
            app = workers
            loaded = load_app_full(workers)
            self.hooks = tuple(loaded.on_startup)
            worker_list = list(loaded.workers)
        else:
            worker_list = list(workers)
            paths = tuple(import_path(w) for w in worker_list)
            self.hooks = ()
        registry = WorkerRegistry()
        registry.add(worker_list)
        self.settings = PoolSettings(
            redis_url=redis_url or os.environ.get("FENCEKIT_REDIS_URL") or DEFAULT_URL,
            procs=procs if procs is not None else (os.cpu_count() or 1),
            concurrency=concurrency,
            prefix=prefix,
            heartbeat_ttl=heartbeat_ttl,
            grace=grace,
            hang_timeout=hang_timeout,
            web_port=web_port,
            web_host=web_host,
            admin_username=admin_username,
            admin_password=admin_password,
            log_level=log_level,
            link=link,
            settle=settle or SettleSettings(),
            durable_replicas=durable_replicas,
            durable_timeout=durable_timeout,
        )
        self.settings.validate()
        self.registry = registry
        self._app = app
        self._paths = paths
        self.logger = logger or logging.getLogger("fencekit.pool")
        self.supervisor: Supervisor | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Start the children (exec'd) and the shared loops; return when all children serve."""
        if self.supervisor is not None and not self.supervisor.stopped.is_set():
            raise RuntimeError("pool already started")
        self.supervisor = Supervisor(
            self.settings,
            self.registry,
            spawn="exec",
            app=self._app,
            worker_paths=self._paths,
            logger=self.logger,
            web_factory=_web_factory,
        )
        await _run_hooks(self.hooks, self.settings)
        try:
            await self.supervisor.start()
        except BaseException:
            await self.supervisor.stop(fast=True)
            raise

    async def stop(self, *, fast: bool = False) -> None:
        """Stop gracefully (children finish within ``grace``), or at once with ``fast``."""
        if self.supervisor is not None:
            await self.supervisor.stop(fast=fast)

    async def __aenter__(self) -> Pool:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def children(self) -> list[dict[str, Any]]:
        """Pid, restarts, uptime and progress of each child."""
        return self.supervisor.children_info() if self.supervisor is not None else []

    # synchronous hosts ---------------------------------------------------------
    def start_sync(self, timeout: float = 60.0) -> None:
        """Run the pool on a private event loop thread; return when it serves."""
        started = threading.Event()
        failure: list[BaseException] = []

        def body() -> None:
            loop = asyncio.new_event_loop()
            self._thread_loop = loop
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            assert self.supervisor is not None
            loop.run_until_complete(self.supervisor.stopped.wait())
            loop.close()

        self._thread = threading.Thread(target=body, name="fencekit-pool", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise TimeoutError(f"pool did not start within {timeout}s")
        if failure:
            raise failure[0]

    def stop_sync(self, *, fast: bool = False, timeout: float | None = None) -> None:
        """Stop a pool started with :meth:`start_sync` and wait for it."""
        if self._thread is None or self._thread_loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self.stop(fast=fast), self._thread_loop)
        future.result(timeout)
        self._thread.join(timeout)
        self._thread = None


async def _run_hooks(hooks: Sequence[Any], settings: PoolSettings) -> None:
    if not hooks:
        return
    async with Client(settings.redis_url, prefix=settings.prefix) as client:
        for hook in hooks:
            await hook(client)


# command line ----------------------------------------------------------------


def build_parser(prog: str = "python -m fencekit.pool") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run fencekit workers in a supervised pool of processes.",
    )
    parser.add_argument("app", metavar="APP", help="module:attribute naming the workers")
    parser.add_argument(
        "--procs", type=int, default=os.cpu_count() or 1, help="children (default: CPU count)"
    )
    parser.add_argument("--concurrency", type=int, default=1, help="tasks at once per child (default 1)")
    parser.add_argument("--redis-url", default=None, help="default: $FENCEKIT_REDIS_URL, then " + DEFAULT_URL)
    parser.add_argument("--prefix", default="fencekit", help="key prefix (default fencekit)")
    parser.add_argument("--heartbeat-ttl", type=float, default=30.0, help="seconds (default 30)")
    parser.add_argument(
        "--grace", type=float, default=10.0, help="seconds running tasks get at stop (default 10)"
    )
    parser.add_argument("--hang-timeout", type=float, default=None, help="kill a silent child after S s")
    parser.add_argument("--web-port", type=int, default=3030, help="health/admin port, 0 = any, -1 = off")
    parser.add_argument("--web-host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--admin-username", default=os.environ.get("FENCEKIT_ADMIN_USERNAME"))
    parser.add_argument("--admin-password", default=os.environ.get("FENCEKIT_ADMIN_PASSWORD"))
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    )
    parser.add_argument("--link", default="lean", choices=["lean", "redis-py"], help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default=None, help="data directory of the embedded Redis")
    parser.add_argument(
        "--durable-replicas", type=int, default=0, help="acks wait for N replicas (WAIT); default 0 = off"
    )
    parser.add_argument(
        "--durable-timeout", type=float, default=1.0, help="seconds WAIT may take (default 1)"
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m fencekit.pool") -> int:
    """Run the pool from the command line; returns the exit code."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logger = logging.getLogger("fencekit.pool")
    embedded = None
    try:
        app = load_app_full(args.app)
        registry = WorkerRegistry()
        registry.add(app.workers)
        url = args.redis_url or os.environ.get("FENCEKIT_REDIS_URL")
        if url is None:
            from fencekit.pool.embedded import default_redis

            url, embedded = default_redis(Path(args.data_dir) if args.data_dir else None, logger)
        settings = PoolSettings(
            redis_url=url,
            procs=args.procs,
            concurrency=args.concurrency,
            prefix=args.prefix,
            heartbeat_ttl=args.heartbeat_ttl,
            grace=args.grace,
            hang_timeout=args.hang_timeout,
            web_port=None if args.web_port < 0 else args.web_port,
            web_host=args.web_host,
            admin_username=args.admin_username,
            admin_password=args.admin_password,
            log_level=args.log_level,
            link=args.link,
            durable_replicas=args.durable_replicas,
            durable_timeout=args.durable_timeout,
        )
        settings.validate()
    except FenceKitError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        if embedded is not None:
            embedded.stop()
        return EXIT_USAGE
    from fencekit.pool.child import new_loop

    loop = new_loop()
    try:
        return loop.run_until_complete(_serve(settings, registry, app, args.app, logger, prog))
    finally:
        loop.close()
        if embedded is not None:
            embedded.stop()
            logger.info("embedded Redis stopped (data kept in %s)", embedded.directory)


async def _serve(
    settings: PoolSettings, registry: WorkerRegistry, app: App, spec: str, logger: logging.Logger, prog: str
) -> int:
    supervisor = Supervisor(
        settings, registry, spawn="fork", app=spec, logger=logger, web_factory=_web_factory
    )
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()
    signals = {"stops": 0}

    def on_stop() -> None:
        signals["stops"] += 1
        task = loop.create_task(supervisor.stop(fast=signals["stops"] > 1))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def on_hup() -> None:
        task = loop.create_task(supervisor.rolling_restart())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    loop.add_signal_handler(signal.SIGTERM, on_stop)
    loop.add_signal_handler(signal.SIGINT, on_stop)
    loop.add_signal_handler(signal.SIGHUP, on_hup)
    try:
        await _run_hooks(app.on_startup, settings)
        await supervisor.start()
    except StoreError as exc:
        print(f"{prog}: error: cannot reach Redis at {supervisor.target.redacted()}: {exc}", file=sys.stderr)
        await supervisor.stop(fast=True)
        return EXIT_REDIS
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        await supervisor.stop(fast=True)
        return EXIT_USAGE
    await supervisor.stopped.wait()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return supervisor.exit_code
