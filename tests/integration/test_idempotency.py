"""IdempotencyGuard and AsyncIdempotencyGuard on a real Redis.

Covers at-most-once start (threads, tasks and real processes racing), the
owner check of ``mark_done``, result memos, and reclaiming the key of a worker
that crashed. Every scenario runs against both APIs and both
``decode_responses`` modes through the ``api`` adapter; outcomes are checked
by reading Redis directly.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio
from tests.primitives_api import Api, expired

from fencekit.errors import (
    CanonicalizeError,
    ConfigError,
    FencedOutError,
    IdempotencyNotOwned,
    IdempotencyResultMissing,
    LockNotAcquired,
    StoreError,
)
from fencekit.primitives.canonical import idempotency_key
from fencekit.primitives.idempotency import AsyncIdempotencyGuard, IdempotencyGuard
from fencekit.primitives.lock import AsyncDistributedLock, DistributedLock
from fencekit.primitives.tokens import BeginOutcome
from fencekit.testing import RedisServer

DAY = timedelta(hours=24)
KEY = "analysis:3e292d69dea31502d95dc56e0d86f198d7f7f2b2485aac670d2190f4d8d2a14f"
IDEM = "fencekit:idem:{" + KEY + "}"
RESULT = IDEM + ":result"


async def test_try_begin_starts_a_key_at_most_once(api: Api, raw: redis.Redis) -> None:
    guard, other = api.guard(owner_id="w1"), api.guard(owner_id="w2")
    assert await api(guard.try_begin(KEY, ttl=DAY)) is True
    assert await api(guard.try_begin(KEY, ttl=DAY)) is False
    assert await api(other.try_begin(KEY, ttl=DAY)) is False
    assert raw.get(IDEM) == "pending:w1"
    assert 0 < raw.ttl(IDEM) <= 86_400


async def test_owner_id_defaults_to_a_uuid4_hex_per_guard(api: Api, raw: redis.Redis) -> None:
    first, second = api.guard(), api.guard()
    assert uuid.UUID(hex=first.owner_id).version == 4
    assert first.owner_id == uuid.UUID(hex=first.owner_id).hex
    assert first.owner_id != second.owner_id
    assert api.guard(owner_id="me").owner_id == "me"
    await api(first.try_begin(KEY, ttl=DAY))
    assert raw.get(IDEM) == f"pending:{first.owner_id}"
    with pytest.raises(ConfigError, match="owner_id"):
        api.guard(owner_id="")


@pytest.mark.parametrize(
    ("ttl", "error"),
    [
        (timedelta(milliseconds=999), ConfigError),
        (timedelta(0), ConfigError),
        (timedelta(seconds=-5), ConfigError),
        (60, TypeError),
    ],
    ids=["999ms", "zero", "negative", "int"],
)
async def test_ttls_under_one_second_are_refused(
    api: Api, raw: redis.Redis, ttl: Any, error: type[Exception]
) -> None:
    guard = api.guard()
    with pytest.raises(error, match="ttl"):
        await api(guard.try_begin(KEY, ttl=ttl))
    with pytest.raises(error, match="ttl"):
        await api(guard.try_begin_or_reclaim(KEY, lock=api.lock(), lock_resource=KEY, ttl=ttl))
    assert raw.keys("*") == []
    assert await api(guard.try_begin(KEY, ttl=DAY))
    with pytest.raises(error, match="ttl"):
        await api(guard.mark_done(KEY, ttl=ttl))
    assert raw.get(IDEM) == f"pending:{guard.owner_id}"


def redis_ms(raw: redis.Redis) -> int:
    """The Redis server's clock, whole milliseconds."""
    seconds, micros = raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_fractional_seconds_round_up(api: Api, raw: redis.Redis) -> None:
    guard = api.guard()
    before = redis_ms(raw)
    await api(guard.try_begin(KEY, ttl=timedelta(seconds=1, milliseconds=1)))
    after = redis_ms(raw)
    # 1.001 s became 2 s: the key expires 2000 ms after it was set, on the Redis clock
    assert before + 2_000 <= raw.pexpiretime(IDEM) <= after + 2_000


@pytest.mark.parametrize("key", ["", "a b", 7])
async def test_bad_keys_are_refused(api: Api, key: Any) -> None:
    with pytest.raises(ConfigError, match="idempotency key"):
        await api(api.guard().try_begin(key, ttl=DAY))


