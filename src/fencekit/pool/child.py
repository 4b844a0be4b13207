"""One pool child: a uvloop event loop running the consumer, nothing else.

A child is started by the supervisor either by ``fork`` (the CLI pool) or by
exec of ``python -m fencekit.pool.exec_child`` (a pool embedded in a host that may have
threads), with a :class:`ChildConfig`. Its heartbeat, reaping and scheduling
are the supervisor's; it only claims, performs and settles, and its event
loop ticks its slot of the shared :class:`~fencekit.pool.board.Board` so the
supervisor can tell a hung child from a busy one.

Fork hygiene (DESIGN, "What has been measured"): a forked child first drops
the signal wakeup fd and handlers it inherited, forgets the parent's running
loop and policy, drops ``NOTIFY_SOCKET``, reseeds ``random`` and the id
sequence, builds its own connections, and always leaves with ``os._exit`` so
no finalizer of an inherited object runs.

SIGTERM stops claiming and lets running tasks finish within ``grace``; the
rest go back to their queues. SIGINT and SIGHUP are ignored: a terminal's
Ctrl-C reaches the whole process group, and the supervisor decides.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from typing import NoReturn

import orjson

from fencekit._redis.keys import KeySpace
from fencekit._redis.store import aclose_client, async_client, parse_url
from fencekit.errors import ConfigError, FenceKitError, StoreError
from fencekit.pool.board import READY, STARTING, STOPPING, TICK, Board
from fencekit.queue import ids
from fencekit.queue.client import durability
from fencekit.queue.consumer import Consumer
from fencekit.queue.loops import Backoff
from fencekit.queue.settle import DEFAULT_FENCE_TTL_MS, DEFAULT_KEEP_DEAD, SettleSettings
from fencekit.queue.worker import WorkerRegistry

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BOOT_ERROR = 3

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
    """Everything a child needs; JSON-encodable for exec'd children."""

    slot: int
    consumer_id: str
    redis_url: str
    prefix: str
    concurrency: int
    grace: float
    heartbeat_ttl: float
    board_fd: int
    board_slots: int
    log_level: str = "INFO"
    link: str = "lean"
    fence_ttl_ms: int = DEFAULT_FENCE_TTL_MS
    keep_dead: int = DEFAULT_KEEP_DEAD
    app: str | None = None
    worker_paths: tuple[str, ...] = ()
    durable_replicas: int = 0
    durable_timeout: float = 1.0

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> ChildConfig:
        data = orjson.loads(raw)
        data["worker_paths"] = tuple(data.get("worker_paths", ()))
        return cls(**data)


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


def new_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(config: ChildConfig, registry: WorkerRegistry, board: Board, logger: logging.Logger) -> NoReturn:
    """Run the child to its end and leave the process with ``os._exit``."""
    code = EXIT_ERROR
    try:
        loop = new_loop()
        asyncio.set_event_loop(loop)
        code = loop.run_until_complete(_serve(config, registry, board, logger))
    except ConfigError as exc:
        logger.error("child %d: %s", config.slot, exc)
        code = EXIT_BOOT_ERROR
    except BaseException:
        logger.error("child %d crashed:\n%s", config.slot, traceback.format_exc())
        code = EXIT_ERROR
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


async def _serve(config: ChildConfig, registry: WorkerRegistry, board: Board, logger: logging.Logger) -> int:
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    target = parse_url(config.redis_url)
    redis = async_client(target)
    half_ttl = config.heartbeat_ttl / 2
    consumer = Consumer(
        target=target,
        keys=KeySpace(config.prefix),
        registry=registry,
        consumer_id=config.consumer_id,
        concurrency=config.concurrency,
        redis_client=redis,
        logger=logger,
        settings=SettleSettings(config.fence_ttl_ms, config.keep_dead),
        link_kind=config.link,
        lease_ok=lambda: time.monotonic() - board.beat_ok() < half_ttl,
        durable=durability(config.durable_replicas, config.durable_timeout),
    )
    state = STARTING

    async def ticker() -> None:
        while True:
            board.tick(
                config.slot, time.monotonic(), state, pid, consumer.stats.processed, consumer.stats.durations
            )
            await asyncio.sleep(TICK)

    ticking = asyncio.create_task(ticker())
    try:
        backoff = Backoff(logger, f"child {config.slot}: connecting to Redis")
        while not stop.is_set():
            try:
                await consumer.connect()
                break
            except StoreError as exc:
                try:
                    await asyncio.wait_for(stop.wait(), backoff.failed(exc))
                except asyncio.TimeoutError:
                    pass
        if stop.is_set():
            return EXIT_OK
        backoff.succeeded()
        state = READY
        board.tick(config.slot, time.monotonic(), state, pid, 0, consumer.stats.durations)
        from fencekit.compiled import describe

        logger.info(
            "child %d (pid %d, %s) serving %s: loop %s, %s",
            config.slot,
            pid,
            config.consumer_id,
            ", ".join(consumer.queues),
            type(loop).__module__.split(".")[0],
            ", ".join(f"{k} {v}" for k, v in describe().items()),
        )
        consuming = asyncio.create_task(consumer.run())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({consuming, stopping}, return_when=asyncio.FIRST_COMPLETED)
        state = STOPPING
        if not consuming.done():
            await consumer.stop(config.grace)
        await consuming
        return EXIT_OK
    finally:
        ticking.cancel()
        board.tick(
            config.slot, time.monotonic(), STOPPING, pid, consumer.stats.processed, consumer.stats.durations
        )
        await aclose_client(redis)


def main() -> NoReturn:
    """Entry of an exec'd child: config as JSON on stdin, workers by import path."""
    from fencekit.runtime.app import load_app, load_worker_paths

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    config = ChildConfig.from_json(sys.stdin.buffer.read())
    logging.basicConfig(
        level=config.log_level, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logger = logging.getLogger("fencekit.pool")
    try:
        workers = load_app(config.app) if config.app else load_worker_paths(config.worker_paths)
        registry = WorkerRegistry()
        registry.add(workers)
        board = Board(config.board_slots, fd=config.board_fd)
    except FenceKitError as exc:
        logger.error("child %d cannot start: %s", config.slot, exc)
        os._exit(EXIT_BOOT_ERROR)
    run(config, registry, board, logger)
