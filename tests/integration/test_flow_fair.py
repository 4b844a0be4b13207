"""Fair share between keys and per-key rate limits, on a real Redis (one server, or a cluster
under ``FENCEKIT_TEST_TOPOLOGY=cluster``): the claim script itself, called as a consumer calls it.

``Task(fair_key=...)``: claims take the keys with work in turn (the queue's tasks without a
key take their turn as one more key), FIFO within a key, weighted by the claiming worker's
``fair_weights``, priority first; a key with no work costs nothing. ``Task(rate_key=...)``:
each key of a rate-limited operation has its own bucket and parks on its own.
The two-pool scenarios (the small key's 20 before 200 of the big key's; Jain's index under a
100:1 skew; 5/s per key over 10 keys) are in test_flow_fair_pools.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from tests.queue_helpers import qkey, worker

from fencekit import Client, ConfigError, PayloadError, Task
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit.jobs import codec
from fencekit.jobs.flow import flow_specs
from fencekit.jobs.worker import inspect_worker
from fencekit.services.backlog import read_backlog
from fencekit.testing import RedisServer

QK = KeySpace().queue("fair")


async def _noop(payload: dict[str, Any]) -> None:
    return None


def spec_of(**attrs: Any) -> str:
    """The claim spec a consumer of queue "fair" sends for a worker with ``attrs``."""
    return flow_specs([inspect_worker(worker("fair", "do", _noop, **attrs))], {"fair": QK}).get("fair", "")


async def claim(url: str, want: int, flow: str = "", consumer: str = "c1") -> list[dict[str, Any]]:
    """One claim of up to ``want`` tasks, as a consumer makes it; the claimed tasks' params."""
    ar = async_client(url)
    try:
        reply = await arun(
            ar,
            scripts.ack_claim(
                pending=QK.pending, inflight=QK.inflight(consumer), token_counter=QK.token_counter,
                stats=QK.stats, wake=QK.wake, want=want, acks=[], flow=flow,
            ),
        )  # fmt: skip
    finally:
        await aclose_client(ar)
    envelopes = reply[4:] if flow else reply[3:]
    return [codec.decode(e).params for e in envelopes]


def tasks(key: str | None, n: int, **options: Any) -> list[Task]:
    return [Task("fair", "do", {"k": key or "-", "n": i}, fair_key=key, **options) for i in range(n)]


def keys_of(claimed: list[dict[str, Any]]) -> str:
    return "".join(p["k"] for p in claimed)


async def test_claims_take_the_keys_with_work_in_turn_fifo_within_each(
    redis_url: str, r: redis.Redis
) -> None:
    async with Client(redis_url) as client:
        await client.enqueue_many(tasks("a", 30))  # the big key first
        await client.enqueue_many(tasks("b", 3))
        await client.enqueue_many(tasks(None, 2))  # no key: one more turn in the rotation
        one_by_one = [p for _ in range(9) for p in await claim(redis_url, 1)]
        assert keys_of(one_by_one) == "-ab-ababa"  # the keyless, a and b in turn, then a and b
        batch = await claim(redis_url, 10)
        assert keys_of(batch) == "a" * 10  # b and the keyless ran dry: a alone is left
        assert [p["n"] for p in one_by_one + batch if p["k"] == "a"] == list(range(14))  # FIFO within a
        assert await client.queue("fair").length() == 30 + 3 + 2 - 19
        await claim(redis_url, 100)
        assert await client.queue("fair").length() == 0
    # the ring, its marker and the count are gone with the work: an idle key costs nothing
    assert not r.exists(qkey("fair", "fairring:0"), qkey("fair", "pending:prio"))
    assert int(r.get(qkey("fair", "fairlen")) or 0) == 0