async def test_mark_done_by_the_owner_keeps_the_remaining_ttl(api: Api, raw: redis.Redis) -> None:
    guard = api.guard()
    await api(guard.try_begin(KEY, ttl=timedelta(hours=1)))
    await api(guard.mark_done(KEY))
    assert raw.get(IDEM) == "done"
    assert 0 < raw.pttl(IDEM) <= 3_600_000
    assert await api(guard.status(KEY)) == "done"
    assert await api(guard.try_begin(KEY, ttl=DAY)) is False


async def test_mark_done_with_a_ttl_restarts_the_expiry(api: Api, raw: redis.Redis) -> None:
    guard = api.guard()
    await api(guard.try_begin(KEY, ttl=timedelta(minutes=1)))
    await api(guard.mark_done(KEY, ttl=timedelta(days=7)))
    assert raw.get(IDEM) == "done"
    assert raw.pttl(IDEM) > 60_000


async def test_only_the_owner_may_mark_done(api: Api, raw: redis.Redis) -> None:
    owner, intruder = api.guard(owner_id="w1"), api.guard(owner_id="w2")
    with pytest.raises(IdempotencyNotOwned):
        await api(owner.mark_done(KEY))  # never begun
    assert not raw.exists(IDEM)

    await api(owner.try_begin(KEY, ttl=DAY))
    with pytest.raises(IdempotencyNotOwned):
        await api(intruder.mark_done(KEY, result="forged"))
    assert raw.get(IDEM) == "pending:w1"
    assert not raw.exists(RESULT)

    await api(owner.mark_done(KEY))
    with pytest.raises(IdempotencyNotOwned):
        await api(owner.mark_done(KEY))  # done already: not pending any more
    assert raw.get(IDEM) == "done"


async def test_status_walks_absent_pending_done(api: Api) -> None:
    guard = api.guard()
    assert await api(guard.status(KEY)) is None
    await api(guard.try_begin(KEY, ttl=DAY))
    assert await api(guard.status(KEY)) == "pending"
    await api(guard.mark_done(KEY))
    assert await api(guard.status(KEY)) == "done"


async def test_an_expired_pending_key_can_begin_again(api: Api, raw: redis.Redis) -> None:
    first, second = api.guard(), api.guard()
    await api(first.try_begin(KEY, ttl=timedelta(seconds=1)))
    expired(raw, IDEM)
    assert await api(first.status(KEY)) is None
    assert await api(second.try_begin(KEY, ttl=DAY)) is True
    with pytest.raises(IdempotencyNotOwned):
        await api(first.mark_done(KEY))
    assert raw.get(IDEM) == f"pending:{second.owner_id}"


async def test_clear_forgets_the_key_and_its_memo(api: Api, raw: redis.Redis) -> None:
    guard = api.guard()
    await api(guard.try_begin(KEY, ttl=DAY))
    await api(guard.mark_done(KEY, result={"ok": True}))
    await api(guard.clear(KEY))
    assert not raw.exists(IDEM)
    assert not raw.exists(RESULT)
    assert await api(guard.status(KEY)) is None
    assert await api(guard.try_begin(KEY, ttl=DAY)) is True
    await api(guard.clear("never-used"))  # clearing nothing is fine


@pytest.mark.parametrize(
    "result",
    [None, 0, "", "text", [1, 2.5, "x"], {"moves": 42, "best": "e4", "nested": {"a": [None]}}],
    ids=repr,
)
async def test_get_result_returns_the_memo(api: Api, raw: redis.Redis, result: Any) -> None:
    guard = api.guard()
    await api(guard.try_begin(KEY, ttl=timedelta(hours=1)))
    await api(guard.mark_done(KEY, result=result))
    assert await api(guard.get_result(KEY)) == result
    assert await api(api.guard().get_result(KEY)) == result  # any guard can read it
    assert 0 < raw.pttl(RESULT) <= 3_600_000


async def test_get_result_raises_when_there_is_no_memo(api: Api, raw: redis.Redis) -> None:
    guard = api.guard()
    with pytest.raises(IdempotencyResultMissing):
        await api(guard.get_result(KEY))  # absent
    await api(guard.try_begin(KEY, ttl=DAY))
    with pytest.raises(IdempotencyResultMissing):
        await api(guard.get_result(KEY))  # pending
    raw.set(RESULT, '"left over"')  # a memo that should not survive
    await api(guard.mark_done(KEY))  # no result: clears any memo
    with pytest.raises(IdempotencyResultMissing):
        await api(guard.get_result(KEY))
    assert not raw.exists(RESULT)


