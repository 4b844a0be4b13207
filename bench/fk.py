# ruff: noqa: RUF059
"""fencekit's end-to-end scenarios: drain, work, enqueue, producers, latency, scale, memory, start-up."""

from __future__ import annotations

import asyncio
import collections
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aredis

from bench import apps
from bench.common import PY, children_of, cpu_seconds, percentile, rss_kib, spawn, stop, wait_processed
from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.jobs._registry import ConsumerRecord
from fencekit.services._heartbeat import Heartbeat

KEYS = KeySpace("fencekit")
LOG = logging.getLogger("bench")


def stats_key(queue: str) -> str:
    return KEYS.queue(queue).stats


def pool_argv(
    url: str, procs: int, conc: int, app: str = "bench.apps:noop", level: str = "WARNING"
) -> list[str]:
    return [
        PY,
        "-m",
        "fencekit.pool",
        app,
        "--procs",
        str(procs),
        "--concurrency",
        str(conc),
        "--redis-url",
        url,
        "--web-port",
        "-1",
        "--log-level",
        level,
    ]


def server_argv(url: str, conc: int, level: str = "WARNING") -> list[str]:
    return [PY, "-m", "bench.fk_server", url, str(conc), level]


def quiet_client(url: str, keep_result: float = 0.0) -> Client:
    """A producer that logs nothing per task and, unless asked, keeps no task records."""
    client = Client(url, keep_result=keep_result)
    client.logger.setLevel(logging.WARNING)  # enqueue logs each task at INFO otherwise
    return client


async def fill(
    client: Client,
    n: int,
    op: str = "noop",
    queues: list[str] | None = None,
    delay: float | None = None,
    batch: int = 10_000,
    task_timeout: float | None = None,
    ops: list[str] | None = None,
    priorities: list[int] | None = None,
    fair_keys: int = 0,
    rate_keys: int = 0,
    in_batches: bool = False,
) -> float:
    """Enqueue ``n`` tasks with ``enqueue_many`` (round-robin over ``queues`` and over
    ``ops``, else every task is ``op``; ``priorities`` round-robin too, else 0); returns seconds.

    ``fair_keys`` K > 0 gives task i ``fair_key=f"t{i % K}"`` (K tenants in turn),
    ``rate_keys`` K > 0 gives it ``rate_key=f"r{i % K}"``; 0: none. ``in_batches``: each
    chunk of ``batch`` tasks is one batch (``client.batch``) with a no-op ``on_complete``."""
    queues = queues or [apps.QUEUE]
    ops = ops or [op]
    prios = priorities or [0]
    started = time.perf_counter()
    for start in range(0, n, batch):
        tasks = [
            Task(
                queues[i % len(queues)],
                ops[i % len(ops)],
                {"i": i},
                timeout=task_timeout,
                priority=prios[i % len(prios)],
                fair_key=f"t{i % fair_keys}" if fair_keys else None,
                rate_key=f"r{i % rate_keys}" if rate_keys else None,
            )
            for i in range(start, min(n, start + batch))
        ]
        if in_batches:
            await client.batch(tasks, on_complete=Task(apps.QUEUE, "noop", {}))
        else:
            await client.enqueue_many(tasks, delay=delay)
    return time.perf_counter() - started


