"""What a job's life costs on the drain: ``python -m bench.lifecycle --rounds 3 --n 100000``.

In alternating rounds on one private Redis, a pool (``--procs``, concurrency
128) drains N pre-enqueued tasks in each case:

- ``nothing kept``: no-op tasks, ``keep_result=0`` (no task records: the
  baseline, and what ``bench.ab`` compares across checkouts);
- ``records kept``: no-op tasks with the default ``keep_result`` (each task's
  record written at enqueue, its final state at the ack);
- ``records + result``: the same, each job returning a small dict;
- ``timeout on every job``: no-op tasks with ``Task(timeout=60)``, no records;
- ``INFO logging``: no-op tasks, no records, the pool at INFO (each job's two lines);
- ``one fenced write``: one ``set_if_fresh`` per job, no records;
- ``fenced write + result kept``: the typical job, one fenced write and a small result kept in
  the task's record (the default ``keep_result``);
- ``write on ack`` and ``write on ack + result kept``: the same with the write staged by
  ``current_job().set_on_ack``, landing with the ack;
- what the other features cost the jobs that use them: ``batch children`` (each 10,000
  tasks one batch with an ``on_complete`` callback; a batch child always keeps its record,
  so compare it with ``records kept``), ``fair share over 100 keys`` (``fair_key`` over 100
  tenants in turn) and ``one checkpoint`` (one ``await current_job().checkpoint(...)`` a job).
  What they cost the jobs that do not use them is the ``nothing kept`` drain itself, against
  a checkout from before them (``python -m bench.ab``).

It prints each figure, the medians and their ratio to ``nothing kept``, the
CPU µs per job of Redis and of the pool's children (``fk.drain(cpu=True)``: on
two cores shared by Redis and the pool their sum decides the rate), Redis's
memory after each drain (the records left are bounded by ``keep_finished``)
and one record's ``MEMORY USAGE`` at enqueue and once finished, with its
encoding (``listpack``: the compact form, ``lua/_env.lua``); then, against the
limit, each case's Redis ceiling (``bench.ceiling.replay``) and the fraction of it
the drain reaches.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench import ceiling, fk
from fencekit.testing import RedisServer

CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("nothing kept", {}),
    ("records kept", {"keep_result": 3600.0}),
    ("records + result", {"keep_result": 3600.0, "op": "result"}),
    ("timeout on every job", {"task_timeout": 60.0}),
    ("INFO logging", {"level": "INFO"}),
    ("one fenced write", {"op": "fenced"}),
    ("fenced write + result kept", {"keep_result": 3600.0, "op": "fenced_result"}),
    ("write on ack", {"op": "on_ack"}),
    ("write on ack + result kept", {"keep_result": 3600.0, "op": "on_ack_result"}),
    ("batch children", {"keep_result": 3600.0, "in_batches": True}),
    ("fair share over 100 keys", {"fair_keys": 100}),
    ("one checkpoint", {"op": "checkpoint_once"}),
)
# Each case's kind of job for the Redis ceiling (bench.ceiling.replay: the same commands, no network).
CEILING = {
    "nothing kept": "nothing kept",
    "records kept": "record",
    "records + result": "record + result",
    "timeout on every job": "nothing kept",
    "INFO logging": "nothing kept",
    "one fenced write": "fenced write",
    "fenced write + result kept": "fenced write + result kept",
    "write on ack": "write on ack",
    "write on ack + result kept": "write on ack + result kept",
}  # the other cases send commands no replay covers: their ceiling is not given


async def main(rounds: int, n: int, procs: int, only: list[str] | None = None) -> None:
    logdir = Path(tempfile.mkdtemp(prefix="fencekit-lifecycle-"))
    cases = [(name, kw) for name, kw in CASES if only is None or name in only or name == "nothing kept"]
    rates: dict[str, list[float]] = {name: [] for name, _ in cases}
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name, _ in cases}
    memory: dict[str, Any] = {}
    with RedisServer() as srv:
        url = srv.url()
        for _ in range(rounds):
            for name, kw in cases:
                result = await fk.drain(url, logdir, n=n, procs=procs, conc=128, memory=True, cpu=True, **kw)
                if "error" in result:
                    raise SystemExit(f"{name}: {result['error']}")
                rates[name].append(result["rate"])
                cpu[name].append(result["cpu_us_per_job"])
                memory[name] = result["redis"]
                print(f"{name}: {result['rate']:,.0f} jobs/s", flush=True)
        limits = ceiling.replay(srv.port, n=min(n, 100_000))
    base = statistics.median(rates["nothing kept"])
    print(
        f"\npool --procs {procs}, -c 128, N={n:,}, {rounds} rounds (median jobs/s, ÷ nothing kept; "
        "CPU µs per job of Redis and of the pool's children; a record's MEMORY USAGE at enqueue / finished)"
    )
    print(
        "| case | jobs/s per round | median | ÷ nothing kept | Redis µs/job | children µs/job "
        "| left in Redis | record bytes |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in cases:
        median = statistics.median(rates[name])
        after, filled = memory[name]["after"], memory[name]["filled"]
        redis_us = statistics.median(c["redis"] for c in cpu[name])
        child_us = statistics.median(c["children"] for c in cpu[name])
        record = (
            f"{filled['record_bytes']:,.0f} / {after['record_bytes']:,.0f} ({after['record_encoding']})"
            if "record_bytes" in after
            else "—"
        )
        print(
            f"| {name} | {' / '.join(f'{r:,.0f}' for r in rates[name])} | {median:,.0f} | "
            f"{median / base:.2f} | {redis_us:.2f} | {child_us:.2f} | "
            f"{after['keys']:,} keys, {after['used_memory'] / 1e6:.1f} MB | {record} |"
        )
    print(
        "\nAgainst the limit: each case's Redis ceiling (bench.ceiling.replay: the commands the drain "
        "sends Redis for that kind of job, batched as the drain batches them, replayed in one script; "
        "Redis's own µs per job, no network)"
    )
    print("| case | median jobs/s | ceiling's Redis µs/job | ceiling jobs/s | drain ÷ ceiling |")
    print("|---|---|---|---|---|")
    for name, _ in cases:
        if name not in CEILING:
            continue
        median, limit = statistics.median(rates[name]), limits[CEILING[name]]
        print(
            f"| {name} | {median:,.0f} | {limit['us_per_job']:.2f} | {limit['jobs_per_s']:,.0f} | "
            f"{median / limit['jobs_per_s'] * 100:.0f} % |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--cases", help="comma-separated case names (nothing kept always runs); default: all")
    args = parser.parse_args()
    if args.cases:
        unknown = set(args.cases.split(",")) - {name for name, _ in CASES}
        if unknown:
            parser.error(f"unknown cases {sorted(unknown)}; the cases: {[name for name, _ in CASES]}")
    asyncio.run(main(args.rounds, args.n, args.procs, args.cases.split(",") if args.cases else None))
