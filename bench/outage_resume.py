"""How soon a pool claims again after a Redis outage, and what it logs: ``python -m bench.outage_resume``.

Options: ``[--outage 10] [--rounds 3] [--procs 2] [--ttl 30]``.

Starts a private Redis with an append-only file and ``python -m fencekit.pool
bench.apps:noop`` with its default settings (heartbeat TTL 30 s), lets it run
for longer than a heartbeat period, stops Redis (SIGTERM) for ``--outage``
seconds, starts it again, enqueues one task at once and times how long until
it is processed (``resume``). Prints, per round, the resume time and the
pool's WARNING and ERROR lines during the round; then the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench import apps
from fencekit import Client, Task
from fencekit.testing import RedisServer


def _processed(r: redis.Redis) -> int:
    return int(r.hget(f"fencekit:{{{apps.QUEUE}}}:stats", "processed") or 0)


def _enqueue(url: str) -> None:
    async def one() -> None:
        async with Client(url) as client:
            await client.enqueue(Task(apps.QUEUE, "noop"))

    asyncio.run(one())


def _wait(check: object, timeout: float) -> float:
    start = time.monotonic()
    while not check():  # type: ignore[operator]
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not within {timeout}s")
        time.sleep(0.01)
    return time.monotonic() - start


def one_round(outage: float, procs: int, ttl: float, warmup: float) -> tuple[float, list[str]]:
    home = Path(tempfile.mkdtemp())
    server = RedisServer(home / "redis", appendonly=True)
    server.start()
    log = home / "pool.log"
    argv = [sys.executable, "-m", "fencekit.pool", "bench.apps:noop", "--redis-url", server.url(),
            "--procs", str(procs), "--heartbeat-ttl", str(ttl), "--web-port", "off"]  # fmt: skip
    with log.open("wb") as out:
        pool = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: "pool ready" in log.read_text(errors="replace"), 30)
        _enqueue(server.url())
        with server.client() as r:
            _wait(lambda: _processed(r) == 1, 10)
        time.sleep(warmup)  # a heartbeat period or more: the lease is as old as it gets
        mark = len(log.read_text(errors="replace"))
        server.stop()
        time.sleep(outage)
        server.start()
        _enqueue(server.url())
        with server.client() as r:
            resume = _wait(lambda: _processed(r) == 2, 60)
        time.sleep(1.0)
        loud = [
            line
            for line in log.read_text(errors="replace")[mark:].splitlines()
            if " WARNING " in line or " ERROR " in line
        ]
        return resume, loud
    finally:
        os.killpg(pool.pid, signal.SIGTERM)
        pool.wait(30)
        server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.outage_resume", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--outage", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--ttl", type=float, default=30.0)
    args = parser.parse_args()
    resumes, counts = [], []
    for n in range(args.rounds):
        resume, loud = one_round(args.outage, args.procs, args.ttl, warmup=args.ttl / 3 + 1)
        resumes.append(resume)
        counts.append(len(loud))
        print(f"round {n + 1}: first task processed {resume:.2f}s after Redis started; "
              f"{len(loud)} WARNING/ERROR lines", flush=True)  # fmt: skip
        for line in loud:
            print("    " + line[:160])
    print(
        f"\nmedian of {args.rounds} rounds ({args.outage:g}s outage, --procs {args.procs}, "
        f"TTL {args.ttl:g}s): resume {statistics.median(resumes):.2f}s, "
        f"{statistics.median(counts):g} WARNING/ERROR lines"
    )


if __name__ == "__main__":
    main()
