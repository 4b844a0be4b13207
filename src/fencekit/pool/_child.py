"""One pool child: a uvloop event loop running the consumer, nothing else.

A child is started by the supervisor either by ``fork`` (the CLI pool) or by
exec of ``python -m fencekit.pool._exec_child`` (a pool embedded in a host that may have
threads), with a :class:`ChildConfig`. Its heartbeat, reaping and scheduling
are the supervisor's; it only claims, performs and settles, and its event
loop ticks its slot of the shared :class:`~fencekit.pool._board.Board` so the
supervisor can tell a hung child from a busy one.

Fork hygiene (``docs/design/measurements.md``): a forked child first drops
the signal wakeup fd and handlers it inherited, forgets the parent's running
loop and policy, drops ``NOTIFY_SOCKET``, reseeds ``random`` and the id
sequence, builds its own connections, and always leaves with ``os._exit`` so
no finalizer of an inherited object runs.

After connecting it runs the APP's ``on_startup`` hooks (each child has its
own resources, as a ``Server`` has), serves, and runs ``on_shutdown`` after
its consumer stopped. SIGTERM stops claiming and lets running tasks finish
within ``grace``; the rest go back to their queues. SIGINT and SIGHUP are ignored: a terminal's
Ctrl-C reaches the whole process group, and the supervisor decides. Its tasks (the ticker,
the consumer's and the stop wait; the consumer's own nested) belong to the child's
:class:`~fencekit._aio.scope.TaskScope`, closed before it closes Redis.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import random
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NoReturn

import orjson

from fencekit import _coverage
from fencekit._aio.loops import Backoff
from fencekit._aio.scope import TaskScope
from fencekit._log import JsonFormatter, LineHandler, flush_all
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit._redis.url import parse_url
from fencekit.consume._consumer import Consumer
from fencekit.consume._returns import RETURN_WAIT
from fencekit.errors import ConfigError, FenceKitError, StoreError
from fencekit.jobs import _ids as ids
from fencekit.jobs._registry import lease_ok
from fencekit.jobs.functions import attach_client
from fencekit.jobs.worker import WorkerRegistry
from fencekit.pool._board import LAG_WINDOW, READY, STARTING, STOPPING, TICK, Board
from fencekit.pool._stall import register_stack_dump
from fencekit.produce.client import Client
from fencekit.runtime.app import App, load_app, load_worker_paths
from fencekit.runtime.exits import ExitCode
from fencekit.runtime.hooks import run_hooks
from fencekit.settings import PoolSettings, resolve

__all__ = ["ChildConfig", "fork_hygiene", "main", "new_loop", "run_and_exit"]

_PR_SET_PDEATHSIG = 1

_INHERITED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGCHLD,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


@dataclass(frozen=True, slots=True)
class ChildConfig:
    """Everything a child needs besides its workers; JSON for exec'd children.

    ``settings`` are the pool's resolved settings (:class:`fencekit.settings.PoolSettings`);
    an exec'd child checks them again, and imports its workers from ``app``
    (the APP spec) or ``worker_paths``.
    """

    slot: int
    consumer_id: str
    board_fd: int
    board_slots: int
    settings: dict[str, Any]
    parent: int  # the supervisor's pid: a child outlives it by a second at most
    app: str | None = None
    worker_paths: tuple[str, ...] = field(default_factory=tuple)
    board_queues: tuple[str, ...] = field(default_factory=tuple)
    """The queues whose job durations the board's slots hold, in order."""
    stack_fd: int = -1
    """The slot's stack file: faulthandler dumps every thread there on
    :data:`~fencekit.pool._stall.STACK_SIGNAL` (:mod:`fencekit.pool._stall`); -1 for none."""
    max_jobs: int | None = None
    """Tasks this process claims before it finishes them and exits :attr:`ExitCode.RECYCLED`
    (``max_jobs`` plus this incarnation's jitter); None: no limit."""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "slot": self.slot,
                "consumer_id": self.consumer_id,
                "board_fd": self.board_fd,
                "board_slots": self.board_slots,
                "settings": self.settings,
                "parent": self.parent,
                "app": self.app,
                "worker_paths": list(self.worker_paths),
                "board_queues": list(self.board_queues),
                "stack_fd": self.stack_fd,
                "max_jobs": self.max_jobs,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> ChildConfig:
        data = orjson.loads(raw)
        return cls(
            slot=int(data["slot"]),
            consumer_id=str(data["consumer_id"]),
            board_fd=int(data["board_fd"]),
            board_slots=int(data["board_slots"]),
            settings=resolve(PoolSettings, data["settings"], environ={}, owner="pool child"),
            parent=int(data["parent"]),
            app=data.get("app"),
            worker_paths=tuple(data.get("worker_paths", ())),
            board_queues=tuple(data.get("board_queues", ())),
            stack_fd=int(data.get("stack_fd", -1)),
            max_jobs=None if data.get("max_jobs") is None else int(data["max_jobs"]),
        )