class FakeConsumers:
    """``count`` registered, beating consumers that claim nothing (the 50-consumers case)."""

    def __init__(self, r: aredis.Redis, count: int) -> None:
        entries = {
            f"bench-host:{i}:fake:{i:012d}": ConsumerRecord.new(
                f"bench-host:{i}:fake:{i:012d}", [apps.QUEUE], 1, "bench"
            )
            for i in range(count)
        }
        self.heartbeat = Heartbeat(r, KEYS, 30.0, LOG, lambda: entries)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FakeConsumers:
        await self.heartbeat.beat_once()
        self.task = asyncio.create_task(self.heartbeat.loop().run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def drain(
    url: str,
    logdir: Path,
    *,
    n: int,
    procs: int = 1,
    conc: int = 128,
    op: str = "noop",
    app: str = "bench.apps:noop",
    queues: list[str] | None = None,
    scheduled: int = 0,
    fake_consumers: int = 0,
    server: bool = False,
    memory: bool = False,
    timeout: float = 600.0,
    keep_result: float = 0.0,
    task_timeout: float | None = None,
    level: str = "WARNING",
    ops: list[str] | None = None,
    priorities: list[int] | None = None,
    fair_keys: int = 0,
    rate_keys: int = 0,
    in_batches: bool = False,
    redis_time: bool = False,
    cpu: bool = False,
) -> dict[str, Any]:
    """Pre-enqueue ``n`` tasks, start the pool (or a Server), time until the last ack in Redis.

    ``keep_result`` > 0 gives every task a record (the default of a ``Client``);
    ``task_timeout`` sets ``Task(timeout=...)`` on every task; ``level`` is the
    pool's (or Server's) log level: at INFO each job logs its start and end lines;
    ``ops`` spreads the tasks round-robin over these operations (``app`` must
    register them) instead of all being ``op``; ``fair_keys`` / ``rate_keys`` K give
    the tasks a ``fair_key`` / ``rate_key`` over K keys in turn, ``in_batches`` makes each
    10,000 of them a batch (:func:`fill`).
    ``redis_time`` resets Redis's ``INFO commandstats`` once the tasks are in and reads
    it after the last ack: ``script_us_per_job``, Redis's µs in ``EVALSHA`` (the claim
    script mostly, the pool's heartbeats and schedulers too) over ``n``, and
    ``jobs_per_script_call`` (Redis counts the commands a script runs in their own
    rows as well, so a sum over every row would count them twice).
    """
    r = aredis.from_url(url)
    await r.flushall()
    store: dict[str, Any] = {}
    if memory:
        store["empty"] = await _redis_memory(r)
    client = quiet_client(url, keep_result)
    fill_s = await fill(
        client,
        n,
        op,
        queues,
        task_timeout=task_timeout,
        ops=ops,
        priorities=priorities,
        fair_keys=fair_keys,
        rate_keys=rate_keys,
        in_batches=in_batches,
    )
    if memory:
        store["filled"] = await _redis_memory(r)
    if scheduled:
        await fill(client, scheduled, op, None, delay=3600.0)  # retries due later: the scheduler scans them
    keys = [stats_key(q) for q in (queues or [apps.QUEUE])]
    what = "server" if server else f"pool-p{procs}"
    argv = server_argv(url, conc, level) if server else pool_argv(url, procs, conc, app, level)
    fakes = FakeConsumers(r, fake_consumers) if fake_consumers else None
    if fakes:
        await fakes.__aenter__()
    if redis_time:
        await r.config_resetstat()
    rss: dict[str, Any] = {}
    launched = time.perf_counter()
    tag = "" if app == "bench.apps:noop" or server else "-" + app.rpartition(":")[2]
    proc = spawn(argv, logdir / f"{what}{tag}-{op}-{n}-c{conc}-{level.lower()}.log")
    try:
        if memory:
            first, _, _ = await wait_processed(r, keys, min(20_000, n // 20), timeout, proc=proc)
            rss["early"] = _rss_tree(proc.pid)
        if cpu:
            early = await _cpu_reading(r, keys, proc.pid, n, timeout, proc)
        first, done, count = await wait_processed(r, keys, n, timeout, proc=proc)
        if cpu:
            late = await _cpu_reading(r, keys, proc.pid, n, timeout, proc)
        if redis_time:
            stats = await r.info("commandstats")
        if memory:
            rss["after"] = _rss_tree(proc.pid)
            await asyncio.sleep(2.0)
            rss["idle_after"] = _rss_tree(proc.pid)
            store["after"] = await _redis_memory(r)
    finally:
        code = stop(proc)
        if fakes:
            await fakes.__aexit__()
        await client.close()
        await r.aclose()
    result: dict[str, Any] = {
        "n": n,
        "procs": procs,
        "conc": conc,
        "op": op,
        "server": server,
        "keep_result": keep_result,
        "level": level,
        "fill_s": fill_s,
        "processed": count,
        "exit": code,
    }
    if app != "bench.apps:noop":
        result["app"] = app
    if ops:
        result["ops"] = len(ops)
    if queues:
        result["queues"] = len(queues)
    if first is None or done is None:
        result["error"] = f"only {count}/{n} processed within {timeout:.0f}s (exit {code})"
        return result
    result.update(
        first_ack_s=first - launched,
        drain_s=done - first,
        total_s=done - launched,
        rate=n / (done - first) if done > first else float("nan"),
    )
    if memory:
        result["rss"] = rss
        result["redis"] = store
    if cpu:
        jobs = max(1, late["acked"] - early["acked"])
        result["cpu_us_per_job"] = {
            side: (late[side] - early[side]) * 1e6 / jobs for side in ("redis", "supervisor", "children")
        }
    if redis_time:
        scripts = stats.get("cmdstat_evalsha", {})
        result["script_us_per_job"] = float(scripts.get("usec", 0)) / n
        result["jobs_per_script_call"] = n / max(1, int(scripts.get("calls", 0)))
    return result


async def _cpu_reading(
    r: Any, keys: list[str], pid: int, n: int, timeout: float, proc: Any
) -> dict[str, float]:
    """CPU seconds of Redis, the supervisor and its children, and the acks so far.

    The first reading (no acks yet past 5 %) waits for 5 % of ``n`` to be acknowledged,
    so the pool's start-up (imports, forks) stays out of the per-job figures."""
    _, _, acked = await wait_processed(r, keys, max(1, n // 20), timeout, proc=proc)
    info = await r.info("cpu")
    return {
        "acked": float(acked),
        "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        "supervisor": cpu_seconds(pid),
        "children": sum(cpu_seconds(c) for c in children_of(pid)),
    }


async def _redis_memory(r: Any) -> dict[str, Any]:
    """Keys in database 0 and the server's ``used_memory``: what N finished jobs leave behind.

    With task records, also ``record_bytes`` (the median ``MEMORY USAGE`` of up to 20 records:
    the newest finished ones, else those of the tasks at the head of the queue) and
    ``record_encoding`` (their ``OBJECT ENCODING``: one word when all share it, else each
    with its count: a batch's callback, for one, holds its long unique key and is a hashtable)."""
    info = await r.info("memory")
    out: dict[str, Any] = {"keys": int(await r.dbsize()), "used_memory": int(info["used_memory"])}
    base = f"fencekit:{{{apps.QUEUE}}}:"
    names = [k.decode() for k in await r.lrange(base + "finished", 0, 19)]
    if not names:
        heads = await r.lrange(base + "pending", -20, -1)
        names = [base + "job:" + orjson.loads(raw)["jid"] for raw in heads]
    sizes = [size for name in names if (size := await r.memory_usage(name, samples=0)) is not None]
    if sizes:
        out["record_bytes"] = statistics.median(sizes)
        kinds = [(await r.object("encoding", name) or b"gone").decode() for name in names]
        encodings = collections.Counter(kinds)
        out["record_encoding"] = ", ".join(
            kind if count == len(names) else f"{count} {kind}" for kind, count in encodings.most_common()
        )
    return out


def _rss_tree(pid: int) -> dict[str, Any]:
    kids = children_of(pid)
    return {"supervisor": rss_kib(pid), "children": [rss_kib(c) for c in kids]}


async def startup(url: str, logdir: Path, procs: int, timeout: float = 60.0) -> dict[str, Any]:
    """Seconds from launch until the pool logs "pool ready" (an INFO run on an empty queue)."""
    r = aredis.from_url(url)
    await r.flushall()
    await r.aclose()
    log = logdir / f"startup-p{procs}.log"
    launched = time.perf_counter()
    proc = spawn(pool_argv(url, procs, 128, level="INFO"), log)
    ready = None
    try:
        while time.perf_counter() - launched < timeout and proc.poll() is None:
            if "pool ready" in log.read_text(errors="replace"):
                ready = time.perf_counter() - launched
                break
            await asyncio.sleep(0.005)
    finally:
        stop(proc)
    return {"procs": procs, "ready_s": ready}


async def enqueue(url: str, n_single: int, n_bulk: int, batch: int = 1000) -> dict[str, Any]:
    """One ``enqueue`` at a time, then ``enqueue_many`` in batches of ``batch``."""
    r = aredis.from_url(url)
    await r.flushall()
    client = quiet_client(url)
    try:
        for i in range(50):  # warm: connection, script load, queue registration
            await client.enqueue(Task(apps.QUEUE, "noop", {"i": i}))
        t0 = time.perf_counter()
        for i in range(n_single):
            await client.enqueue(Task(apps.QUEUE, "noop", {"i": i}))
        single = n_single / (time.perf_counter() - t0)
        await r.flushall()
        client._known_queues.clear()
        t0 = time.perf_counter()
        for start in range(0, n_bulk, batch):
            await client.enqueue_many(Task(apps.QUEUE, "noop", {"i": i}) for i in range(start, start + batch))
        bulk = n_bulk / (time.perf_counter() - t0)
        assert await r.llen(KEYS.queue(apps.QUEUE).pending) == n_bulk
    finally:
        await client.close()
        await r.aclose()
    return {"single": single, "bulk": bulk, "n_single": n_single, "n_bulk": n_bulk, "batch": batch}


async def producers(url: str, n: int, producers: int = 64, warm: int = 50) -> dict[str, Any]:
    """``producers`` asyncio tasks sharing one ``Client``, each awaiting one ``enqueue`` at a
    time until ``n`` tasks are enqueued in all (what the handlers of one web process do).

    The pending list must then hold exactly ``n`` tasks; otherwise the row is an error.
    """
    r = aredis.from_url(url)
    await r.flushall()
    client = quiet_client(url)
    pending_key = KEYS.queue(apps.QUEUE).pending
    try:
        for i in range(warm):  # connection, script load, queue registration
            await client.enqueue(Task(apps.QUEUE, "noop", {"i": i}))
        await r.delete(pending_key)
        next_i = 0

        async def producer() -> None:
            nonlocal next_i
            while next_i < n:
                i = next_i
                next_i += 1
                await client.enqueue(Task(apps.QUEUE, "noop", {"i": i}))

        t0 = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(producers)))
        elapsed = time.perf_counter() - t0
        pending = int(await r.llen(pending_key))
    finally:
        await client.close()
        await r.aclose()
    result: dict[str, Any] = {
        "n": n,
        "producers": producers,
        "rate": n / elapsed,
        "elapsed_s": elapsed,
        "pending": pending,
        "how": f"one Client, {producers} asyncio tasks",
    }
    if pending != n:
        result["error"] = f"pending list holds {pending} tasks, not {n}"
    return result


async def latency(
    url: str,
    logdir: Path,
    *,
    n: int = 1000,
    procs: int = 2,
    conc: int = 16,
    gap: float = 0.002,
    server: bool = False,
) -> dict[str, Any]:
    """An idle pool; ``n`` tasks enqueued one at a time ``gap`` s apart; enqueue -> start."""
    r = aredis.from_url(url)
    await r.flushall()
    client = quiet_client(url)
    argv = server_argv(url, conc) if server else pool_argv(url, procs, conc)
    proc = spawn(argv, logdir / f"latency-{'server' if server else procs}.log")
    key = stats_key(apps.QUEUE)
    try:
        await client.enqueue(Task(apps.QUEUE, "noop", {}))  # wait until it serves
        first, done, _ = await wait_processed(r, [key], 1, 60.0, proc=proc)
        if done is None:
            return {"error": "pool did not serve within 60 s"}
        await asyncio.sleep(1.5)  # every child up and idle (blocked on its wake key)
        for _ in range(n):
            await client.enqueue(Task(apps.QUEUE, "lat", {"t": time.time(), "url": url}))
            await asyncio.sleep(gap)
        _, done, _ = await wait_processed(r, [key], n + 1, 60.0, proc=proc)
        values = [float(x) * 1000 for x in await r.lrange("bench:lat", 0, -1)]
    finally:
        stop(proc)
        await client.close()
        await r.aclose()
    if not values:  # the jobs ran but recorded nothing: say so instead of reporting NaN
        return {"error": f"no latency samples recorded (see {logdir.name}/latency-*.log)"}
    return {
        "n": len(values),
        "p50_ms": percentile(values, 0.5),
        "p99_ms": percentile(values, 0.99),
        "max_ms": max(values),
        "procs": 1 if server else procs,
        "conc": conc,
    }
