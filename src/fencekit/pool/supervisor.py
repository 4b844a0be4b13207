"""The supervisor: starts, watches and restarts the pool's children.

It runs the components that are not the hot path -- heartbeats for itself
and its children, the reaper, the scheduler, the web server -- in its own
event loop, and one child per slot runs the consumer (:mod:`fencekit.pool.child`).
Same components as ``Server``, placed in two kinds of process.

Children are started by ``fork`` (the command line pool: signals blocked
around the fork, the child undoes what it inherited) or by exec of
``python -m fencekit.pool.exec_child`` (embedded in a host that may have threads). The
supervisor learns of a death at once through a pidfd registered with the
loop -- never ``waitpid(-1)``, which would steal a host's children -- returns
the dead child's in-flight tasks immediately (a crash is a failed attempt
under the retry policy) and restarts the slot, with a back-off that grows
while the slot keeps dying soon after starting. A child whose loop stops
ticking its liveness slot for ``hang_timeout`` is killed and handled as dead.

Stop: children get SIGTERM, stop claiming, finish within ``grace`` and return
the rest; a child still alive after that is killed and its tasks returned as
they were. :meth:`Supervisor.stop` with ``fast=True`` (a second signal) kills
at once and returns the tasks. :meth:`Supervisor.rolling_restart` (SIGHUP)
replaces the children one by one without losing a task.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fencekit._redis.keys import KeySpace
from fencekit._redis.store import aclose_client, async_client, parse_url, translated
from fencekit.errors import ConfigError, StoreError
from fencekit.pool import sdnotify
from fencekit.pool.board import READY, Board
from fencekit.pool.child import EXIT_BOOT_ERROR, ChildConfig, fork_hygiene
from fencekit.pool.child import run as run_child
from fencekit.queue.client import durability
from fencekit.queue.heartbeat import HOSTNAME, Heartbeat, consumer_info
from fencekit.queue.histogram import DurationHistogram
from fencekit.queue.reaper import Reaper
from fencekit.queue.scheduler import Scheduler
from fencekit.queue.settle import SettleSettings
from fencekit.queue.worker import WorkerRegistry

QUICK_DEATH = 5.0  # a child dying sooner than this after its start counts toward back-off
MAX_BACKOFF = 30.0
HANG_CHECK = 0.5
STOP_STEP = 5.0  # the most one step of returning tasks or shutting down may take


@dataclass(slots=True)
class PoolSettings:
    """The pool's knobs, shared by the command line and the embedding API."""

    redis_url: str
    procs: int
    concurrency: int = 1
    prefix: str = "fencekit"
    heartbeat_ttl: float = 30.0
    grace: float = 10.0
    hang_timeout: float | None = None  # default: the heartbeat TTL
    web_port: int | None = 3030
    web_host: str = "127.0.0.1"
    admin_username: str | None = None
    admin_password: str | None = None
    log_level: str = "INFO"
    link: str = "lean"
    settle: SettleSettings = field(default_factory=SettleSettings)
    durable_replicas: int = 0
    durable_timeout: float = 1.0

    def validate(self) -> None:
        for name, value, low in (("procs", self.procs, 1), ("concurrency", self.concurrency, 1)):
            if type(value) is not int or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        for name, number, minimum in (("heartbeat_ttl", self.heartbeat_ttl, 0.5), ("grace", self.grace, 0.0)):
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number < minimum:
                raise ConfigError(f"{name} must be a number >= {minimum}, got {number!r}")
        if self.web_port is not None and (type(self.web_port) is not int or not 0 <= self.web_port < 65536):
            raise ConfigError(f"web_port must be an int from 0 to 65535, got {self.web_port!r}")
        if self.link not in ("lean", "redis-py"):
            raise ConfigError(f"link must be 'lean' or 'redis-py', got {self.link!r}")
        parse_url(self.redis_url)
        durability(self.durable_replicas, self.durable_timeout)

    @property
    def effective_hang_timeout(self) -> float:
        return self.hang_timeout if self.hang_timeout is not None else self.heartbeat_ttl


