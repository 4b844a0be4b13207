"""The supervisor: starts, watches and restarts the pool's children.

It hosts the components that are not the hot path -- heartbeats for its
children, the reaper, the scheduler, the web server (:mod:`fencekit.runtime.services`,
the same assembly a ``Server`` uses) -- in its own event loop, and one child
per slot runs the consumer (:mod:`fencekit.pool._child`).

Children are started by ``fork`` (the command-line pool) or by exec (a pool
embedded in a host that may have threads; :mod:`fencekit.pool._children`).
The supervisor learns of a death at once through a pidfd registered with the
loop -- never ``waitpid(-1)``, which would steal a host's children -- returns
the dead child's in-flight tasks immediately (a crash is a failed attempt
under the retry policy) and restarts the slot, with a back-off that grows
while the slot keeps dying soon after starting. A child whose loop stops
ticking its liveness slot for ``hang_timeout`` is killed and handled as dead,
after one log record that names the tasks it ran and its stack
(:mod:`fencekit.pool._stall`, bounded to about half a second).
A child that fails while booting stops the whole pool with
:attr:`~fencekit.runtime.exits.ExitCode.BOOT`.

Signals are methods (gunicorn's arbiter): :meth:`Supervisor.handle_term` and
:meth:`~Supervisor.handle_int` stop gracefully, a second one at once;
:meth:`~Supervisor.handle_quit` stops at once; :meth:`~Supervisor.handle_hup`
replaces the children one by one without losing a task. The command line
installs them; an embedded pool installs none.

In burst mode (``burst``) the supervisor decides when the queues are
drained (:class:`fencekit.services.drain.BurstWatch`, the ``Server``'s rule) and
then stops the pool as on SIGTERM; past ``burst_timeout`` with tasks left it
stops the same way with :attr:`~fencekit.runtime.exits.ExitCode.LEFT`.

Its tasks have owners (:class:`~fencekit._aio.scope.TaskScope`): the services'
loops, the returns of dead children's tasks and restarts (awaited by a stop for
:data:`~fencekit.runtime.services.STOP_STEP`, then cancelled), the stops signals
ask for (:meth:`Supervisor.wait_control`) and the stall reports' reads.

This module is the children's lifecycle and the signals; three parts live
beside it as base classes of :class:`Supervisor`: the children's liveness
(:mod:`fencekit.pool._liveness`), what it tells the shared services
(:mod:`fencekit.pool._placement`) and autoscaling (:mod:`fencekit.pool._autoscale`).
Recycling is :mod:`fencekit.pool._recycle`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fencekit._aio.loops import Backoff, Loop
from fencekit._aio.scope import TaskScope
from fencekit._redis.keys import KeySpace
from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError, StoreError
from fencekit.jobs._registry import consumer_id
from fencekit.jobs.functions import attach_client
from fencekit.jobs.histogram import QueueDurations
from fencekit.jobs.worker import WorkerRegistry
from fencekit.pool import _sdnotify as sdnotify
from fencekit.pool._autoscale import CHECK, Scaling, slots
from fencekit.pool._board import Board
from fencekit.pool._child import ChildConfig
from fencekit.pool._children import Child, ChildState, restart_delay
from fencekit.pool._liveness import Liveness
from fencekit.pool._placement import PoolPlacement
from fencekit.pool._recycle import MEMORY_CHECK, MemoryWatch, job_budget
from fencekit.pool._stall import StackFile
from fencekit.pool._watch import HANG_CHECK, HangWatch
from fencekit.produce.client import Client
from fencekit.runtime.app import App
from fencekit.runtime.exits import ExitCode
from fencekit.runtime.hooks import run_hooks
from fencekit.runtime.services import GRACE_MARGIN, STOP_STEP, Services
from fencekit.services.drain import BurstWatch, Observation
from fencekit.settings import PoolSettings

if TYPE_CHECKING:
    from fencekit.web._serve import WebServer

__all__ = ["Supervisor"]


class Supervisor(Liveness, PoolPlacement, Scaling):
    """Forks (or execs) and watches the children; hosts the shared services."""

    def __init__(
        self,
        settings: PoolSettings,
        app: App,
        *,
        spawn: str = "fork",
        app_spec: str | None = None,
        worker_paths: tuple[str, ...] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        """``app_spec`` or ``worker_paths`` tell exec'd children what to import."""
        if spawn not in ("fork", "exec"):
            raise ConfigError(f"spawn must be 'fork' or 'exec', got {spawn!r}")
        self.settings = settings
        self.app = app
        self.registry = WorkerRegistry()
        self.registry.add(app.workers)
        self._detach_client: Callable[[], None] | None = None
        self._client: Client | None = None  # the app's task functions' and hooks' client
        self.spawn, self.app_spec, self.worker_paths = spawn, app_spec, worker_paths
        self.logger = logger or logging.getLogger("fencekit.pool")
        self.target = parse_url(settings["redis_url"])
        self.queues = self.registry.queues
        self.children = slots(settings)
        self.board: Board | None = None
        self.hangs: HangWatch | None = None
        self.stacks: dict[int, StackFile] = {}  # slot -> the file its children dump their stack into
        self.scope = TaskScope("pool supervisor", logger=self.logger)
        self._returning = self.scope.child("returning dead children's tasks")
        self._control = self.scope.child("stops and restarts asked for by signals")
        self.diagnosing = self.scope.child("stall reports")
        self.services = Services(
            self,
            settings=settings,
            target=self.target,
            keys=KeySpace(settings["prefix"]),
            registry=self.registry,
            logger=self.logger,
            hooks=app.hooks,
            scope=self.scope,
        )
        self.keys = self.services.keys
        self.stopping = False
        self.exit_code = ExitCode.OK
        self.ready = asyncio.Event()
        self.stopped = asyncio.Event()
        self._signals = 0
        self._hooks_ran = False
        self._retired = QueueDurations()  # durations of children that have exited

    @property
    def web(self) -> WebServer | None:
        """The running web server (None before start, after stop, or with ``web_port`` off)."""
        return self.services.web

    # signals ------------------------------------------------------------------
    def handle_term(self) -> None:
        """SIGTERM: stop gracefully; a second stop signal stops at once."""
        self._signals += 1
        if self._signals == 2 and self.stopping:
            self.logger.warning(
                "a second stop signal: stopping now, without the rest of the grace "
                "(children killed; their tasks go back to their queues)"
            )
        self._control_task(self.stop(fast=self._signals > 1))

    handle_int = handle_term

    def handle_quit(self) -> None:
        """SIGQUIT: stop at once (children killed, their tasks returned)."""
        self._control_task(self.stop(fast=True))

    def handle_hup(self) -> None:
        """SIGHUP: replace the children one by one (``systemctl reload``)."""
        self._control_task(self.rolling_restart())

    # lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        """Verify Redis, bind the web port, start the children and the loops; return when all serve."""
        await self.services.open()
        await self.services.start_web()
        self._hooks_ran = True  # from here on, the shutdown hooks run at stop
        client = self._client = Client.sharing(self.settings, self.services.redis, self.app.hooks)
        # the app's task functions enqueue here in the supervisor (its hooks): the pool's Redis
        self._detach_client = attach_client(self.registry, client)
        await run_hooks(self.app.on_pool_startup, client)
        self.board = Board(len(self.children), self.registry.queues)
        self.board.set_beat_ok(time.monotonic())
        self.stacks = {child.slot: StackFile(child.slot) for child in self.children}
        for child in self.wanted():
            self._new_incarnation(child)
        await self.services.beat_once()  # registered before they can claim: the reaper can see them
        for child in self.wanted():
            self._spawn(child)
        self.hangs = hangs = HangWatch(
            self.children, self.board, self._hang_timeout(), self._read_board, self._kill_hung
        )
        extra = [Loop("hang watch", hangs.check, lambda: HANG_CHECK, Backoff(self.logger, "hang watch"))]
        interval = sdnotify.watchdog_interval()
        if interval:
            extra.append(Loop("watchdog", self._watchdog, lambda: interval, Backoff(self.logger, "watchdog")))
        if self.settings["burst"]:
            extra.append(self._burst_watch().loop())
        if self.settings["max_memory"] is not None:
            memory = MemoryWatch(self.children, self.settings["max_memory"], self.logger)
            extra.append(Loop("memory", memory.check, lambda: MEMORY_CHECK, Backoff(self.logger, "memory")))
        if self.settings["max_procs"] is not None:
            extra.append(Loop("autoscaling", self.scale, lambda: CHECK, Backoff(self.logger, "autoscaling")))
        self.services.start_loops(extra)
        await self._wait_ready()

    def _burst_watch(self) -> BurstWatch:
        """Burst mode: stop the pool once every queue is drained (first observation once all serve)."""

        def timed_out(left: Observation) -> None:
            self.exit_code = ExitCode.LEFT
            self._control_task(self.stop())

        return BurstWatch(
            self.services.redis,
            self.keys,
            self.queues,
            self.logger,
            on_drained=lambda: self._control_task(self.stop()),
            on_timeout=timed_out,
            timeout=self.settings["burst_timeout"],
            ready=self.ready.is_set,
        )

    async def _wait_ready(self) -> None:
        while not all(c.ready for c in self.wanted()):
            if self.stopping:
                return
            self._read_board()
            await asyncio.sleep(0.02)
        self.ready.set()
        sdnotify.notify(
            "READY=1", f"STATUS=serving {', '.join(self.queues)} with {len(self.wanted())} children"
        )
        web = self.services.web
        self.logger.info(
            "pool ready: %d children x concurrency %d on %s, queues %s%s",
            len(self.wanted()),
            self.settings["concurrency"],
            self.target.redacted(),
            ", ".join(self.queues),
            f"; admin page at {web.url}/admin" if web is not None else "",
        )

    async def stop(self, *, fast: bool = False) -> None:
        """Stop the children (gracefully unless ``fast``), then the shared services."""
        if self.stopping and not fast:
            await self.stopped.wait()
            return
        first = not self.stopping
        self.stopping = True
        if first:
            sdnotify.notify("STOPPING=1")
            self.logger.info("pool stopping (%s)", "fast" if fast else f"grace {self.settings['grace']}s")
        alive = [c for c in self.children if c.alive]
        for child in alive:
            child.signal(signal.SIGKILL if fast else signal.SIGTERM)
        waits = [c.exited for c in alive if c.exited is not None]
        if waits and not fast:
            await asyncio.wait(waits, timeout=self.settings["grace"] + GRACE_MARGIN)
            for child in self.children:
                if child.alive:
                    self.logger.error("child %d did not stop within the grace period: killing it", child.slot)
                    child.signal(signal.SIGKILL)
        if waits:
            await asyncio.wait(waits, timeout=10.0)
        if self._returning.running:
            await self.services.bounded("returning the children's tasks", self._returning.wait())
            await self._returning.aclose()  # those still running after STOP_STEP
        if not first:
            return
        try:
            if self._hooks_ran:
                client = self._client or Client.sharing(self.settings, self.services.redis, self.app.hooks)
                hooks = run_hooks(self.app.on_pool_shutdown, client)
                await self.services.bounded("the on_pool_shutdown hooks", hooks)
        finally:
            if self._detach_client is not None:
                self._detach_client()
                self._detach_client = None
            if self._client is not None:  # its result waiter and batcher, before their connections
                await self.services.bounded("closing the pool's client", self._client.close())
                self._client = None
            await self.services.close()
            await self.diagnosing.aclose()
            if self.board is not None:
                self.board.close()
                self.board = None
            for stack in self.stacks.values():
                stack.close()
            self.stacks = {}
            self.stopped.set()
            self.logger.info("pool stopped")

    async def rolling_restart(self) -> None:
        """Replace the children one by one (SIGHUP); each returns its tasks on the way out."""
        self.logger.info("rolling restart of %d children", len(self.wanted()))
        for child in self.wanted():
            if self.stopping:
                return
            old_pid = child.pid
            if child.alive and child.exited is not None:
                exited = child.exited
                child.state = ChildState.REPLACING
                child.signal(signal.SIGTERM)
                await exited
            while not (child.ready and child.pid != old_pid) and not self.stopping:
                self._read_board()
                await asyncio.sleep(0.02)
        self.logger.info("rolling restart done")

    # children -----------------------------------------------------------------
    def _new_incarnation(self, child: Child) -> None:
        """A fresh consumer id (never reused) for the next process of ``child``'s slot."""
        child.consumer_id = consumer_id(f"child{child.slot}")
        child.state = ChildState.REGISTERING

    async def _respawn(self, child: Child) -> None:
        self._new_incarnation(child)
        try:
            await self.services.beat_once()
        except StoreError as exc:  # the child cannot claim without Redis either
            self.logger.warning("could not register child %d before starting it: %s", child.slot, exc)
        if not self.stopping and child.wanted:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        assert self.board is not None
        config = ChildConfig(
            slot=child.slot,
            consumer_id=child.consumer_id,
            board_fd=self.board.fd,
            board_slots=len(self.children),
            board_queues=self.board.queues,
            settings=dict(self.settings),
            parent=os.getpid(),
            app=self.app_spec,
            worker_paths=self.worker_paths,
            stack_fd=self.stacks[child.slot].fd if child.slot in self.stacks else -1,
            max_jobs=job_budget(self.settings["max_jobs"], self.settings["max_jobs_jitter"]),
        )
        child.start(config, self.spawn, self.app, self.board, self.logger)
        loop = asyncio.get_running_loop()
        child.exited = loop.create_future()
        loop.add_reader(child.pidfd, self._on_exit, child)
        self.logger.info("started child %d (pid %d)", child.slot, child.pid)

    def _on_exit(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(child.pidfd)
        if self.board is not None:
            self._retired = self._retired + self.board.read_durations(child.slot)
        code, how = child.reap()
        recycled = "max_jobs" if code == ExitCode.RECYCLED else child.recycling
        if recycled:
            child.recycles[recycled] = child.recycles.get(recycled, 0) + 1
            child.recycling = ""
            how += f", recycled ({recycled})"
        if code == ExitCode.RECYCLED:
            code = ExitCode.OK
        expected = self.stopping or child.state is ChildState.REPLACING or bool(recycled)
        child.state = ChildState.EXITED
        lived = time.monotonic() - child.started
        log = self.logger.info if code == 0 and expected else self.logger.error
        log("child %d (pid %d) %s after %.1fs", child.slot, child.pid, how, lived)
        self._spawn_task(self._after_exit(child, code, lived, expected=expected))

    async def _after_exit(self, child: Child, code: int, lived: float, *, expected: bool) -> None:
        try:
            # A crash is a failed attempt; a supervisor-ordered stop returns tasks as they were.
            await asyncio.wait_for(
                self.services.reaper.reap(
                    child.consumer_id, forget_if_silent=False, crashed=not expected, queues=self.queues
                ),
                STOP_STEP,
            )
        except (StoreError, asyncio.TimeoutError) as exc:
            self.logger.error(
                "could not return the tasks of child %d now (peers' reapers will): %s", child.slot, exc
            )
        except Exception:
            self.logger.exception("returning the tasks of child %d failed (peers' reapers will)", child.slot)
        finally:
            assert child.exited is not None
            if not child.exited.done():
                child.exited.set_result(code)
        if self.stopping:
            return
        if code == ExitCode.BOOT:
            self.logger.critical("child %d could not boot (see above): stopping the pool", child.slot)
            self.exit_code = ExitCode.BOOT
            self._control_task(self.stop())
            return
        if child.wanted:  # else autoscaling took the slot out of service
            await self._restart_later(child, lived, expected)

    async def _restart_later(self, child: Child, lived: float, expected: bool) -> None:
        """Restart the slot, after a back-off while it keeps dying soon after starting."""
        delay = restart_delay(child, lived, expected)
        if child.quick_deaths >= 3:
            self.logger.critical(
                "child %d keeps dying at start (%d times in a row): next restart in %.1fs",
                child.slot,
                child.quick_deaths,
                delay,
            )
        child.restarts += 1
        if delay:
            await asyncio.sleep(delay)
        if not self.stopping:
            await self._respawn(child)

    def _start_slot(self, child: Child) -> None:
        """Autoscaling wants ``child``'s slot served again: a new incarnation, registered, started."""
        self._spawn_task(self._respawn(child))

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        self._returning.start(coro, name="fencekit-child-exit")

    def _control_task(self, coro: Coroutine[Any, Any, None]) -> None:
        self._control.start(coro, name="fencekit-control")

    async def wait_control(self) -> None:
        """Wait for the stops and restarts that signals started (the command line's last step)."""
        await self._control.wait()
