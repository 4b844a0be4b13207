"""Shared helpers of the job-queue tests (``tests/**/test_queue_*.py``).

Everything here reads Redis directly (never through the queue's own
accessors) so the tests check the state, not the code's claims about it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from fencekit import Client, Server, Task

PREFIX = "fencekit"

# -- keys, spelled from the documented layout (keys.py docstring) -------------------------


def qkey(queue: str, part: str) -> str:
    """``fencekit:{queue}:<part>`` (pending, scheduled, stats, token, dead, dead:index, wake)."""
    return f"{PREFIX}:{{{queue}}}:{part}"


CONSUMERS = f"{PREFIX}:{{registry}}:consumers"
BEATS = f"{PREFIX}:{{registry}}:beats"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def inflight_keys(r: redis.Redis, queue: str) -> list[str]:
    """Every in-flight hash of ``queue`` that exists now (any consumer)."""
    return sorted(_text(k) for k in r.scan_iter(match=qkey(queue, "inflight:*"), count=1000))


def inflight(r: redis.Redis, queue: str) -> dict[int, dict[str, Any]]:
    """token -> decoded envelope of every task of ``queue`` in flight anywhere."""
    out: dict[int, dict[str, Any]] = {}
    for key in inflight_keys(r, queue):
        for token, raw in r.hgetall(key).items():
            out[int(token)] = orjson.loads(raw)
    return out


def inflight_count(r: redis.Redis, queue: str) -> int:
    return sum(int(r.hlen(k)) for k in inflight_keys(r, queue))


def pending(r: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Decoded pending envelopes, next to be claimed first (RPOP end first)."""
    return [orjson.loads(raw) for raw in reversed(r.lrange(qkey(queue, "pending"), 0, -1))]


def scheduled(r: redis.Redis, queue: str) -> list[tuple[dict[str, Any], float]]:
    """(envelope, due ms) of the scheduled set, earliest first."""
    return [
        (orjson.loads(raw), score)
        for raw, score in r.zrange(qkey(queue, "scheduled"), 0, -1, withscores=True)
    ]


def stats(r: redis.Redis, queue: str) -> dict[str, int]:
    raw = r.hgetall(qkey(queue, "stats"))
    values = {_text(k): int(v) for k, v in raw.items()}
    for name in (
        "enqueued",
        "processed",
        "failed",
        "retried",
        "fenced_out",
        "dead",
        "purged",
        "revived",
        "expired",
        "deduped",
        "cancelled",
    ):
        values.setdefault(name, 0)
    return values


def locate(r: redis.Redis, queue: str, jid: str) -> list[str]:
    """Every place in Redis that holds task ``jid`` now: "pending", "scheduled", "inflight:<key>"."""
    places = ["pending" for env in pending(r, queue) if env.get("jid") == jid]
    places += ["scheduled" for env, _ in scheduled(r, queue) if env.get("jid") == jid]
    for key in inflight_keys(r, queue):
        for raw in r.hvals(key):
            if orjson.loads(raw).get("jid") == jid:
                places.append("inflight:" + key)
    return places


def redis_time_ms(r: redis.Redis) -> float:
    seconds, micros = r.time()
    return seconds * 1000 + micros / 1000


def accounted(r: redis.Redis, queue: str) -> tuple[int, int]:
    """(enqueued, processed + failed + purged + pending + scheduled + in flight) of ``queue`` (I6)."""
    s = stats(r, queue)
    places = (
        int(r.llen(qkey(queue, "pending")))
        + int(r.zcard(qkey(queue, "scheduled")))
        + inflight_count(r, queue)
    )
    return s["enqueued"], s["processed"] + s["failed"] + s["purged"] + places


def snapshot(r: redis.Redis, *, ignore_fields: tuple[str, ...] = ("fenced_out",)) -> dict[str, Any]:
    """Every key and its value (stats hashes without ``ignore_fields``)."""
    out: dict[str, Any] = {}
    for key in r.scan_iter(count=1000):
        name = _text(key)
        kind = _text(r.type(key))
        if kind == "string":
            out[name] = r.get(key)
        elif kind == "list":
            out[name] = r.lrange(key, 0, -1)
        elif kind == "hash":
            value = {_text(k): v for k, v in r.hgetall(key).items()}
            if name.endswith(":stats"):
                value = {k: v for k, v in value.items() if k not in ignore_fields}
            out[name] = value
        elif kind == "zset":
            out[name] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[name] = sorted(r.smembers(key))
        else:
            out[name] = kind
    return out


# -- waiting without blocking the loop ----------------------------------------------------


