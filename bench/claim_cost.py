"""Redis CPU per ``ack_claim.lua`` call, this checkout against another: ``python -m bench.claim_cost OTHER``.

Options: ``[--k 16] [--calls 20000] [--rounds 5]``. One private Redis loads
both checkouts' ``ack_claim.lua`` (includes expanded); each round, alternately,
fills a plain pending list and runs ``--calls`` acknowledge-K-claim-K calls,
reading ``usec_per_call`` of ``INFO commandstats`` (the server's own time in the
script, so the client's and the machine's noise mostly stay out). Prints every
figure, the medians and their ratio. What the default path of a change to the
claim script costs Redis, to the tenth of a microsecond.

``python -m bench.claim_cost --flow [--k 16] [--calls 10000] [--rounds 3]``: this
checkout's claim script per claimed task, by kind of task, side by side in one
run. Each round and case, on one private Redis emptied first, a ``Client``
enqueues K x calls tasks (``enqueue_many``, the real push path) -- plain, with
priorities 0, 3, -2, with ``fair_key`` over 1, 100 and 10,000 keys in turn,
and for a worker with a ``rate_limit`` of 1000000/s (the spec a consumer sends:
the bucket never binds) without and with ``rate_key`` over 100 keys -- then the
acknowledge-K-claim-K calls run until the queue is empty. ``INFO commandstats``
(reset before each phase): Redis µs per task enqueued (``EVALSHA`` of the enqueue
script), Redis µs per task claimed and acknowledged (``EVALSHA`` of ``ack_claim.lua``
over the tasks it claimed) and tasks per call; the medians and their ratios to
``plain``. A claim that cost more per task with more keys would show here.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.common import ratio_table
from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.testing import RedisServer

LUA = Path("src/fencekit/_redis/lua")
ENVELOPE = (
    b'{"jid":"0193aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee","queue":"bench","operation":"noop",'
    b'"params":{"i":1},"attempt":0,"enqueued_at":1764480000123}'
)
KEYS = ["P:{bench}:pending", "P:{bench}:inflight:c", "P:{bench}:token", "P:{bench}:stats", "P:{bench}:wake"]


def expand(root: Path, name: str) -> str:
    source = (root / name).read_text()
    return re.sub(r"^--!include (\S+)\s*$", lambda m: expand(root, m.group(1)), source, flags=re.MULTILINE)


def one_round(r: redis.Redis, sha: str, k: int, calls: int) -> float:
    r.delete(*KEYS)
    for _ in range(calls * k // 10_000 + 1):
        r.lpush(KEYS[0], *([ENVELOPE] * 10_000))
    r.config_resetstat()
    acks: list[int] = []
    for _ in range(calls):
        reply = r.evalsha(sha, len(KEYS), *KEYS, k, len(acks), *acks)
        acks = [int(reply[1]) + j for j in range(len(reply) - 3)]
    return float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])


# --flow: the kinds of task, each (label, Task options by index i, rate-limited claim spec or not)
FLOW_CASES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("plain", {}, False),
    ("priorities", {"priorities": [0, 3, -2]}, False),
    ("fair 1 key", {"fair_keys": 1}, False),
    ("fair 100 keys", {"fair_keys": 100}, False),
    ("fair 10,000 keys", {"fair_keys": 10_000}, False),
    ("rate limit", {}, True),
    ("rate key (100)", {"rate_keys": 100}, True),
)


def _task(i: int, priorities: list[int] | None = None, fair_keys: int = 0, rate_keys: int = 0) -> Task:
    return Task(
        "bench",
        "noop",
        {"i": i},
        priority=priorities[i % len(priorities)] if priorities else 0,
        fair_key=f"t{i % fair_keys}" if fair_keys else None,
        rate_key=f"r{i % rate_keys}" if rate_keys else None,
    )


async def _enqueue(url: str, n: int, options: dict[str, Any]) -> None:
    client = Client(url, keep_result=0)
    try:
        for start in range(0, n, 10_000):
            await client.enqueue_many([_task(i, **options) for i in range(start, min(n, start + 10_000))])
    finally:
        await client.close()


def _script_usec(r: redis.Redis) -> tuple[float, int]:
    stat = r.info("commandstats").get("cmdstat_evalsha", {})
    return float(stat.get("usec", 0)), int(stat.get("calls", 0))


def flow_round(
    r: redis.Redis, url: str, sha: str, k: int, calls: int, options: dict[str, Any], rated: bool
) -> tuple[float, float, float, int]:
    """One case: (Redis µs per task enqueued, µs per task claimed, tasks per call, calls)."""
    qk = KeySpace("fencekit").queue("bench")
    keys = [qk.pending, qk.inflight("bench-claim"), qk.token_counter, qk.stats, qk.wake]
    n = k * calls
    r.flushall()
    r.config_resetstat()
    asyncio.run(_enqueue(url, n, options))
    enqueue_usec, _ = _script_usec(r)
    spec = orjson.dumps({"p": qk.rate_prefix(), "r": [["noop", 1_000_000.0, 100_000]]}).decode()
    want = f"{k} {spec}" if rated else k
    r.config_resetstat()
    acks: list[int] = []
    claimed = 0
    while True:
        reply = r.evalsha(sha, len(keys), *keys, want, len(acks), *acks)
        envelopes = len(reply) - (4 if rated else 3)
        if envelopes <= 0:
            break
        claimed += envelopes
        acks = [int(reply[1]) + j for j in range(envelopes)]
    usec, made = _script_usec(r)  # the last call claimed nothing and acknowledged the last tasks
    if claimed != n:
        raise RuntimeError(f"{options}: claimed {claimed} of {n}")
    return enqueue_usec / n, usec / n, n / made, made


def flow_main(k: int, calls: int, rounds: int) -> None:
    root = Path(__file__).resolve().parent.parent / LUA
    figures: dict[str, list[tuple[float, float, float, int]]] = {label: [] for label, _, _ in FLOW_CASES}
    width = max(len(label) for label in figures)
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url())
        source = expand(root, "ack_claim.lua")
        for round_no in range(rounds):
            for label, options, rated in FLOW_CASES:
                sha = str(r.script_load(source))  # FLUSHALL keeps scripts; loaded again all the same
                got = flow_round(r, server.url(), sha, k, calls, options, rated)
                figures[label].append(got)
                print(
                    f"round {round_no + 1}: {label:{width}} enqueue {got[0]:5.2f} µs/task,"
                    f" claim+ack {got[1]:5.2f} µs/task ({got[2]:.1f} tasks a call)",
                    flush=True,
                )
    print(f"\nRedis µs per task, medians of {rounds} rounds, {k * calls:,} tasks a case, claims of K = {k}:")
    ratio_table(
        {label: [(v[0], v[1]) for v in values] for label, values in figures.items()},
        ["enqueue µs/task", "claim+ack µs/task"],
    )
    for label, values in figures.items():
        print(f"{label}: {statistics.median(v[2] for v in values):.1f} tasks a claim call")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_cost", description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, nargs="?", help="the other checkout (not with --flow)")
    parser.add_argument("--flow", action="store_true", help="this checkout's claim per task, by kind of task")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--calls", type=int, default=None, help="20000 (--flow: 10000)")
    parser.add_argument("--rounds", type=int, default=None, help="5 (--flow: 3)")
    args = parser.parse_args()
    if args.flow:
        flow_main(args.k, args.calls or 10_000, args.rounds or 3)
        return
    if args.other is None:
        parser.error("give the other checkout, or --flow")
    args.calls = args.calls or 20_000
    args.rounds = args.rounds or 5
    roots = {"other": args.other / LUA, "this": Path(__file__).resolve().parent.parent / LUA}
    figures: dict[str, list[float]] = {name: [] for name in roots}
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url())
        shas = {name: str(r.script_load(expand(root, "ack_claim.lua"))) for name, root in roots.items()}
        for _ in range(args.rounds):
            for name, sha in shas.items():
                figures[name].append(one_round(r, sha, args.k, args.calls))
    for name, values in figures.items():
        shown = " / ".join(f"{v:.2f}" for v in values)
        print(f"K={args.k} {name:5}: {shown} µs per call, median {statistics.median(values):.2f}")
    ratio = statistics.median(figures["this"]) / statistics.median(figures["other"])
    print(f"this ÷ other: x{ratio:.3f}")


if __name__ == "__main__":
    main()
