"""The multiprocess pool: ``python -m fencekit.pool APP`` and :class:`Pool` to embed it.

The command line (:mod:`fencekit.pool.cli`)::

    python -m fencekit.pool APP [--procs N] [--concurrency C] [--redis-url URL] ...

``fencekit pool --help`` lists every setting with its default and its
``FENCEKIT_<NAME>`` environment variable (:mod:`fencekit.settings`).

Embedding: :class:`Pool` runs the supervisor inside an existing asyncio
service (``await pool.start()`` / ``await pool.stop()`` or ``async with``) or
a synchronous one (``start_sync()`` / ``stop_sync()``); ``Pool(..., burst=True)``
stops by itself once every queue is drained (``await pool.wait()``). Its children are
exec'd, not forked, since a host may have threads; it installs no signal
handler and never calls ``waitpid(-1)``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from typing_extensions import Unpack

from fencekit.errors import ConfigError, FenceKitError
from fencekit.jobs.worker import WorkerRegistry
from fencekit.pool._supervisor import Supervisor
from fencekit.pool.cli import main
from fencekit.runtime.app import App, import_path, load_app, pool_url
from fencekit.settings import PoolOptions, PoolSettings, given, resolve, with_url

__all__ = ["Pool", "main"]


class Pool:
    """A supervisor and its children inside a host process (see the module docstring).

    ``workers`` is an APP spec (``"module:attribute"``, whose hooks run as in
    the command-line pool) or a sequence of importable worker classes or
    module-level instances. Settings are those of
    :class:`fencekit.settings.PoolOptions`; ``web_port=None`` when the host
    serves its own pages (it can mount :func:`fencekit.web.create_app`).
    """

    def __init__(
        self,
        workers: str | Sequence[object],
        *,
        redis_url: str | None = None,
        logger: logging.Logger | None = None,
        **options: Unpack[PoolOptions],
    ) -> None:
        self.settings: PoolSettings = resolve(PoolSettings, with_url(redis_url, options), owner="Pool")
        self._app_spec: str | None = None
        self._paths: tuple[str, ...] = ()
        if isinstance(workers, str):
            self._app_spec = workers
            self.app = load_app(workers)
        else:
            self.app = App(list(workers))
            self._paths = tuple(import_path(w) for w in self.app.workers)
        self.logger = logger or logging.getLogger("fencekit.pool")
        explicit = {"redis_url": redis_url} if redis_url is not None else {}
        by = "Pool(redis_url=...)" if redis_url is not None else "FENCEKIT_REDIS_URL"
        own = self.settings["redis_url"] if given(PoolSettings, "redis_url", explicit) else None
        url, _, warning = pool_url(self.app, own, by)
        if warning is not None:
            self.logger.warning("%s", warning)
        if url is not None:
            self.settings["redis_url"] = url
        self.supervisor: Supervisor | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        WorkerRegistry().add(self.app.workers)  # bad workers fail here, not at start()

    async def start(self) -> None:
        """Start the children (exec'd) and the shared loops; return when all children serve."""
        if self.supervisor is not None and not self.supervisor.stopped.is_set():
            raise ConfigError("this pool is already running: stop() it before starting it again")
        self.supervisor = Supervisor(
            self.settings,
            self.app,
            spawn="exec",
            app_spec=self._app_spec,
            worker_paths=self._paths,
            logger=self.logger,
        )
        try:
            await self.supervisor.start()
        except BaseException:
            await self.supervisor.stop(fast=True)
            raise
        if self.supervisor.stopping:  # a child could not boot: the supervisor stopped the pool
            await self.supervisor.stopped.wait()
            raise ConfigError(
                f"the pool stopped while starting (exit code {int(self.supervisor.exit_code)}: "
                "a child could not boot, see its log line)"
            )

    async def wait(self) -> int:
        """Wait until the pool has stopped (a burst run: once drained); return its exit code.

        0 when stopped or drained, :attr:`~fencekit.runtime.exits.ExitCode.LEFT` (5)
        when ``burst_timeout`` passed with tasks left.
        """
        if self.supervisor is None:
            raise ConfigError("this pool was never started: start() it first")
        await self.supervisor.stopped.wait()
        await self.supervisor.wait_control()
        return int(self.supervisor.exit_code)

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
        """Slot, pid, consumer id, state, restarts, uptime and tasks processed of each child (JSON-ready).

        ``state`` is ``"stalled"`` (with ``stalled_for`` seconds) while a serving
        child's event loop has stopped ticking, before the hang watch kills it.
        """
        if self.supervisor is None:
            return []
        return [dataclasses.asdict(view) for view in self.supervisor.children_view()]

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
            raise FenceKitError(f"pool did not start within {timeout}s")
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