@dataclass(slots=True)
class Child:
    """One slot's current process."""

    slot: int
    consumer_id: str
    pid: int = 0
    pidfd: int = -1
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0
    ready: bool = False
    alive: bool = False
    exited: asyncio.Future[int] | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Supervisor:
    """Forks (or execs) and watches the children; hosts the shared components."""

    def __init__(
        self,
        settings: PoolSettings,
        registry: WorkerRegistry,
        *,
        spawn: str = "fork",
        app: str | None = None,
        worker_paths: tuple[str, ...] = (),
        logger: logging.Logger | None = None,
        web_factory: Callable[[Supervisor], Any] | None = None,
    ) -> None:
        settings.validate()
        if spawn not in ("fork", "exec"):
            raise ConfigError(f"spawn must be 'fork' or 'exec', got {spawn!r}")
        if spawn == "exec" and not app and not worker_paths:
            raise ConfigError("exec'd children need the APP import path or the workers' import paths")
        if not len(registry):
            raise ConfigError("the pool has no workers")
        self.settings = settings
        self.registry = registry
        self.spawn = spawn
        self.app = app
        self.worker_paths = worker_paths
        self.logger = logger or logging.getLogger("fencekit.pool")
        self.keys = KeySpace(settings.prefix)
        self.target = parse_url(settings.redis_url)
        self.queues = registry.queues
        self.children = [Child(slot, "") for slot in range(settings.procs)]
        self.board: Board | None = None
        self.redis = async_client(self.target)
        self.heartbeat = Heartbeat(
            self.redis, self.keys, settings.heartbeat_ttl, self.logger, self._beat_entries, self._beat_ok
        )
        self.reaper = Reaper(
            self.redis,
            self.keys,
            registry,
            settings.heartbeat_ttl,
            self.logger,
            settings.settle,
            alive=self._alive_ids,
        )
        self.scheduler = Scheduler(self.redis, self.keys, self.queues, self.logger)
        self.web_factory = web_factory
        self.web: Any = None
        self.stopping = False
        self.exit_code = 0
        self.ready = asyncio.Event()
        self.stopped = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[Any]] = set()
        self._started_at = time.monotonic()
        self._retired = DurationHistogram()
        self._warned_threads = False  # durations of children that have exited

    # lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        """Verify Redis, start the children and the shared loops; return when all are ready."""
        with translated():
            await self.redis.ping()
            await self.redis.sadd(self.keys.queues, *self.queues)
        self.board = Board(self.settings.procs)
        self.board.set_beat_ok(time.monotonic())
        for child in self.children:
            self._new_incarnation(child)
        await self.heartbeat.beat_once()  # registered before they can claim: the reaper can see them
        for child in self.children:
            self._spawn(child)
        self._loops = [
            asyncio.create_task(self.heartbeat.run(), name="fencekit-heartbeat"),
            asyncio.create_task(self.reaper.run(), name="fencekit-reaper"),
            asyncio.create_task(self.scheduler.run(), name="fencekit-scheduler"),
            asyncio.create_task(self._watch_hangs(), name="fencekit-hangs"),
        ]
        interval = sdnotify.watchdog_interval()
        if interval:
            self._loops.append(asyncio.create_task(self._watchdog(interval), name="fencekit-watchdog"))
        if self.web_factory is not None and self.settings.web_port is not None:
            self.web = self.web_factory(self)
            await self.web.start()
        await self._wait_ready()

    async def _wait_ready(self) -> None:
        while not all(c.ready for c in self.children):
            if self.stopping:
                return
            self._read_board()
            await asyncio.sleep(0.02)
        self.ready.set()
        sdnotify.notify(
            "READY=1", f"STATUS=serving {', '.join(self.queues)} with {len(self.children)} children"
        )
        self.logger.info(
            "pool ready: %d children x concurrency %d on %s, queues %s%s",
            len(self.children),
            self.settings.concurrency,
            self.target.redacted(),
            ", ".join(self.queues),
            f"; admin page at {self.web.url}/admin" if self.web is not None else "",
        )

    async def stop(self, *, fast: bool = False) -> None:
        """Stop the children (gracefully unless ``fast``), then the shared loops."""
        if self.stopping and not fast:
            await self.stopped.wait()
            return
        first = not self.stopping
        self.stopping = True
        if first:
            sdnotify.notify("STOPPING=1")
            self.logger.info("pool stopping (%s)", "fast" if fast else f"grace {self.settings.grace}s")
        alive = [c for c in self.children if c.alive]
        for child in alive:
            self._signal(child, signal.SIGKILL if fast else signal.SIGTERM)
        waits = [c.exited for c in alive if c.exited is not None]
        if waits and not fast:
            await asyncio.wait(waits, timeout=self.settings.grace + 5.0)
            for child in self.children:
                if child.alive:
                    self.logger.error("child %d did not stop within the grace period: killing it", child.slot)
                    self._signal(child, signal.SIGKILL)
        if waits:
            await asyncio.wait(waits, timeout=10.0)
        if self._pending:
            await self._bounded(
                "returning the children's tasks", asyncio.gather(*self._pending, return_exceptions=True)
            )
        if not first:
            return
        for task in self._loops:
            task.cancel()
        await self._bounded("stopping the shared loops", asyncio.gather(*self._loops, return_exceptions=True))
        if self.web is not None:
            await self._bounded("stopping the web server", self.web.stop())
        await self._bounded("closing the Redis connections", aclose_client(self.redis))
        if self.board is not None:
            self.board.close()
            self.board = None
        self.stopped.set()
        self.logger.info("pool stopped")

    async def _bounded(self, what: str, awaitable: Any) -> None:
        """A step of the shutdown, given at most :data:`STOP_STEP` seconds: a stop must end."""
        try:
            await asyncio.wait_for(awaitable, STOP_STEP)
        except asyncio.TimeoutError:
            self.logger.error("pool stop: %s took longer than %.0fs; going on without it", what, STOP_STEP)

    async def rolling_restart(self) -> None:
        """Replace the children one by one (SIGHUP); each returns its tasks on the way out."""
        self.logger.info("rolling restart of %d children", len(self.children))
        for child in self.children:
            if self.stopping:
                return
            old_pid = child.pid
            if child.alive and child.exited is not None:
                exited = child.exited
                child.info["replacing"] = True
                self._signal(child, signal.SIGTERM)
                await exited
            while not (child.ready and child.pid != old_pid) and not self.stopping:
                self._read_board()
                await asyncio.sleep(0.02)
        self.logger.info("rolling restart done")

    # children -----------------------------------------------------------------
    def _new_incarnation(self, child: Child) -> None:
        """A fresh consumer id (never reused) for the next process of ``child``'s slot."""
        child.consumer_id = f"{HOSTNAME}:{os.getpid()}:child{child.slot}:{uuid.uuid4().hex[:12]}"
        child.ready = False
        child.info = {"registering": True}

    async def _respawn(self, child: Child) -> None:
        self._new_incarnation(child)
        try:
            await self.heartbeat.beat_once()
        except StoreError as exc:  # the child cannot claim without Redis either
            self.logger.warning("could not register child %d before starting it: %s", child.slot, exc)
        if not self.stopping:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        assert self.board is not None
        config = ChildConfig(
            slot=child.slot,
            consumer_id=child.consumer_id,
            redis_url=self.settings.redis_url,
            prefix=self.settings.prefix,
            concurrency=self.settings.concurrency,
            grace=self.settings.grace,
            heartbeat_ttl=self.settings.heartbeat_ttl,
            board_fd=self.board.fd,
            board_slots=self.settings.procs,
            log_level=self.settings.log_level,
            link=self.settings.link,
            fence_ttl_ms=self.settings.settle.fence_ttl_ms,
            keep_dead=self.settings.settle.keep_dead,
            app=self.app,
            worker_paths=self.worker_paths,
            durable_replicas=self.settings.durable_replicas,
            durable_timeout=self.settings.durable_timeout,
        )
        self.board.reset_slot(child.slot, time.monotonic())
        if self.spawn == "fork":
            child.pid = self._fork(config)
            child.popen = None
        else:
            child.popen = subprocess.Popen(
                [sys.executable, "-m", "fencekit.pool.exec_child"],
                stdin=subprocess.PIPE,
                pass_fds=(self.board.fd,),
                env={k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")},
            )
            assert child.popen.stdin is not None
            child.popen.stdin.write(config.to_json())
            child.popen.stdin.close()
            child.pid = child.popen.pid
        child.started = time.monotonic()
        child.alive = True
        child.info.pop("registering", None)
        loop = asyncio.get_running_loop()
        child.exited = loop.create_future()
        child.pidfd = os.pidfd_open(child.pid)
        loop.add_reader(child.pidfd, self._on_exit, child)
        self.logger.info("started child %d (pid %d)", child.slot, child.pid)

    def _fork(self, config: ChildConfig) -> int:
        assert self.board is not None
        if threading.active_count() > 1 and not self._warned_threads:
            self._warned_threads = True
            self.logger.warning(
                "forking with %d threads alive: a lock one of them holds stays locked in the child; "
                "embed the pool with fencekit.pool.Pool (exec'd children) in a threaded host",
                threading.active_count(),
            )
        blocked = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns
                fork_hygiene()
                run_child(config, self.registry, self.board, self.logger)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return pid

    def _signal(self, child: Child, sig: int) -> None:
        try:
            signal.pidfd_send_signal(child.pidfd, sig)
        except (ProcessLookupError, OSError):
            pass

    def _on_exit(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(child.pidfd)
        if self.board is not None:
            self._retired = self._retired + self.board.read_durations(child.slot)
        status = self._collect(child)
        os.close(child.pidfd)
        child.pidfd = -1
        child.alive = False
        child.ready = False
        lived = time.monotonic() - child.started
        if os.WIFSIGNALED(status):
            how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
            code = -os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
            how = f"exited with code {code}"
        clean = code == 0 and (self.stopping or child.info.get("replacing"))
        log = self.logger.info if clean else self.logger.error
        log("child %d (pid %d) %s after %.1fs", child.slot, child.pid, how, lived)
        task = loop.create_task(self._after_exit(child, code, lived, clean=bool(clean)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _collect(self, child: Child) -> int:
        if child.popen is not None:
            child.popen.wait()
            code = child.popen.returncode
            return (code << 8) if code >= 0 else -code
        _, status = os.waitpid(child.pid, 0)
        return status

    async def _after_exit(self, child: Child, code: int, lived: float, *, clean: bool) -> None:
        try:
            # A crash is a failed attempt; a supervisor-ordered stop returns tasks as they were.
            crashed = not (self.stopping or child.info.get("replacing"))
            await asyncio.wait_for(
                self.reaper.reap(
                    child.consumer_id, forget_if_silent=False, crashed=crashed, queues=self.queues
                ),
                STOP_STEP,
            )
        except (StoreError, asyncio.TimeoutError) as exc:
            self.logger.error(
                "could not return the tasks of child %d now (peers' reapers will): %s", child.slot, exc
            )
        finally:
            assert child.exited is not None
            if not child.exited.done():
                child.exited.set_result(code)
        if self.stopping:
            return
        if code == EXIT_BOOT_ERROR and not child.ready:
            self.logger.critical("child %d could not boot (see above): stopping the pool", child.slot)
            self.exit_code = EXIT_BOOT_ERROR
            self._spawn_task(self.stop())
            return
        delay = 0.0
        if child.info.get("replacing"):
            child.quick_deaths = 0
        elif lived < QUICK_DEATH:
            child.quick_deaths += 1
            delay = min(MAX_BACKOFF, 0.1 * 2 ** (child.quick_deaths - 1))
            if child.quick_deaths >= 3:
                self.logger.critical(
                    "child %d keeps dying at start (%d times in a row): next restart in %.1fs",
                    child.slot,
                    child.quick_deaths,
                    delay,
                )
        else:
            child.quick_deaths = 0
        child.restarts += 1
        if delay:
            await asyncio.sleep(delay)
        if not self.stopping:
            await self._respawn(child)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    # watching -----------------------------------------------------------------
    def _read_board(self) -> None:
        if self.board is None:
            return
        for child in self.children:
            if child.alive and not child.ready:
                _, state, pid, _ = self.board.read_slot(child.slot)
                child.ready = state == READY and pid == child.pid

    async def _watch_hangs(self) -> None:
        timeout = self.settings.effective_hang_timeout
        last = resumed = time.monotonic()
        while True:
            await asyncio.sleep(HANG_CHECK)
            if self.board is None:
                return
            now = time.monotonic()
            if now - last > 4 * HANG_CHECK:
                resumed = now  # the supervisor itself was stopped: so were its children, don't blame them
            last = now
            self._read_board()
            for child in self.children:
                if not child.alive or not child.ready:
                    continue
                tick, _, _, _ = self.board.read_slot(child.slot)
                silent = now - max(tick, resumed)
                if silent > timeout and not child.info.get("hung"):
                    child.info["hung"] = True
                    self.logger.error(
                        "child %d (pid %d) is hung: its event loop has not ticked for %.1fs; killing it",
                        child.slot,
                        child.pid,
                        silent,
                    )
                    self._signal(child, signal.SIGKILL)

    async def _watchdog(self, interval: float) -> None:
        while True:
            if self.heartbeat.healthy():
                sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    def _beat_entries(self) -> dict[str, dict[str, Any]]:
        return {
            c.consumer_id: consumer_info(
                c.consumer_id,
                self.queues,
                self.settings.concurrency,
                kind="pool-child",
                slot=c.slot,
                pid=c.pid if c.alive else None,
                supervisor=os.getpid(),
            )
            for c in self.children
            if (c.alive or c.info.get("registering")) and not c.info.get("hung")
        }

    def _alive_ids(self) -> set[str]:
        """Consumers this supervisor knows are alive: its reaper leaves them alone."""
        return {c.consumer_id for c in self.children if c.alive and not c.info.get("hung")}

    def _beat_ok(self, when: float) -> None:
        if self.board is not None:
            self.board.set_beat_ok(when)

    def durations(self) -> DurationHistogram:
        """Job durations of every child, past and present, summed bucket by bucket."""
        total = self._retired
        if self.board is not None:
            for child in self.children:
                if child.alive:
                    total = total + self.board.read_durations(child.slot)
        return total

    def children_info(self) -> list[dict[str, Any]]:
        """Pid, restarts and uptime of each child (for /admin and /metrics)."""
        now = time.monotonic()
        out = []
        for c in self.children:
            processed = self.board.read_slot(c.slot)[3] if self.board is not None else 0
            out.append(
                {
                    "slot": c.slot,
                    "pid": c.pid,
                    "consumer_id": c.consumer_id,
                    "alive": c.alive,
                    "ready": c.ready,
                    "restarts": c.restarts,
                    "uptime": round(now - c.started, 1) if c.alive else 0.0,
                    "processed": processed,
                }
            )
        return out