async def test_a_memo_without_a_json_form_changes_nothing(api: Api, raw: redis.Redis) -> None:
    guard = api.guard()
    await api(guard.try_begin(KEY, ttl=DAY))
    with pytest.raises(CanonicalizeError):
        await api(guard.mark_done(KEY, result={"when": object()}))
    with pytest.raises(CanonicalizeError):
        await api(guard.mark_done(KEY, result=float("nan")))
    assert raw.get(IDEM) == f"pending:{guard.owner_id}"
    assert not raw.exists(RESULT)


async def test_beginning_again_drops_a_memo_of_an_expired_run(api: Api, raw: redis.Redis) -> None:
    guard = api.guard()
    raw.set(RESULT, '"from an earlier run"')
    assert await api(guard.try_begin(KEY, ttl=DAY))
    assert not raw.exists(RESULT)


async def test_prefix_names_both_keys(api: Api, raw: redis.Redis) -> None:
    guard = api.guard(prefix="app")
    assert guard.prefix == "app"
    await api(guard.try_begin("k", ttl=DAY))
    await api(guard.mark_done("k", result=1))
    assert sorted(raw.keys("*")) == ["app:idem:{k}", "app:idem:{k}:result"]


# -- try_begin_or_reclaim ----------------------------------------------------------


async def test_reclaim_begins_an_absent_key(api: Api, raw: redis.Redis) -> None:
    guard, lock = api.guard(owner_id="w1"), api.lock()
    outcome = await api(guard.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY))
    assert outcome is BeginOutcome.BEGUN
    assert outcome == "begun"
    assert raw.get(IDEM) == "pending:w1"
    assert 0 < raw.ttl(IDEM) <= 86_400


async def test_reclaim_reports_done_work(api: Api, raw: redis.Redis) -> None:
    guard, lock = api.guard(), api.lock()
    await api(guard.try_begin(KEY, ttl=DAY))
    await api(guard.mark_done(KEY, result=5))
    outcome = await api(api.guard().try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY))
    assert outcome is BeginOutcome.ALREADY_DONE
    assert raw.get(IDEM) == "done"
    assert raw.get(RESULT) == "5"


async def test_reclaim_leaves_a_live_workers_key_alone(api: Api, raw: redis.Redis) -> None:
    worker, late, lock = api.guard(owner_id="w1"), api.guard(owner_id="w2"), api.lock()
    assert await api(worker.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY)) is (
        BeginOutcome.BEGUN
    )
    await api(lock.acquire(KEY, ttl=timedelta(minutes=5), owner_id="w1"))
    outcome = await api(late.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY))
    assert outcome is BeginOutcome.IN_PROGRESS
    assert raw.get(IDEM) == "pending:w1"


async def test_reclaim_treats_a_foreign_value_as_in_progress(api: Api, raw: redis.Redis) -> None:
    raw.set(IDEM, "someone else's format")
    outcome = await api(api.guard().try_begin_or_reclaim(KEY, lock=api.lock(), lock_resource=KEY, ttl=DAY))
    assert outcome is BeginOutcome.IN_PROGRESS
    assert raw.get(IDEM) == "someone else's format"


