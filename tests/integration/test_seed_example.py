"""The fencekit 0.1.0 README's 30-second example, run unchanged against fencekit.

The code below is the seed's example verbatim; only the Redis URL is replaced
by the test server's URL before it runs. Its effects are then checked by
reading Redis directly.
"""

from __future__ import annotations

from typing import Any

import redis

SEED_URL = "redis://localhost:6379/0"

EXAMPLE = """
from datetime import timedelta
from redis import Redis

from fencekit import (
    DistributedLock,
    FenceGate,
    IdempotencyGuard,
    idempotency_key,
)

r = Redis.from_url("redis://localhost:6379/0", decode_responses=True)
guard = IdempotencyGuard(r)
lock = DistributedLock(r)
fence = FenceGate(r)

def analyze_batch() -> None:
    key = idempotency_key(
        {"game_ids": ["abc", "def"], "engine": "sf16"},
        namespace="analysis",
    )
    if not guard.try_begin(key, ttl=timedelta(hours=24)):
        return  # already started or completed

    handle = lock.acquire("analysis:batch-42", ttl=timedelta(minutes=5))
    try:
        # Atomic fence check + Redis progress write:
        fence.set_if_fresh(handle.token, "analysis:batch-42:status", "running")
        # Extend the lock on heartbeats and fence every durable write.
        guard.mark_done(key)
    finally:
        lock.release(handle)
"""

# idempotency_key of the example's payload, as the published fencekit computes it
# (see tests/unit/test_canonical.py).
KEY = "analysis:3e292d69dea31502d95dc56e0d86f198d7f7f2b2485aac670d2190f4d8d2a14f"


def run_example(url: str) -> dict[str, Any]:
    assert EXAMPLE.count(SEED_URL) == 1
    namespace: dict[str, Any] = {"__name__": "seed_example"}
    exec(compile(EXAMPLE.replace(SEED_URL, url), "<seed example>", "exec"), namespace)
    return namespace


def test_the_seed_example_runs_unchanged_and_does_its_work_once(redis_url: str) -> None:
    example = run_example(redis_url)
    with redis.Redis.from_url(redis_url, decode_responses=True) as raw:
        example["analyze_batch"]()

        assert raw.get("fencekit:idem:{" + KEY + "}") == "done"
        assert 0 < raw.ttl("fencekit:idem:{" + KEY + "}") <= 24 * 3600
        assert raw.get("analysis:batch-42:status") == "running"
        token = int(raw.get("fencekit:fence:{analysis:batch-42}") or 0)
        assert token >= 1
        assert raw.get("fencekit:lock:{analysis:batch-42}:seq") == str(token)
        assert not raw.exists("fencekit:lock:{analysis:batch-42}")  # released

        # A second delivery of the same job returns at once: no new grant, no write.
        raw.set("analysis:batch-42:status", "finished")
        example["analyze_batch"]()
        assert raw.get("analysis:batch-42:status") == "finished"
        assert raw.get("fencekit:lock:{analysis:batch-42}:seq") == str(token)
        assert raw.get("fencekit:fence:{analysis:batch-42}") == str(token)
    example["r"].close()


def test_a_redelivery_while_the_first_run_is_pending_does_nothing(redis_url: str) -> None:
    first = run_example(redis_url)
    assert first["guard"].try_begin(KEY, ttl=first["timedelta"](hours=1))  # run 1 in progress
    second = run_example(redis_url)
    second["analyze_batch"]()
    with redis.Redis.from_url(redis_url, decode_responses=True) as raw:
        assert raw.get("fencekit:idem:{" + KEY + "}") == f"pending:{first['guard'].owner_id}"
        assert not raw.exists("analysis:batch-42:status")
        assert not raw.exists("fencekit:lock:{analysis:batch-42}:seq")
    first["r"].close()
    second["r"].close()