async def test_a_late_small_key_is_not_starved_by_a_big_one(redis_url: str) -> None:
    async with Client(redis_url) as client:
        await client.enqueue_many(tasks("big", 2000))
        await client.enqueue_many(tasks("small", 20))
        claimed = []
        while len([p for p in claimed if p["k"] == "small"]) < 20:
            claimed += await claim(redis_url, 16)
        last_small = max(i for i, p in enumerate(claimed) if p["k"] == "small")
        assert sum(p["k"] == "big" for p in claimed[:last_small]) <= 20  # before: all 2,000 first


async def test_fair_weights_give_a_key_that_many_turns_in_a_row(redis_url: str) -> None:
    flow = spec_of(fair_weights={"gold": 3})
    async with Client(redis_url) as client:
        await client.enqueue_many(tasks("gold", 40))
        await client.enqueue_many(tasks("silver", 40))
        claimed = []
        for want in (1, 2, 5, 1, 3, 8):  # the count of turns carries across claims of any size
            claimed += await claim(redis_url, want, flow)
        assert "".join(p["k"][0] for p in claimed) == "gggs" * 5


async def test_priority_first_then_fairness_within_a_priority(redis_url: str) -> None:
    async with Client(redis_url) as client:
        await client.enqueue_many(tasks("a", 4))
        await client.enqueue_many(tasks("b", 4))
        await client.enqueue_many(tasks("hi", 2, priority=2))
        await client.enqueue_many(tasks("lo", 2, priority=-1))
        claimed = keys_of(await claim(redis_url, 12))
    assert claimed == "hihi" + "abababab" + "lolo"