async def test_reclaim_after_a_simulated_crash(api: Api, raw: redis.Redis) -> None:
    """Worker 1 begins and takes the lock, then dies: its lease runs out, the key stays pending."""
    lock, gate = api.lock(), api.gate()
    worker1, worker2 = api.guard(owner_id="w1"), api.guard(owner_id="w2")
    target = "{" + KEY + "}:progress"

    assert (
        await api(worker1.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY))
        is BeginOutcome.BEGUN
    )
    h1 = await api(lock.acquire(KEY, ttl=timedelta(milliseconds=300), owner_id="w1"))
    await api(gate.set_if_fresh(h1.token, target, "w1: 50%"))
    # "crash": worker 1 stops; its lease expires; the pending marker remains.
    expired(raw, lock.lock_key(KEY))
    assert raw.get(IDEM) == "pending:w1"

    assert (
        await api(worker2.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY))
        is BeginOutcome.RECLAIMED
    )
    assert raw.get(IDEM) == "pending:w2"
    h2 = await api(lock.acquire(KEY, ttl=timedelta(minutes=5), owner_id="w2"))
    assert h2.token.value > h1.token.value
    await api(gate.set_if_fresh(h2.token, target, "w2: 10%"))

    # Worker 1 was only paused after all, and tries to finish: refused twice.
    with pytest.raises(FencedOutError):
        await api(gate.set_if_fresh(h1.token, target, "w1: 100%"))
    with pytest.raises(IdempotencyNotOwned):
        await api(worker1.mark_done(KEY, result="w1"))
    assert raw.get(IDEM) == "pending:w2"
    assert raw.get(target) == "w2: 10%"
    assert not raw.exists(RESULT)

    await api(worker2.mark_done(KEY, result={"by": "w2"}))
    await api(lock.release(h2))
    assert await api(worker1.get_result(KEY)) == {"by": "w2"}
    assert (
        await api(worker1.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY))
        is BeginOutcome.ALREADY_DONE
    )


async def test_reclaim_checks_the_lock_under_the_locks_own_prefix(api: Api, raw: redis.Redis) -> None:
    app_lock, default_lock = api.lock(prefix="app"), api.lock()
    await api(api.guard().try_begin(KEY, ttl=DAY))
    await api(app_lock.acquire("job-1", ttl=timedelta(minutes=5)))
    late = api.guard(owner_id="late")
    assert (
        await api(late.try_begin_or_reclaim(KEY, lock=app_lock, lock_resource="job-1", ttl=DAY))
        is BeginOutcome.IN_PROGRESS
    )
    assert (
        await api(late.try_begin_or_reclaim(KEY, lock=default_lock, lock_resource="job-1", ttl=DAY))
        is BeginOutcome.RECLAIMED
    )
    assert raw.get(IDEM) == "pending:late"


async def test_reclaim_refuses_a_lock_of_the_wrong_kind(api: Api, raw: redis.Redis) -> None:
    other_kind = redis.Redis() if api.is_async else redis.asyncio.Redis()
    wrong = (DistributedLock if api.is_async else AsyncDistributedLock)(other_kind)
    guard = api.guard()
    for bad in (wrong, object(), None):
        with pytest.raises(TypeError, match="lock must be"):
            await api(guard.try_begin_or_reclaim(KEY, lock=bad, lock_resource=KEY, ttl=DAY))
    assert raw.keys("*") == []
    await api(other_kind.aclose() if not api.is_async else other_kind.close())


# -- races -------------------------------------------------------------------------


async def test_n_concurrent_try_begins_exactly_one_wins(api: Api, raw: redis.Redis) -> None:
    n = 16
    results = await api.race(n, lambda client: api.guard(client).try_begin(KEY, ttl=DAY))
    assert results.count(True) == 1, results
    assert results.count(False) == n - 1, results
    assert raw.get(IDEM).startswith("pending:")


async def race_reclaims(api: Api, n: int) -> list[Any]:
    """n guards reclaim a dead worker's pending key at once: [(guard, outcome), ...]."""

    def contender(client: Any) -> Any:
        guard = api.guard(client)
        outcome = guard.try_begin_or_reclaim(KEY, lock=api.lock(client), lock_resource=KEY, ttl=DAY)
        if api.is_async:

            async def paired() -> tuple[Any, Any]:
                return guard, await outcome

            return paired()
        return guard, outcome

    return await api.race(n, contender)


async def test_n_concurrent_reclaims_leave_exactly_one_owner(api: Api, raw: redis.Redis) -> None:
    raw.set(IDEM, "pending:dead-worker", ex=3600)
    n = 12
    raced = await race_reclaims(api, n)
    outcomes = {outcome for _, outcome in raced}
    assert outcomes <= {BeginOutcome.RECLAIMED, BeginOutcome.IN_PROGRESS}, raced
    owners = [g for g, _ in raced if raw.get(IDEM) == f"pending:{g.owner_id}"]
    assert len(owners) == 1
    done = 0
    for guard, _ in raced:
        try:
            await api(guard.mark_done(KEY, result=guard.owner_id))
            done += 1
        except IdempotencyNotOwned:
            pass
    assert done == 1
    assert await api(api.guard().get_result(KEY)) == owners[0].owner_id


