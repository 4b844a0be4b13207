"""The claim/ack loop over the lean connection vs over redis-py, at K = 1, 16, 128.

One "turn" is what a consumer does per round trip: acknowledge the K tasks of
the previous turn and claim K more, in one ``ack_claim.lua`` call. The same
script, keys and arguments run over :class:`fencekit._redis.hotpath.LeanConnection`
(Cython RESP encoder + hiredis parser) and over :class:`fencekit._redis.link.RedisPyLink`
(redis-py's asyncio client), on uvloop, against a private Redis. The figure
to read is the time per task (``ops`` x K per second); the ratio table at the
end compares the two links per K. No thresholds: this measures, it asserts
nothing about speed.

    python -m pytest bench/bench_hotpath.py --benchmark-only
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit._redis.link import Link, open_link
from fencekit._redis.url import parse_url
from fencekit.jobs import codec
from fencekit.testing import RedisServer

TURNS = 200
KS = (1, 16, 128)
LINKS = ("lean", "redis-py")
RESULTS: dict[tuple[str, int], float] = {}


class Loop:
    """A consumer's hot path reduced to its round trips."""

    def __init__(self, link: Link, k: int) -> None:
        self.link = link
        self.k = k
        keys = KeySpace("bench")
        self.qk = keys.queue("hot")
        self.inflight = self.qk.inflight("bench-consumer")
        self.acks: list[int] = []

    async def turns(self, n: int) -> int:
        claimed = 0
        for _ in range(n):
            reply = await self.link.call(
                scripts.ack_claim(
                    pending=self.qk.pending,
                    inflight=self.inflight,
                    token_counter=self.qk.token_counter,
                    stats=self.qk.stats,
                    wake=self.qk.wake,
                    want=self.k,
                    acks=self.acks,
                )
            )
            _, first, _, *envelopes = reply
            first = int(first)
            for raw in envelopes:
                codec.decode(raw)  # what the consumer does with each claimed task
            self.acks = [first + i for i in range(len(envelopes))]
            claimed += len(envelopes)
        return claimed


def _fill(server: RedisServer, n: int) -> None:
    client = server.client()
    client.flushall()
    envelope = codec.encode("0" * 36, "hot", "noop", {"n": 1}, 0, 0)
    pipe = client.pipeline(transaction=False)
    for start in range(0, n, 10_000):
        pipe.lpush("bench:{hot}:pending", *([envelope] * min(10_000, n - start)))
    pipe.execute()
    client.close()


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("kind", LINKS)
def test_claim_ack_loop(
    benchmark: Any, server: RedisServer, loop: asyncio.AbstractEventLoop, kind: str, k: int
):
    benchmark.group = f"claim+ack loop K={k} ({TURNS} turns)"
    benchmark.extra_info["tasks_per_round"] = TURNS * k
    link = loop.run_until_complete(open_link(parse_url(server.url()), kind=kind))
    hot = Loop(link, k)
    try:
        benchmark.pedantic(
            lambda: loop.run_until_complete(hot.turns(TURNS)),
            setup=lambda: _fill(server, TURNS * k + k),
            rounds=5,
            iterations=1,
        )
    finally:
        loop.run_until_complete(link.aclose())
    RESULTS[(kind, k)] = benchmark.stats.stats.median / (TURNS * k)


def test_print_ratios() -> None:
    """Per-task cost of each link and the lean/redis-py ratio (run after the cases above)."""
    if not RESULTS:
        pytest.skip("run with the benchmark cases")
    print("\nclaim+ack loop, median time per task")
    print(f"{'K':>5} {'lean µs':>10} {'redis-py µs':>12} {'speed-up':>9}")
    for k in KS:
        lean, rpy = RESULTS.get(("lean", k)), RESULTS.get(("redis-py", k))
        if lean and rpy:
            print(f"{k:>5} {lean * 1e6:>10.2f} {rpy * 1e6:>12.2f} {rpy / lean:>8.2f}x")
