# ruff: noqa: E501
"""What a one-round-trip idle claim would save: ``python -m bench.idle_claim [--n 2000]``.

An idle consumer today (``queue.waker``): ``BLPOP`` on the wake lists returns
on the wake connection, then the consumer runs ``ack_claim.lua`` on its hot
connection -- two round trips after the enqueue. The alternative measured
here pipelines the claim behind the ``BLPOP`` on the wake connection: Redis
runs a blocked client's next command as soon as the ``BLPOP`` unblocks, so
the claimed envelope comes back in the same round trip.

Both run the real ``enqueue.lua`` and ``ack_claim.lua`` over lean connections
on a private Redis; a producer enqueues one task every 2 ms and the figure
is enqueue sent -> claimed envelope in hand, in µs (p50 / p99). Nothing is
started or acknowledged: this isolates the round trips from the consumer's
event-loop hops. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.common import percentile
from fencekit._redis import scripts
from fencekit._redis.hotpath import LeanConnection
from fencekit._redis.keys import KeySpace
from fencekit.testing import RedisServer

KEYS = KeySpace("fencekit")
QUEUE = "idle"


def claim_call(consumer: str) -> scripts.Call:
    qk = KEYS.queue(QUEUE)
    return scripts.ack_claim(
        pending=qk.pending,
        inflight=qk.inflight(consumer),
        token_counter=qk.token_counter,
        stats=qk.stats,
        wake=qk.wake,
        want=16,
        acks=(),
    )


def enqueue_call(envelope: bytes) -> scripts.Call:
    qk = KEYS.queue(QUEUE)
    return scripts.enqueue(
        pending=qk.pending,
        scheduled=qk.scheduled,
        stats=qk.stats,
        wake=qk.wake,
        delay_ms=0,
        envelopes=[envelope],
    )


async def two_round_trips(url: str, sent: dict[int, float], n: int) -> list[float]:
    """Today's shape: BLPOP on the wake connection, then ack_claim on the hot one."""
    wake, hot = await LeanConnection.open(url), await LeanConnection.open(url)
    out: list[float] = []
    try:
        while len(out) < n:
            if await wake.execute("BLPOP", KEYS.queue(QUEUE).wake, 1, timeout=6) is None:
                continue
            reply = await hot.call(claim_call("c2"))
            got = time.perf_counter()
            out += [(got - sent[int(env[7:])]) * 1e6 for env in reply[3:]]
    finally:
        await wake.aclose()
        await hot.aclose()
    return out


async def one_round_trip(url: str, sent: dict[int, float], n: int) -> list[float]:
    """The alternative: ack_claim pipelined behind the BLPOP on one connection."""
    conn = await LeanConnection.open(url)
    out: list[float] = []
    try:
        while len(out) < n:
            blpop = asyncio.ensure_future(conn.execute("BLPOP", KEYS.queue(QUEUE).wake, 1, timeout=6))
            claim = asyncio.ensure_future(conn.call(claim_call("c1")))
            await blpop
            reply = await claim
            got = time.perf_counter()
            out += [(got - sent[int(env[7:])]) * 1e6 for env in reply[3:]]
    finally:
        await conn.aclose()
    return out


async def measure(url: str, design: str, n: int, gap: float) -> list[float]:
    producer = await LeanConnection.open(url)
    sent: dict[int, float] = {}
    waiter = two_round_trips if design == "two" else one_round_trip
    consumer = asyncio.ensure_future(waiter(url, sent, n))
    await asyncio.sleep(0.2)  # the consumer is blocked in BLPOP
    try:
        for i in range(n):
            envelope = b"bench: " + str(i).encode()
            sent[i] = time.perf_counter()
            await producer.call(enqueue_call(envelope))
            await asyncio.sleep(gap)
        return await asyncio.wait_for(consumer, 30)
    finally:
        consumer.cancel()
        await producer.aclose()


async def amain(n: int, gap: float, rounds: int) -> str:
    rows: dict[str, list[float]] = {"two": [], "one": []}
    with RedisServer() as srv:
        for _ in range(rounds):
            for design in ("two", "one"):
                rows[design] += await measure(srv.url(), design, n, gap)
    lines = [
        f"enqueue sent -> claimed envelope in hand, {n} x {rounds} tasks {gap * 1000:g} ms apart (µs)",
        "",
        "| idle claim | p50 | p99 | max |",
        "|---|---|---|---|",
    ]
    names = {
        "two": "BLPOP, then ack_claim on the hot connection (today)",
        "one": "ack_claim pipelined behind the BLPOP",
    }
    for design, values in rows.items():
        lines.append(
            f"| {names[design]} | {percentile(values, 0.5):.0f} | {percentile(values, 0.99):.0f} | {max(values):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.idle_claim", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--gap", type=float, default=0.002)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    print(asyncio.run(amain(args.n, args.gap, args.rounds)))


if __name__ == "__main__":
    main()