async def test_begin_reserves_the_lock_for_its_owner_only(api: Api, raw: redis.Redis) -> None:
    """Between begin and acquire, nobody can reclaim the fresh key nor take its lock."""
    worker, late, lock = api.guard(owner_id="w1"), api.guard(owner_id="w2"), api.lock()
    outcome = await api(worker.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY))
    assert outcome is BeginOutcome.BEGUN
    assert await api(late.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY)) is (
        BeginOutcome.IN_PROGRESS
    )
    with pytest.raises(LockNotAcquired):
        await api(lock.acquire(KEY, ttl=timedelta(minutes=5), owner_id="w2"))
    handle = await api(lock.acquire(KEY, ttl=timedelta(minutes=5), owner_id="w1"))
    assert handle.token.value > 0
    assert raw.get(IDEM) == "pending:w1"


async def test_n_concurrent_reclaims_exactly_one_takes_over(api: Api, raw: redis.Redis) -> None:
    raw.set(IDEM, "pending:dead-worker", ex=3600)
    n = 12
    outcomes = [outcome for _, outcome in await race_reclaims(api, n)]
    assert outcomes.count(BeginOutcome.RECLAIMED) == 1, outcomes
    assert outcomes.count(BeginOutcome.IN_PROGRESS) == n - 1, outcomes


def _process_begin(url: str, decode: bool, is_async: bool, start: Any, results: Any) -> None:
    """One spawned process: its own client and guard, wait at the barrier, begin once."""
    key = idempotency_key({"game_ids": ["abc", "def"], "engine": "sf16"}, namespace="analysis")

    async def attempt_async() -> str:
        client = redis.asyncio.Redis.from_url(url, decode_responses=decode)
        try:
            guard = AsyncIdempotencyGuard(client)
            await client.ping()
            start.wait(120)
            won = await guard.try_begin(key, ttl=DAY)
            return f"won {guard.owner_id}" if won else "lost"
        finally:
            await client.aclose()

    def attempt_sync() -> str:
        client = redis.Redis.from_url(url, decode_responses=decode)
        try:
            guard = IdempotencyGuard(client)
            client.ping()
            start.wait(120)
            return f"won {guard.owner_id}" if guard.try_begin(key, ttl=DAY) else "lost"
        finally:
            client.close()

    try:
        results.put(asyncio.run(attempt_async()) if is_async else attempt_sync())
    except Exception as exc:
        results.put(f"error {exc!r}")


async def test_n_processes_racing_try_begin_exactly_one_wins(api: Api, raw: redis.Redis) -> None:
    n = 6
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(n + 1)
    results = ctx.Queue()
    args = (api.url, api.decode, api.is_async, start, results)
    procs = [ctx.Process(target=_process_begin, args=args) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        start.wait(120)  # every contender is connected and waiting: go
        outcomes = [results.get(timeout=60) for _ in range(n)]
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
        results.join_thread()
    assert all(proc.exitcode == 0 for proc in procs)
    wins = [o for o in outcomes if o.startswith("won ")]
    assert len(wins) == 1, outcomes
    assert outcomes.count("lost") == n - 1, outcomes
    assert raw.get(IDEM) == "pending:" + wins[0].removeprefix("won ")


async def test_redis_errors_surface_as_store_error(api: Api, private_redis: RedisServer) -> None:
    client = api.connect(private_redis.url())
    guard, lock = api.guard(client), api.lock(client)
    await api(guard.try_begin(KEY, ttl=DAY))
    private_redis.kill()
    calls: list[Callable[[], Any]] = [
        lambda: guard.try_begin("other", ttl=DAY),
        lambda: guard.mark_done(KEY, result=1),
        lambda: guard.status(KEY),
        lambda: guard.clear(KEY),
        lambda: guard.get_result(KEY),
        lambda: guard.try_begin_or_reclaim(KEY, lock=lock, lock_resource=KEY, ttl=DAY),
    ]
    for call in calls:
        with pytest.raises(StoreError):
            await api(call())


async def test_the_wrong_kind_of_client_is_refused(api: Api) -> None:
    other = redis.Redis() if api.is_async else redis.asyncio.Redis()
    cls = AsyncIdempotencyGuard if api.is_async else IdempotencyGuard
    with pytest.raises(TypeError, match="client"):
        cls(other)
    await api(other.aclose() if not api.is_async else other.close())
