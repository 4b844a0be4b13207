"""Concurrent enqueues on one Client share round trips and script calls, each keeping its own outcome.

Counted on a real Redis with ``INFO commandstats``: how many script calls
the enqueues of 64 concurrent callers took.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.errors import PayloadError, StoreError

KEYS = KeySpace("fencekit")


def script_calls(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval"))


async def test_64_concurrent_enqueues_share_script_calls_and_get_their_own_jids(
    redis_url: str, r: redis.Redis
) -> None:
    async with Client(redis_url, keep_result=0) as client:
        await client.enqueue(Task("batched", "op", {"warm": True}))  # registers the queue
        r.config_resetstat()
        jids = await asyncio.gather(*(client.enqueue(Task("batched", "op", {"i": i})) for i in range(64)))
        calls = script_calls(r)
    assert len(set(jids)) == 64
    pending = list(r.lrange(KEYS.queue("batched").pending, 0, -1))
    assert len(pending) == 65
    for jid in jids:  # each caller's jid names its own task
        assert any(jid.encode() in raw for raw in pending)
    # the first is sent alone; the other 63 were made while it was in flight: one call
    assert calls <= 3, calls


async def test_a_bad_task_fails_its_own_caller_only(redis_url: str, r: redis.Redis) -> None:
    async with Client(redis_url, keep_result=0) as client:
        results = await asyncio.gather(
            client.enqueue(Task("mixed", "op", {"ok": 1})),
            client.enqueue(Task("mixed", "op", {"bad": object()})),  # type: ignore[dict-item]
            client.enqueue(Task("mixed", "op", {"ok": 2})),
            return_exceptions=True,
        )
    assert isinstance(results[1], PayloadError)
    assert all(isinstance(x, str) for x in (results[0], results[2]))
    assert r.llen(KEYS.queue("mixed").pending) == 2


async def test_a_failing_call_fails_the_callers_it_carried_and_no_others(
    redis_url: str, r: redis.Redis
) -> None:
    async with Client(redis_url, keep_result=0) as client:
        await client.enqueue_many([Task("good", "op"), Task("broken", "op")])
        r.delete(KEYS.queue("broken").pending)
        r.set(KEYS.queue("broken").pending, "not a list")  # LPUSH there is a WRONGTYPE error
        blocker = asyncio.ensure_future(client.enqueue(Task("good", "op", {"first": True})))
        await asyncio.sleep(0)  # in flight: the next ones batch
        results = await asyncio.gather(
            *(client.enqueue(Task("broken" if i % 2 else "good", "op", {"i": i})) for i in range(10)),
            return_exceptions=True,
        )
        await blocker
    assert [isinstance(x, StoreError) for x in results] == [i % 2 == 1 for i in range(10)]
    assert all("WRONGTYPE" in str(x) for x in results if isinstance(x, BaseException))
    assert r.llen(KEYS.queue("good").pending) == 1 + 1 + 5


async def test_a_cancelled_caller_leaves_the_others_their_outcomes(redis_url: str, r: redis.Redis) -> None:
    async with Client(redis_url, keep_result=0) as client:
        await client.enqueue(Task("cancel-batch", "op"))
        first = asyncio.ensure_future(client.enqueue(Task("cancel-batch", "op")))
        await asyncio.sleep(0)
        others = [
            asyncio.ensure_future(client.enqueue(Task("cancel-batch", "op", {"i": i}))) for i in range(5)
        ]
        await asyncio.sleep(0)
        others[2].cancel()
        done = await asyncio.gather(first, *others, return_exceptions=True)
    assert isinstance(done[3], asyncio.CancelledError)
    assert all(isinstance(x, str) for i, x in enumerate(done) if i != 3)
    # a cancelled caller's task may have been sent: 6 or 7, never fewer
    assert r.llen(KEYS.queue("cancel-batch").pending) in (6, 7)


async def test_delays_and_at_once_tasks_of_one_batch_keep_their_own_delay(
    redis_url: str, r: redis.Redis
) -> None:
    async with Client(redis_url, keep_result=0) as client:
        first = asyncio.ensure_future(client.enqueue(Task("delays", "op")))
        await asyncio.sleep(0)
        await asyncio.gather(
            client.enqueue(Task("delays", "op", {"now": 1})),
            client.enqueue(Task("delays", "op", {"later": 1}), delay=3600),
            client.enqueue(Task("delays", "op", {"now": 2})),
        )
        await first
    qk = KEYS.queue("delays")
    assert r.llen(qk.pending) == 3
    assert r.zcard(qk.scheduled) == 1


@pytest.mark.parametrize("n", [1, 500])
async def test_enqueue_many_through_the_batcher_keeps_its_order(
    redis_url: str, r: redis.Redis, n: int
) -> None:
    async with Client(redis_url, keep_result=0) as client:
        jids = await client.enqueue_many([Task("order", "op", {"i": i}) for i in range(n)])
    assert len(jids) == n
    oldest_first = list(reversed(r.lrange(KEYS.queue("order").pending, 0, -1)))
    assert [jid.encode() in raw for jid, raw in zip(jids, oldest_first, strict=True)] == [True] * n