def fork_hygiene() -> None:
    """Undo what a fork carries over from a supervisor with a running loop."""
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread: nothing was set
        pass
    for sig in _INHERITED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    asyncio.events._set_running_loop(None)
    asyncio.set_event_loop_policy(None)
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"):
        os.environ.pop(name, None)
    random.seed()
    ids.reset()
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (``PR_SET_PDEATHSIG``).

    A child whose supervisor was killed would otherwise keep consuming with
    nobody watching it. The ticker also checks the parent (a parent that died
    before this call, or a kernel without prctl), so this is the fast path.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def new_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_and_exit(config: ChildConfig, app: App, board: Board, logger: logging.Logger) -> NoReturn:
    """Run the child to its end and leave the process with ``os._exit``."""
    code = ExitCode.ERROR
    try:
        die_with_parent()
        register_stack_dump(config.stack_fd)  # so a stalled loop can still tell where it is
        registry = WorkerRegistry()
        registry.add(app.workers)
        loop = new_loop()
        asyncio.set_event_loop(loop)
        code = loop.run_until_complete(_serve(config, app, registry, board, logger))
    except ConfigError as exc:
        logger.error("child %d: %s", config.slot, exc)
        code = ExitCode.BOOT
    except BaseException:
        logger.error("child %d crashed:\n%s", config.slot, traceback.format_exc())
        code = ExitCode.ERROR
    finally:
        flush_all()  # lines still batched for the next loop iteration
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        _coverage.save()  # os._exit skips coverage.py's atexit: the suite measures children too
        os._exit(code)


async def _serve(
    config: ChildConfig, app: App, registry: WorkerRegistry, board: Board, logger: logging.Logger
) -> ExitCode:
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    settings = config.settings
    target = parse_url(settings["redis_url"])
    redis = async_client(target)
    ttl = settings["heartbeat_ttl"]
    scope = TaskScope(f"child {config.slot}", logger=logger)
    consumer = Consumer(
        target=target,
        keys=KeySpace(settings["prefix"]),
        registry=registry,
        consumer_id=config.consumer_id,
        settings=settings,
        redis_client=redis,
        logger=logger,
        lease_ok=lambda: lease_ok(board.beat_ok(), ttl),
        resets=board.resets,
        hooks=app.hooks,
        scope=scope,
    )
    consumer.claim_budget = config.max_jobs
    client = Client.sharing(settings, redis, app.hooks)
    detach = attach_client(registry, client)  # the app's task functions enqueue on this connection
    state = STARTING

    async def ticker() -> None:
        late: deque[float] = deque(maxlen=LAG_WINDOW)
        due: float | None = None
        while True:
            now = time.monotonic()
            if due is not None:
                late.append(max(0.0, now - due))
            board.tick(
                config.slot,
                now,
                state,
                pid,
                consumer.stats.processed,
                consumer.stats.by_queue,
                consumer.running,
                max(late, default=0.0),
            )
            if os.getppid() != config.parent and not stop.is_set():
                logger.warning(
                    "child %d: its supervisor (pid %d) is gone: stopping, its tasks go back to their queues",
                    config.slot,
                    config.parent,
                )
                stop.set()
            due = time.monotonic() + TICK
            await asyncio.sleep(TICK)

    scope.start(ticker(), name="fencekit-ticker")
    try:
        if not await _connect(consumer, stop, logger, config.slot):
            return ExitCode.OK
        await run_hooks(app.on_startup, client)
        state = READY
        board.tick(config.slot, time.monotonic(), state, pid, 0, consumer.stats.by_queue)
        _log_serving(logger, config, consumer, loop)
        consuming = scope.start(consumer.run(), name="fencekit-consumer", awaited=True)
        stopping = scope.start(stop.wait(), name="fencekit-stop-wait", awaited=True)
        spent = scope.start(consumer.budget_spent.wait(), name="fencekit-max-jobs", awaited=True)
        await asyncio.wait({consuming, stopping, spent}, return_when=asyncio.FIRST_COMPLETED)
        recycled = spent.done() and not stopping.done()
        if recycled:
            logger.info(
                "child %d: claimed its %d tasks (max_jobs): finishing them, then a new child takes the slot",
                config.slot,
                config.max_jobs,
            )
        state = STOPPING
        if not consuming.done():
            await consumer.stop(settings["grace"])
        try:
            await consuming
        except StoreError:
            if not stopping.done():
                raise  # the consumer failed on its own: a crash
            # At a stop: the consumer logged what it could not return (it stays in flight, and
            # the supervisor's reaper returns it); a normal end, as for the Server.
        finally:
            await run_hooks(app.on_shutdown, client)
        if os.getppid() != config.parent:
            await _forget_self(redis, KeySpace(settings["prefix"]), config, logger)
            return ExitCode.OK
        return ExitCode.RECYCLED if recycled else ExitCode.OK
    finally:
        detach()
        try:
            await scope.aclose()  # the ticker, the stop wait, a consumer that still runs
        finally:
            stats = consumer.stats
            board.tick(config.slot, time.monotonic(), STOPPING, pid, stats.processed, stats.by_queue)
            try:
                await client.close()  # its result waiter and batcher, before their connections
            finally:
                await aclose_client(redis)