async def eventually(
    predicate: Callable[[], Any], timeout: float = 10.0, what: str = "", interval: float = 0.02
) -> Any:
    """Await until ``predicate()`` (sync or async) is truthy; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running(server: Server, timeout: float = 15.0) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``server.run()`` as a task until the block ends, then ``server.stop()`` it."""
    task = asyncio.create_task(server.run())
    started = asyncio.create_task(server.started.wait())
    done, _ = await asyncio.wait({task, started}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        started.cancel()
        task.result()
        raise AssertionError("server.run() returned before it started")
    if started not in done:
        started.cancel()
        task.cancel()
        raise TimeoutError("server did not start")
    try:
        yield task
    finally:
        server.stop()
        await asyncio.wait_for(asyncio.shield(task), timeout)


def new_server(url: str, *workers: object, **kwargs: Any) -> Server:
    """A Server for tests: web_port 0, TTL 10 s, grace 0.5 s unless given; workers added."""
    kwargs.setdefault("web_port", 0)
    kwargs.setdefault("heartbeat_ttl", 10.0)
    kwargs.setdefault("grace", 0.5)
    server = Server(redis_url=url, **kwargs)
    server.logger = capture_logger(f"test.fencekit.server.{id(server)}")
    if workers:
        server.add_workers(*workers)
    return server


async def reaped_while_running(
    url: str, queue: str, hooks: Any, settled: Callable[[], Any], client_hooks: Any = None
) -> str:
    """One task whose first delivery is reaped while it runs (as a peer's reaper would do to a
    consumer it believes dead), on a ``Server`` with ``hooks``; returns its jid once ``settled()``.

    The first run waits until the reap is done, then returns: its ack is refused.
    """
    release = asyncio.Event()
    runs: list[int] = []

    async def perform(payload: dict[str, Any]) -> None:
        runs.append(1)
        if len(runs) == 1:
            await release.wait()

    server = new_server(url, worker(queue, "slow", perform), hooks=hooks)
    async with Client(redis_url=url, hooks=client_hooks) as client, running(server):
        jid = await client.enqueue(Task(queue, "slow", {}))
        await eventually(lambda: runs, what="the first run")
        assert server.services is not None
        await server.services.reaper.reap(server.consumer_id, forget_if_silent=False, queues=[queue])
        release.set()
        await eventually(settled, timeout=15, what="the second delivery settled")
    return jid


def worker(queue: str, operation: str, perform: Any, **attrs: Any) -> type:
    """A worker class whose classmethod ``perform`` returns ``await perform(payload)``."""

    async def _perform(cls: type, payload: dict[str, Any]) -> Any:
        return await perform(payload)

    return type(
        f"W_{queue}_{operation}",
        (),
        {"queue": queue, "operation": operation, "perform": classmethod(_perform), **attrs},
    )


# -- logs ----------------------------------------------------------------------------------


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


def capture_logger(name: str) -> logging.Logger:
    """A fresh DEBUG logger recording into ``logger.list_handler`` (not propagating)."""
    logger = logging.getLogger(name)
    logger.handlers.clear()
    handler = ListHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.list_handler = handler  # type: ignore[attr-defined]
    return logger


def messages(logger: logging.Logger) -> list[str]:
    return logger.list_handler.messages()  # type: ignore[attr-defined]


# -- a Server in another process ------------------------------------------------------------

SERVER_SCRIPT = textwrap.dedent(
    '''
    """A fencekit Server in its own process, for the crash / pause / SIGTERM tests.

    argv: url queue heartbeat_ttl grace
    Its worker records each delivery in Redis (list "events": "pid jid attempt token"),
    then waits for the key "release"; released, it writes "{<queue>}:result" with
    set_if_fresh and records a FencedOutError in "fenced:<pid>". It returns
    "A-<pid>" (or "A-<pid>-stale" once fenced out), the task's result.
    """
    import asyncio
    import os
    import sys

    from fencekit import FencedOutError, Server, current_job
    from fencekit._redis.clients import aclose_client, async_client

    URL, QUEUE, TTL, GRACE = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    PID = os.getpid()


    class HoldWorker:
        queue = QUEUE
        operation = "hold"

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            r = async_client(URL)
            try:
                await r.rpush("events", f"{PID} {job.jid} {job.attempt} {job.token.value}")
                while not await r.exists("release"):
                    await asyncio.sleep(0.02)
                try:
                    await job.set_if_fresh("{" + QUEUE + "}:result", f"A-{PID}")
                except FencedOutError as exc:
                    await r.set(f"fenced:{PID}", repr(exc))
                    return f"A-{PID}-stale"
                await r.set(f"wrote:{PID}", "1")
                return f"A-{PID}"
            finally:
                await aclose_client(r)


    server = Server(redis_url=URL, heartbeat_ttl=TTL, grace=GRACE, web_port=0)
    server.add_workers(HoldWorker)


    @server.on_shutdown
    async def mark_shutdown():
        r = async_client(URL)
        await r.set(f"shutdown-hook:{PID}", "1")
        await aclose_client(r)


    asyncio.run(server.run())
    print("server process exiting", flush=True)
    '''
)


class ServerProcess:
    """``SERVER_SCRIPT`` running in a child process (stdout/stderr in a log file)."""

    def __init__(
        self,
        tmp_path: Path,
        url: str,
        queue: str,
        *,
        ttl: float = 1.0,
        grace: float = 0.0,
        source: str = SERVER_SCRIPT,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """Run ``source`` (SERVER_SCRIPT unless given) with argv ``url queue ttl grace *extra_args``."""
        script = tmp_path / f"fk_server_proc_{abs(hash(source)) % 10**8}.py"
        script.write_text(source)
        self.log_path = tmp_path / f"server-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), url, queue, str(ttl), str(grace), *extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def events(r: redis.Redis) -> list[tuple[int, str, int, int]]:
    """The (pid, jid, attempt, token) of every delivery the worker of SERVER_SCRIPT started."""
    out = []
    for raw in r.lrange("events", 0, -1):
        pid, jid, attempt, token = _text(raw).split()
        out.append((int(pid), jid, int(attempt), int(token)))
    return out


def consumer_of(r: redis.Redis, pid: int) -> str | None:
    """The registered consumer id of process ``pid``, if any."""
    for cid, info in r.hgetall(CONSUMERS).items():
        if orjson.loads(info).get("pid") == pid:
            return _text(cid)
    return None


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking call (e.g. a Redis restart) off the loop."""
    return await asyncio.to_thread(fn, *args)
