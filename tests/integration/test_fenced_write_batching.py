"""Fenced writes made while one is in flight share one script call; each keeps its own outcome.

On a real Redis, through the consumer's write path (``fencekit.consume.job.fenced_writes``
over a lean connection): deliveries still in flight are written, those no
longer in flight or older than their fence are refused, each on its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis

from fencekit._redis.hotpath import LeanConnection
from fencekit.consume.job import fenced_writes
from fencekit.errors import FencedOutError


def script_calls(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_concurrent_fenced_writes_share_a_call_and_each_gets_its_own_outcome(
    redis_url: str, r: redis.Redis
) -> None:
    inflight = "fencekit:{wq}:inflight:c1"
    current = [t for t in range(1, 41) if t % 4]  # tokens 4, 8, ... are no longer in flight
    r.hset(inflight, mapping={str(t): b"envelope" for t in current})
    r.set("fencekit:fence:{wq}:job:j7", 100)  # write 7's delivery is older than its job's fence
    conn = await LeanConnection.open(redis_url)
    try:
        writes = fenced_writes(conn.call)
        warm = [writes.submit((inflight, "fencekit:fence:{wq}:job:j1", "out:1", 1, "v1")) for _ in range(3)]
        await asyncio.gather(*warm)  # loads job_set (the first alone) and job_set_many (the other two)
        r.config_resetstat()

        async def one(t: int) -> str:
            try:
                await writes.submit((inflight, f"fencekit:fence:{{wq}}:job:j{t}", f"out:{t}", t, f"v{t}"))
            except FencedOutError as exc:
                return f"refused: {exc}"
            return "written"

        first = asyncio.ensure_future(one(2))
        await asyncio.sleep(0)  # in flight alone: the 38 others batch behind it
        outcomes = dict(zip(range(3, 41), await asyncio.gather(*(one(t) for t in range(3, 41))), strict=True))
        outcomes[2] = await first
        calls = script_calls(r)
    finally:
        await conn.aclose()
    for t, outcome in outcomes.items():
        if t % 4 == 0:
            assert outcome.startswith("refused"), (t, outcome)
            assert "no longer in flight" in outcome
            assert r.get(f"out:{t}") is None
        elif t == 7:
            assert outcome.startswith("refused")
            assert "older than 100" in outcome
            assert r.get("out:7") is None
        else:
            assert outcome == "written", (t, outcome)
            assert r.get(f"out:{t}") == f"v{t}".encode()
    assert calls == 2, calls  # write 2 alone, then the other 38 in one job_set_many


async def test_a_lost_connection_fails_every_write_of_the_batch(redis_url: str, r: redis.Redis) -> None:
    inflight = "fencekit:{wq2}:inflight:c1"
    r.hset(inflight, mapping={str(t): b"e" for t in range(1, 6)})
    conn = await LeanConnection.open(redis_url)
    writes = fenced_writes(conn.call)
    first = asyncio.ensure_future(writes.submit((inflight, "fencekit:fence:{wq2}:job:a", "o:a", 1, "x")))
    await asyncio.sleep(0)
    rest = [
        asyncio.ensure_future(writes.submit((inflight, f"fencekit:fence:{{wq2}}:job:{t}", f"o:{t}", t, "x")))
        for t in range(2, 6)
    ]
    conn.close()  # before the replies: every caller is told, none hangs
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    # the first was written (it may have run); the others waited for the next write (never sent)
    assert type(results[0]).__name__ == "StoreError", results
    assert all(type(x).__name__ == "NotSent" for x in results[1:]), results