async def _forget_self(redis: Any, keys: KeySpace, config: ChildConfig, logger: logging.Logger) -> None:
    """An orphan's last step: out of the consumer registry at once. Its supervisor, which beat and
    deregistered for it, is gone; left there, it would show alive until its beat aged out."""
    call = scripts.forget(
        consumers=keys.consumers, beats=keys.beats, consumer_id=config.consumer_id, ttl_ms=0
    )
    try:
        await asyncio.wait_for(arun(redis, call), RETURN_WAIT)
    except (StoreError, asyncio.TimeoutError) as exc:
        logger.warning("child %d: could not leave the consumer registry: %r", config.slot, exc)
        return
    logger.info("child %d: left the consumer registry (its supervisor is gone)", config.slot)


async def _connect(consumer: Consumer, stop: asyncio.Event, logger: logging.Logger, slot: int) -> bool:
    """Open the hot path, retrying with back-off; False when asked to stop first."""
    backoff = Backoff(logger, f"child {slot}: connecting to Redis")
    while not stop.is_set():
        try:
            await consumer.connect()
        except StoreError as exc:
            try:
                await asyncio.wait_for(stop.wait(), backoff.failed(exc))
            except asyncio.TimeoutError:
                pass
            continue
        backoff.succeeded()
        return True
    backoff.rest()
    return False


def _log_serving(
    logger: logging.Logger, config: ChildConfig, consumer: Consumer, loop: asyncio.AbstractEventLoop
) -> None:
    from fencekit.compiled import describe

    logger.info(
        "child %d (pid %d, %s) serving %s: loop %s, %s",
        config.slot,
        os.getpid(),
        config.consumer_id,
        ", ".join(consumer.queues),
        type(loop).__module__.split(".")[0],
        ", ".join(f"{k} {v}" for k, v in describe().items()),
    )


def main() -> NoReturn:
    """Entry of an exec'd child: config as JSON on stdin, workers by import path."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.basicConfig(level="INFO", handlers=[LineHandler(sys.stdout)])
    logger = logging.getLogger("fencekit.pool")
    try:
        config = ChildConfig.from_json(sys.stdin.buffer.read())
        logging.getLogger().setLevel(config.settings["log_level"])
        if config.settings["log_format"] == "json":
            logging.getLogger().handlers[0].setFormatter(JsonFormatter())
        app = load_app(config.app) if config.app else App(load_worker_paths(config.worker_paths))
        board = Board(config.board_slots, config.board_queues, fd=config.board_fd)
    except (FenceKitError, ValueError, KeyError) as exc:
        logger.error("pool child cannot start: %s", exc)
        flush_all()
        _coverage.save()
        os._exit(ExitCode.BOOT)
    run_and_exit(config, app, board, logger)
