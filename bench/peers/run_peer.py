"""Run one scenario for one peer, inside that peer's virtualenv; prints one JSON line.

    bench/.venvs/<peer>/bin/python bench/peers/run_peer.py PEER SCENARIO --url URL [--n N] [--procs P]

Scenarios: ``drain`` (N jobs pre-enqueued, P worker processes, timed from job 0's
start to job N-1's), ``typical`` (the same with the typical job: one Redis write, then
a small result the peer keeps; see each driver's ``typical``), ``enqueue`` (one at a
time, and the peer's bulk API where it has one), ``latency`` (idle workers, N jobs
2 ms apart, enqueue -> start p50/p99), ``producers`` (``--producers`` concurrent
producers sharing the driver's one ``Producer``, each enqueueing one job at a time
until N are enqueued in all: asyncio tasks for an async peer, threads for a sync
one; no workers run).

``--conc C`` runs each worker process at concurrency C (else the driver's own
setting); ``--usual`` runs the workers at the peer's default log level with
results kept, as a user runs them (else: no results kept, quiet where the peer can be).
Both reach the driver, and the workers it starts, as ``BENCH_CONC`` and ``BENCH_USUAL``.
Every wait is bounded; the workers are stopped (SIGTERM, then SIGKILL of their
process group) whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pct(values, q):
    s = sorted(values)
    if not s:
        return None
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def call(fn, *args):
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class Workers:
    def __init__(self, drv, procs, logdir):
        self.procs = []
        bindir = str(Path(sys.executable).parent)
        env = dict(os.environ, PYTHONPATH=str(HERE))
        for k, argv in enumerate(drv.worker_argvs(bindir, procs)):
            log = open(Path(logdir) / f"{drv.__name__}-worker{k}.log", "ab")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    argv, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def alive(self):
        return all(p.poll() is None for p in self.procs)

    def stop(self):
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)


async def wait_key(r, key, timeout, workers=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = r.get(key)
        if value is not None:
            return float(value)
        if workers is not None and not workers.alive():
            raise RuntimeError("a worker process exited")
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{key} not set within {timeout:.0f}s")


async def concurrent_producers(drv, prod, n, producers):
    """``producers`` callers of ``prod.one`` at once, N jobs in all; returns (seconds, how)."""
    jobs = iter(range(n))
    if drv.ASYNC:

        async def producer():
            for i in jobs:  # one loop: the shared iterator needs no lock
                await call(prod.one, i, 10**9)

        t0 = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(producers)))
        return time.perf_counter() - t0, f"one Producer, {producers} asyncio tasks"
    lock = threading.Lock()
    errors = []

    def producer():
        try:
            while True:
                with lock:
                    i = next(jobs, None)
                if i is None or errors:
                    return
                prod.one(i, 10**9)
        except Exception as exc:  # the first one is reported
            errors.append(exc)

    threads = [threading.Thread(target=producer, daemon=True) for _ in range(producers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed, f"one Producer, {producers} threads"


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("peer")
    ap.add_argument("scenario", choices=["drain", "typical", "enqueue", "latency", "producers"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--n-bulk", type=int, default=20000)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--gap", type=float, default=0.002)
    ap.add_argument("--producers", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--logdir", default="/tmp")
    ap.add_argument("--conc", type=int, default=None)
    ap.add_argument("--usual", action="store_true")
    args = ap.parse_args()
    os.environ["BENCH_REDIS_URL"] = args.url
    if args.conc is not None:
        os.environ["BENCH_CONC"] = str(args.conc)
    if args.usual:
        os.environ["BENCH_USUAL"] = "1"
    sys.path.insert(0, str(HERE))
    import _common

    _common.URL = args.url
    drv = importlib.import_module(f"drv_{args.peer}")
    r = _common.client()
    r.flushdb()
    out = {"peer": args.peer, "scenario": args.scenario, "settings": drv.SETTINGS}
    prod = drv.Producer()
    await call(prod.start)
    workers = None
    try:
        if args.scenario == "enqueue":
            for i in range(20):
                await call(prod.one, i, 10**9)
            t0 = time.perf_counter()
            for i in range(args.n):
                await call(prod.one, i, 10**9)
            out["single"] = args.n / (time.perf_counter() - t0)
            out["n_single"] = args.n
            if drv.BULK:
                r.flushdb()
                t0 = time.perf_counter()
                for start in range(0, args.n_bulk, 1000):
                    await call(prod.bulk, [(i, 10**9) for i in range(start, start + 1000)])
                out["bulk"] = args.n_bulk / (time.perf_counter() - t0)
                out["bulk_api"] = drv.BULK
            else:
                out["bulk"] = None
                out["bulk_api"] = "none"
        elif args.scenario == "producers":
            for i in range(20):  # warm: connections, registration
                await call(prod.one, i, 10**9)
            elapsed, how = await concurrent_producers(drv, prod, args.n, args.producers)
            out.update(n=args.n, producers=args.producers, rate=args.n / elapsed, elapsed_s=elapsed, how=how)
        elif args.scenario in ("drain", "typical"):
            n = args.n
            enqueue = prod.one if args.scenario == "drain" else prod.typical
            for i in range(n):
                await call(enqueue, i, n)
            workers = Workers(drv, args.procs, args.logdir)
            launched = time.time()
            first = await wait_key(r, "bench:mark:first", 120, workers)
            last = await wait_key(r, "bench:mark:last", args.timeout, workers)
            out.update(
                n=n,
                procs=args.procs,
                rate=(n - 1) / (last - first),
                first_job_s=first - launched,
                drain_s=last - first,
                conc=args.conc,
                usual=args.usual,
            )
            if args.scenario == "typical":  # what the jobs left: their writes, and the results kept
                out["kept"] = drv.KEPT
                deadline = time.monotonic() + 5  # the last jobs' results land just after their marks
                while drv.results_kept(r) < n and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                out["writes"] = sum(1 for _ in r.scan_iter("bench:out:*", count=1000))
                out["results"] = drv.results_kept(r)
        else:
            workers = Workers(drv, args.procs, args.logdir)
            await call(prod.one, 0, 1)
            await wait_key(r, "bench:mark:last", 120, workers)
            await asyncio.sleep(1.5)
            r.delete("bench:lat")
            for _ in range(args.n):
                await call(prod.lat, time.time())
                await asyncio.sleep(args.gap)
            deadline = time.monotonic() + 60
            while r.llen("bench:lat") < args.n and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            values = [float(x) * 1000 for x in r.lrange("bench:lat", 0, -1)]
            out.update(
                n=len(values),
                procs=args.procs,
                p50_ms=pct(values, 0.5),
                p99_ms=pct(values, 0.99),
                max_ms=max(values) if values else None,
            )
            if len(values) < args.n:
                out["error"] = f"only {len(values)}/{args.n} jobs started within 60 s"
    except Exception as exc:  # reported, never dropped
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if workers is not None:
            workers.stop()
        with contextlib.suppress(Exception):
            await call(prod.close)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