async def test_fair_tasks_are_counted_listed_cancelled_purged_and_seen_in_the_backlog(
    redis_url: str, r: redis.Redis
) -> None:
    async with Client(redis_url) as client:
        jids = await client.enqueue_many(tasks("a", 3) + tasks("b", 2) + tasks(None, 1))
        queue = client.queue("fair")
        assert await queue.length() == 6
        assert sorted((t.params["k"], t.params["n"]) for t in await queue.pending()) == [
            ("-", 0), ("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)
        ]  # fmt: skip
        for t in await queue.pending():
            assert t.fair_key == (t.params["k"] if t.params["k"] != "-" else None)
        read = (await read_backlog(client.redis, client.keys, ["fair"]))["fair"]
        assert (read.pending, read.total, read.fair_keys) == (6, 6, 2)
        assert sorted(read.fair) == [("a", 3), ("b", 2)]
        assert await client.cancel(jids[3], queue="fair") is True  # b's first
        assert await client.cancel(jids[4], queue="fair") is True  # b's list is now empty
        assert await queue.length() == 4
        assert keys_of(await claim(redis_url, 3)) == "-aa"  # b's emptied turn is dropped
        assert await queue.purge() == 1
        assert await queue.length() == 0
    left = [k for k in r.scan_iter(match=qkey("fair", "fair*")) if not k.endswith(b":fairlen")]
    assert left == []
    assert int(r.get(qkey("fair", "fairlen")) or 0) == 0


async def test_a_retried_task_keeps_its_fair_key_and_its_rate_key() -> None:
    raw = Task("fair", "do", {"n": 1}, fair_key="t-7", rate_key="partner-9", priority=1).envelope()
    assert raw.startswith(b'{"jid":')
    assert b'"priority":1,"fair":"t-7","rkey":"partner-9","queue"' in raw
    envelope = codec.decode(raw)
    again = codec.decode(envelope.next_attempt(1))
    assert (again.fair, again.rkey, again.attempt) == ("t-7", "partner-9", 1)
    assert Task.from_envelope(again).fair_key == "t-7"


async def test_each_rate_key_has_its_own_bucket_and_parks_without_holding_the_others(
    redis_url: str, r: redis.Redis
) -> None:
    flow = spec_of(rate_limit="1/s", rate_key=lambda p: p["partner"])
    async with Client(redis_url) as client:
        await client.enqueue_many([Task("fair", "do", {"k": p}, rate_key=p) for p in "xxxyy"])
        await client.enqueue_many([Task("fair", "do", {"k": "-"})])  # no key: the operation's bucket
        first = await claim(redis_url, 10, flow)
        assert sorted(keys_of(first)) == ["-", "x", "y"]  # each bucket's burst of 1: nobody waits for x
        assert r.llen(qkey("fair", "rparked:do\x1fx")) == 2
        assert r.llen(qkey("fair", "rparked:do\x1fy")) == 1
        read = (await read_backlog(client.redis, client.keys, ["fair"]))["fair"]
        parked = sorted((op, key, count) for op, key, count, _ in read.parked_keys)
        assert parked == [("do", "x", 2), ("do", "y", 1)]
        assert [(op, count) for op, count, _ in read.parked_ops] == [("do", 3)]
        assert await client.queue("fair").length() == 3


async def test_fair_and_rate_keys_are_checked_at_enqueue_and_on_the_worker() -> None:
    for bad in ("", "a b", 'q"', "x" * 201, 7):
        with pytest.raises(PayloadError, match="fair_key must be"):
            Task("fair", "do", {}, fair_key=bad).envelope()  # type: ignore[arg-type]
        with pytest.raises(PayloadError, match="rate_key must be"):
            Task("fair", "do", {}, rate_key=bad).envelope()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'fair_key' must be a function"):
        inspect_worker(worker("fair", "do", _noop, fair_key="tenant"))
    with pytest.raises(ConfigError, match="'rate_key' needs 'rate_limit'"):
        inspect_worker(worker("fair", "do", _noop, rate_key=lambda p: p["partner"]))
    with pytest.raises(ConfigError, match="'fair_weights' must map fair keys"):
        inspect_worker(worker("fair", "do", _noop, fair_weights={"gold": 0}))
    with pytest.raises(ConfigError, match="two weights"):
        flow_specs(
            [
                inspect_worker(worker("fair", "do", _noop, fair_weights={"gold": 3})),
                inspect_worker(worker("fair", "other", _noop, fair_weights={"gold": 2})),
            ],
            {"fair": QK},
        )
    with pytest.raises(PayloadError, match="field 'fair' must be a fair-share key"):
        codec.decode(
            b'{"jid":"j1","fair":"a b","queue":"q","operation":"o","params":{},"attempt":0,"enqueued_at":1}'
        )


async def test_a_task_functions_fair_key_and_rate_key_come_from_its_params(redis_url: str) -> None:
    from fencekit import App

    app = App()

    @app.task(queue="fair", fair_key=lambda p: p["tenant"], rate_limit="10/s", rate_key=lambda p: p["api"])
    async def sync_account(tenant: int, api: str) -> None:
        return None

    task = sync_account.build(7, "crm")
    assert (task.fair_key, task.rate_key) == ("7", "crm")  # an int key becomes its string
    assert sync_account.options(fair_key="vip").build(7, "crm").fair_key == "vip"  # per call
    async with Client(redis_url) as client:
        await client.enqueue(task)
        [waiting] = await client.queue("fair").pending()
    assert (waiting.fair_key, waiting.rate_key) == ("7", "crm")


async def test_a_reaped_delivery_goes_back_to_the_head_of_its_key_which_keeps_its_turn(
    redis_url: str, r: redis.Redis
) -> None:
    async with Client(redis_url) as client:
        await client.enqueue_many(tasks("a", 3) + tasks("b", 3))
        assert keys_of(await claim(redis_url, 3)) == "ab" + "a"  # b's turn is next
        [(token, envelope)] = [
            (int(t), e) for t, e in r.hgetall(QK.inflight("c1")).items() if codec.decode(e).params["n"] == 1
        ]  # a's second task: the reaper finds its consumer dead
        ar = async_client(redis_url)
        try:
            await arun(
                ar,
                scripts.requeue(
                    inflight=QK.inflight("c1"), pending=QK.pending, stats=QK.stats, wake=QK.wake,
                    fence=KeySpace().job_fence("fair", codec.decode(envelope).jid), token=token,
                    envelope=envelope, counter="retried", fence_ttl_ms=60_000,
                ),
            )  # fmt: skip
        finally:
            await aclose_client(ar)
        again = await claim(redis_url, 3, consumer="c2")
    assert [(p["k"], p["n"]) for p in again] == [("b", 1), ("a", 1), ("b", 2)]  # a's next, in a's turn


async def test_the_keys_lists_and_their_ring_outlive_a_redis_restart_together(
    tmp_path: Path, server_binary: str
) -> None:
    """With persistence (AOF) a Redis killed and restarted keeps each key's list with its place
    in the ring: a script's writes are one unit in the AOF (and in replication)."""
    server = RedisServer(
        tmp_path / "redis", binary=server_binary, appendonly=True, config={"appendfsync": "always"}
    )
    server.start()
    try:
        async with Client(server.url()) as client:
            await client.enqueue_many(tasks("a", 3) + tasks("b", 3) + tasks("c", 1))
            assert keys_of(await claim(server.url(), 2)) == "ab"
        server.kill()
        server.start()
        async with Client(server.url()) as client:
            assert await client.queue("fair").length() == 5
            assert keys_of(await claim(server.url(), 5)) == "cabab"
    finally:
        server.cleanup()


async def test_fair_keys_with_a_concurrency_key_a_full_key_holds_up_nobody(
    redis_url: str, r: redis.Redis
) -> None:
    flow = spec_of(max_concurrency=1, concurrency_key=lambda p: p["k"])
    async with Client(redis_url) as client:
        await client.enqueue_many(
            [
                Task("fair", "do", {"k": k, "n": i}, fair_key=k, concurrency_key=k)
                for k in "ab"
                for i in range(3)
            ]
        )
        first = await claim(redis_url, 6, flow)
        assert sorted(keys_of(first)) == ["a", "b"]  # one slot each; the rest parked, nobody waits on them
        assert r.llen(qkey("fair", "parked:a")) == 2
        [a_token] = [
            int(t) for t, e in r.hgetall(QK.inflight("c1")).items() if codec.decode(e).params["k"] == "a"
        ]
        ar = async_client(redis_url)
        try:  # a's run ends: its slot is given back and a's next task returns to a's list, in turn
            await arun(
                ar,
                scripts.ack_claim(
                    pending=QK.pending, inflight=QK.inflight("c1"), token_counter=QK.token_counter,
                    stats=QK.stats, wake=QK.wake, want=0, acks=[a_token], flow=flow,
                ),
            )  # fmt: skip
        finally:
            await aclose_client(ar)
        assert [(p["k"], p["n"]) for p in await claim(redis_url, 6, flow)] == [("a", 1)]
        assert await client.queue("fair").length() == 3  # a's last and b's two, parked


async def test_cancel_finds_a_recorded_task_on_its_fair_keys_list_and_on_its_rate_keys_parked_list(
    redis_url: str, r: redis.Redis
) -> None:
    """A task with a record is cancelled where its envelope says it waits (cancel.lua looks no
    further): its fair key's list, or the parked list of its operation and rate key."""
    flow = spec_of(rate_limit="1/s", rate_key=lambda p: p["k"])
    async with Client(redis_url) as client:
        fair = await client.enqueue_many(tasks("a", 2, keep_result=60))
        rated = [
            await client.enqueue(Task("fair", "do", {"k": "x", "n": i}, rate_key="x", keep_result=60))
            for i in range(2)
        ]
        assert await client.cancel(fair[1], queue="fair") is True  # on a's list
        assert int(r.get(qkey("fair", "fairlen")) or 0) == 1
        claimed = await claim(redis_url, 10, flow)  # a's first; x's first takes the token, x's second parks
        assert sorted(p["k"] for p in claimed) == ["a", "x"]
        assert r.llen(qkey("fair", "rparked:do\x1fx")) == 1
        assert await client.cancel(rated[1], queue="fair") is True  # on x's parked list
        assert r.llen(qkey("fair", "rparked:do\x1fx")) == 0
        assert await client.queue("fair").length() == 0
