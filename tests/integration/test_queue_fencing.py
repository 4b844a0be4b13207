"""Fenced settlement and the store's contract, driven through the Lua scripts
themselves (``fencekit._redis.scripts`` builders + ``store.arun``): I3 (stale deliveries change
nothing), I4 (nothing is re-sent), I5 (scripts run on Redis Cluster), I7 (bad input
is dead-lettered with its reason), and the reaper's forget rule."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio
from tests.queue_helpers import (
    BEATS,
    CONSUMERS,
    capture_logger,
    eventually,
    inflight_count,
    new_server,
    pending,
    qkey,
    running,
    snapshot,
    stats,
)
from tests.servers import direct, node_of, nodes

from fencekit import Client, FencedOutError, StoreError, SyncClient, Task
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client, sync_client
from fencekit._redis.cluster.link import ClusterLink
from fencekit._redis.keys import KeySpace, job_resource
from fencekit._redis.link import open_link
from fencekit._redis.run import NodeLost, arun, run
from fencekit._redis.url import parse_url
from fencekit.consume import _settle as settle
from fencekit.consume._settle import Delivery, Retention
from fencekit.jobs import codec
from fencekit.jobs.worker import RetryPolicy, WorkerRegistry
from fencekit.primitives.fence import AsyncFenceGate
from fencekit.primitives.tokens import FenceToken
from fencekit.services._reaper import Reaper
from fencekit.settings import ServerSettings, defaults

KEYS = KeySpace()
RETENTION = Retention.of(defaults(ServerSettings))


@pytest.fixture
def r(redis_url: str) -> Any:
    client = direct(redis_url)
    # Connected before the test's own clients, which therefore get larger ids (settle_counter);
    # on a cluster, per node.
    client.first_ids = {id(node): int(node.client_id()) for node in nodes(client)}
    yield client
    client.close()


@pytest.fixture
async def ar(redis_url: str) -> Any:
    client = async_client(redis_url)
    yield client
    await aclose_client(client)


async def claim(ar: Any, queue: str, consumer: str, want: int = 1, acks: tuple[int, ...] = ()) -> Any:
    """``[fenced, first, envelopes...]`` of one ack_claim, whose ``lost`` flag must be 0."""
    fenced, first, lost, *envelopes = await claim_reply(ar, queue, consumer, want, acks)
    assert lost == 0
    return [fenced, first, *envelopes]


async def claim_reply(ar: Any, queue: str, consumer: str, want: int, acks: tuple[int, ...]) -> Any:
    qk = KEYS.queue(queue)
    return await arun(
        ar,
        scripts.ack_claim(
            pending=qk.pending,
            inflight=qk.inflight(consumer),
            token_counter=qk.token_counter,
            stats=qk.stats,
            wake=qk.wake,
            want=want,
            acks=list(acks),
        ),
    )


def redis_time_us(r: Any) -> int:
    """The Redis server's clock in microseconds (what tokens are made of)."""
    seconds, micros = r.time()
    return int(seconds) * 1_000_000 + int(micros)


async def test_an_ack_after_redis_lost_its_data_says_so_and_counts_nothing(
    redis_url: str, r: Any, ar: Any
) -> None:
    async with Client(redis_url=redis_url) as client:
        await client.enqueue(Task("gone", "op", {}))
    _, token, _ = await claim(ar, "gone", "c1")
    r.flushall()  # what a restart without persistence leaves
    fenced, first, lost = await claim_reply(ar, "gone", "c1", 0, (token,))
    assert (fenced, first, lost) == ([str(token).encode()], 0, 1)
    assert not r.exists(qkey("gone", "stats"))  # neither processed nor fenced out: nothing was fenced
    # A refusal while the counter exists is a real fence, counted as such.
    async with Client(redis_url=redis_url) as client:
        await client.enqueue(Task("gone", "op", {}))
    _, token, _ = await claim(ar, "gone", "c1")
    r.delete(KEYS.queue("gone").inflight("c1"))  # what a reap does to the delivery
    fenced, _, lost = await claim_reply(ar, "gone", "c1", 0, (token,))
    assert (len(fenced), lost) == (1, 0)
    assert stats(r, "gone")["fenced_out"] == 1


# -- I3: a stale delivery changes nothing -----------------------------------------------------


async def test_i3_stale_ack_retry_and_fail_change_nothing(redis_url: str, r: Any, ar: Any) -> None:
    queue = "stale"
    qk = KEYS.queue(queue)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task(queue, "op", {"x": 1}))
    fenced, old_token, raw = await claim(ar, queue, "c1")
    old_token = int(old_token)
    assert fenced == []
    assert orjson.loads(raw)["jid"] == jid
    # The reaper returns c1's delivery (crash = failed attempt), c2 claims it again.
    verdict = settle.after_crash(
        KEYS, Delivery(queue, qk.inflight("c1"), old_token, raw), WorkerRegistry().policy, retention=RETENTION
    )
    assert verdict.returned
    assert await arun(ar, verdict.call) == 1
    _, new_token, raw2 = await claim(ar, queue, "c2")
    new_token = int(new_token)
    assert new_token > old_token
    assert orjson.loads(raw2)["attempt"] == 1
    before = snapshot(r)
    fenced_before = stats(r, queue)["fenced_out"]

    # A stale ack (c1's old token, on c1's hash and on c2's) is refused.
    fenced, first = await claim(ar, queue, "c1", want=0, acks=(old_token,))
    assert [int(t) for t in fenced] == [old_token]
    assert int(first) == 0
    fenced, _ = await claim(ar, queue, "c2", want=0, acks=(old_token,))
    assert [int(t) for t in fenced] == [old_token]
    # A stale retry and a stale fail raise FencedOutError.
    env = codec.decode(raw)
    with pytest.raises(FencedOutError):
        await arun(
            ar,
            settle.retry(
                KEYS, Delivery(queue, qk.inflight("c1"), old_token), env, 1, RetryPolicy().delay(env.attempt)
            ),
        )
    with pytest.raises(FencedOutError):
        await arun(
            ar,
            settle.fail(
                KEYS, Delivery(queue, qk.inflight("c1"), old_token), jid=jid, reason="x", retention=RETENTION
            ),
        )
    with pytest.raises(FencedOutError):
        await arun(
            ar, settle.fail(KEYS, Delivery(queue, qk.inflight("c1"), old_token), jid=jid, retention=RETENTION)
        )
    # A stale requeue (a second reaper) changes nothing either.
    with pytest.raises(FencedOutError):
        await arun(
            ar,
            settle.requeue(
                KEYS,
                Delivery(queue, qk.inflight("c1"), old_token),
                raw,
                jid=jid,
                counter="retried",
                retention=RETENTION,
            ),
        )

    assert snapshot(r) == before  # nothing changed but the fenced_out counter
    assert stats(r, queue)["fenced_out"] == fenced_before + 5
    s = stats(r, queue)
    assert (s["processed"], s["failed"], s["dead"]) == (0, 0, 0)

    # The current delivery still acks, once.
    fenced, _ = await claim(ar, queue, "c2", want=0, acks=(new_token,))
    assert fenced == []
    assert stats(r, queue)["processed"] == 1
    fenced, _ = await claim(ar, queue, "c2", want=0, acks=(new_token,))
    assert len(fenced) == 1
    assert stats(r, queue)["processed"] == 1


async def test_i3_a_reaped_delivery_cannot_write_through_its_fence_even_before_the_next_one_writes(
    redis_url: str, r: Any, ar: Any
) -> None:
    queue = "gate"
    qk = KEYS.queue(queue)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task(queue, "op"))
    _, token, raw = await claim(ar, queue, "c1")
    stale = FenceToken(int(token), job_resource(queue, jid))
    gate = AsyncFenceGate(ar)
    await gate.set_if_fresh(stale, f"{{{queue}}}:result", "first")
    verdict = settle.after_crash(
        KEYS,
        Delivery(queue, qk.inflight("c1"), int(token), raw),
        WorkerRegistry().policy,
        retention=RETENTION,
    )
    await arun(ar, verdict.call)
    with pytest.raises(FencedOutError):
        await gate.set_if_fresh(stale, f"{{{queue}}}:result", "late")
    assert r.get(f"{{{queue}}}:result") == b"first"


async def test_i2_tokens_keep_growing_when_the_token_counter_is_lost(redis_url: str, r: Any, ar: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task("lost", "op"), Task("lost", "op")])
    _, first, _ = await claim(ar, "lost", "c1")
    r.delete(qkey("lost", "token"))  # a failover lost the counter's last writes
    before = redis_time_us(r)
    _, second, _ = await claim(ar, "lost", "c1")
    after = redis_time_us(r)
    assert int(second) > int(first)
    assert before <= int(second) <= after  # the Redis clock in µs at the claim


# -- I4: a timed-out script ran once ------------------------------------------------------

SLOW_SCRIPT = scripts.Script(
    "slow_incr",
    """
redis.call('INCR', KEYS[1])
-- os.clock where there is one (Valkey, whose TIME inside a script is the time it began),
-- else TIME (Redis 7.0 has no os)
local ok, clock = pcall(function() return os.clock end)
if not ok then
  clock = function() local t = redis.call('TIME') return t[1] + t[2] / 1000000 end
end
local stop = clock() + tonumber(ARGV[1]) / 1000
while clock() < stop do end
return 1
""",
    "",
)
SLOW_SCRIPT = scripts.Script(
    SLOW_SCRIPT.name, SLOW_SCRIPT.source, hashlib.sha1(SLOW_SCRIPT.source.encode()).hexdigest()
)


def slow_call(key: str, ms: int = 700) -> scripts.Call:
    return scripts.Call(SLOW_SCRIPT, (key,), (ms,))


def _not_busy(r: Any) -> bool:
    try:
        return bool(r.ping())
    except redis.exceptions.ResponseError as exc:  # BUSY: a slow script still runs
        if str(exc).startswith("BUSY"):
            return False
        raise


def _clients_under_test(r: Any, key: str) -> list[int]:
    """Ids of the connections opened after ``r``'s that the server holding ``key`` still has."""
    node = node_of(r, key)
    return [int(c["id"]) for c in node.client_list() if int(c["id"]) > r.first_ids[id(node)]]


async def settle_counter(r: Any, key: str) -> int:
    """``key``'s counter once the server has run everything the test's clients sent it.

    The test has closed its clients. The server frees a connection only after
    it has read, and run, all that was sent on it before the close; so once the
    script has ended (PING waits behind it) and none of the test's connections
    is left, a re-send can no longer be on its way.
    """
    await eventually(lambda: _not_busy(r), timeout=5)
    await eventually(lambda: not _clients_under_test(r, key), timeout=5, what="the test's connections closed")
    return int(r.get(key))


async def test_i4_a_timed_out_script_through_redis_py_async_ran_once(redis_url: str, r: Any) -> None:
    client = async_client(parse_url(redis_url + "?socket_timeout=0.2"))
    # the socket timeout gave up on the reply (the 700 ms script had not answered)
    with pytest.raises(StoreError, match=r"^TimeoutError: Timeout reading from "):
        await arun(client, slow_call("i4:async"))
    await aclose_client(client)
    assert await settle_counter(r, "i4:async") == 1


async def test_i4_a_timed_out_script_through_redis_py_sync_ran_once(redis_url: str, r: Any) -> None:
    client = sync_client(parse_url(redis_url + "?socket_timeout=0.2"))
    with pytest.raises(StoreError, match=r"^TimeoutError: Timeout reading from "):
        await asyncio.to_thread(run, client, slow_call("i4:sync"))
    client.close()
    assert await settle_counter(r, "i4:sync") == 1


@pytest.mark.parametrize("kind", ["lean", "redis-py"])
async def test_i4_a_timed_out_script_through_the_hot_path_link_ran_once(
    redis_url: str, r: Any, kind: str
) -> None:
    link = await open_link(parse_url(redis_url + "?socket_timeout=0.2"), kind=kind)
    try:
        with pytest.raises(StoreError):
            await link.call(slow_call(f"i4:{kind}"))
        # one connection closes; a cluster link closes only that node's (NodeLost), the others serve on
        assert link.closed is not isinstance(link, ClusterLink)
    finally:
        await link.aclose()
    assert await settle_counter(r, f"i4:{kind}") == 1


async def test_i4_a_timed_out_pipeline_on_the_lean_link_ran_each_script_once(redis_url: str, r: Any) -> None:
    link = await open_link(parse_url(redis_url + "?socket_timeout=0.2"), kind="lean")
    try:
        try:
            replies: list[Any] | None = await link.pipeline(
                [slow_call("i4:p1", 300), slow_call("i4:p2", 300)]
            )
        except StoreError:
            replies = None  # one connection: the pipeline fails as a whole
        if isinstance(link, ClusterLink):  # each node's calls fail alone, in their slots
            assert replies is not None
            assert all(isinstance(reply, NodeLost) for reply in replies), replies
        else:
            assert replies is None
    finally:
        await link.aclose()
    assert await settle_counter(r, "i4:p1") == 1
    assert await settle_counter(r, "i4:p2") == 1


async def test_i4_a_sync_client_enqueue_whose_reply_timed_out_is_not_sent_again(
    redis_url: str, r: Any
) -> None:
    """SyncClient (redis-py without an event loop): Redis holds writes for 0.7 s (``CLIENT PAUSE``)
    and the client's socket timeout is 0.2 s. The lost reply is a StoreError, and the enqueue is
    not sent again once Redis answers: it ran at most once."""
    node = node_of(r, qkey("i4sync", "pending"))
    client = SyncClient(redis_url + "?socket_timeout=0.2")
    try:
        node.execute_command("CLIENT", "PAUSE", 700, "WRITE")
        with pytest.raises(StoreError, match=r"^TimeoutError"):
            await asyncio.to_thread(client.enqueue, Task("i4sync", "op"))
    finally:
        client.close()
        node.execute_command("CLIENT", "UNPAUSE")
    await eventually(
        lambda: not _clients_under_test(r, qkey("i4sync", "pending")), timeout=5, what="the client closed"
    )
    enqueued = stats(r, "i4sync")["enqueued"]
    assert enqueued <= 1
    assert len(pending(r, "i4sync")) == enqueued


# -- I5: every queue script runs on a real Redis Cluster ----------------------------------------


@pytest.mark.slow
def test_i5_every_queue_script_runs_on_redis_cluster(tmp_path: Any, server_binary: str) -> None:
    from fencekit.testing.cluster import LocalCluster

    with LocalCluster(tmp_path / "cluster", binary=server_binary) as cluster:
        client = cluster.client()
        try:
            slots = set()
            for queue in ("emails", "reports", "sms"):
                qk = KEYS.queue(queue)
                slots.add(client.keyslot(qk.pending))
                env = Task(queue, "op", {"n": 1}).envelope()
                jid = orjson.loads(env)["jid"]
                assert (
                    run(
                        client,
                        scripts.enqueue(
                            pending=qk.pending,
                            scheduled=qk.scheduled,
                            stats=qk.stats,
                            wake=qk.wake,
                            delay_ms=0,
                            envelopes=[env, Task(queue, "op").envelope()],
                        ),
                    )
                    == 2
                )
                assert (
                    run(
                        client,
                        scripts.enqueue(
                            pending=qk.pending,
                            scheduled=qk.scheduled,
                            stats=qk.stats,
                            wake=qk.wake,
                            delay_ms=1,
                            envelopes=[Task(queue, "op").envelope()],
                        ),
                    )
                    == 1
                )
                time.sleep(0.01)  # past the 1 ms delay: the scheduled task is due
                assert (
                    run(
                        client,
                        scripts.schedule(scheduled=qk.scheduled, pending=qk.pending, wake=qk.wake, limit=10),
                    )
                    == 1
                )
                reply = run(
                    client,
                    scripts.ack_claim(
                        pending=qk.pending,
                        inflight=qk.inflight("c1"),
                        token_counter=qk.token_counter,
                        stats=qk.stats,
                        wake=qk.wake,
                        want=3,
                        acks=[],
                    ),
                )
                first = int(reply[1])
                raws = reply[3:]
                assert len(raws) == 3
                tokens = {orjson.loads(raw)["jid"]: (first + i, raw) for i, raw in enumerate(raws)}
                t_ack, _ = tokens.pop(jid)
                (t_retry, raw_retry), (t_crash, raw_crash) = tokens.values()
                run(
                    client,
                    scripts.ack_claim(
                        pending=qk.pending,
                        inflight=qk.inflight("c1"),
                        token_counter=qk.token_counter,
                        stats=qk.stats,
                        wake=qk.wake,
                        want=0,
                        acks=[t_ack],
                    ),
                )
                env_retry = codec.decode(raw_retry)
                assert (
                    run(
                        client,
                        settle.retry(
                            KEYS,
                            Delivery(queue, qk.inflight("c1"), t_retry),
                            env_retry,
                            1,
                            RetryPolicy().delay(env_retry.attempt),
                        ),
                    )
                    == 1
                )
                verdict = settle.after_crash(
                    KEYS,
                    Delivery(queue, qk.inflight("c1"), t_crash, raw_crash),
                    WorkerRegistry().policy,
                    retention=RETENTION,
                )
                assert run(client, verdict.call) == 1
                reply = run(
                    client,
                    scripts.ack_claim(
                        pending=qk.pending,
                        inflight=qk.inflight("c1"),
                        token_counter=qk.token_counter,
                        stats=qk.stats,
                        wake=qk.wake,
                        want=1,
                        acks=[],
                    ),
                )
                live = scripts.job_set(
                    inflight=qk.inflight("c1"),
                    fence=KEYS.fence(job_resource(queue, "j")),
                    target=f"{{{queue}}}:live",
                    token=int(reply[1]),
                    value="v",
                )
                assert run(client, live) == 1
                assert (
                    run(
                        client,
                        settle.fail(
                            KEYS,
                            Delivery(queue, qk.inflight("c1"), int(reply[1])),
                            jid="j",
                            reason="bad",
                            retention=RETENTION,
                        ),
                    )
                    == 1
                )
                dead_id = client.zrange(qk.dead_index, 0, -1)[0].decode()
                assert (
                    run(
                        client,
                        scripts.dead_revive(
                            dead=qk.dead,
                            dead_index=qk.dead_index,
                            pending=qk.pending,
                            stats=qk.stats,
                            wake=qk.wake,
                            dead_id=dead_id,
                            envelope=b"",
                        ),
                    )
                    == 1
                )
                assert (
                    run(client, scripts.purge(pending=qk.pending, stats=qk.stats, record_prefix=qk.job("")))
                    == 1
                )
                failed_token = int(reply[1])
                with pytest.raises(FencedOutError):  # the failed delivery left its in-flight hash
                    run(
                        client,
                        scripts.job_set(
                            inflight=qk.inflight("c1"),
                            fence=KEYS.fence(job_resource(queue, "j")),
                            target=f"{{{queue}}}:out",
                            token=failed_token,
                            value="v",
                        ),
                    )
                assert client.get(f"{{{queue}}}:out") is None
                s = {k.decode(): int(v) for k, v in client.hgetall(qk.stats).items()}
                assert s["processed"] == 1
                assert s["failed"] == 1
                assert s["dead"] == 1
                assert s["purged"] == 1
            assert len(slots) > 1  # the queues really live on different slots
            beat = scripts.heartbeat(
                consumers=KEYS.consumers,
                beats=KEYS.beats,
                store=KEYS.store,
                new_store_id="s",
                entries=[("c1", b"{}")],
            )
            now_ms, store_id = run(client, beat)
            assert now_ms > 0
            assert store_id == b"s"
            assert run(client, scripts.expired(beats=KEYS.beats, ttl_ms=60_000, limit=10)) == []
            assert (
                run(
                    client,
                    scripts.forget(consumers=KEYS.consumers, beats=KEYS.beats, consumer_id="c1", ttl_ms=0),
                )
                == 1
            )
        finally:
            client.close()


# -- I7: bad input is dead-lettered, with its reason, and nothing crashes ---------------------

GARBAGE: dict[str, tuple[bytes, str]] = {
    "not-json": (b"this is not json", "not valid JSON"),
    "non-utf8": (b"\xff\xfe\x80 binary \x00", "not valid JSON"),
    "array": (b"[1, 2, 3]", "JSON object"),
    "no-jid": (orjson.dumps({"queue": "bad", "operation": "ok", "params": {}}), "'jid'"),
    "wrong-types": (orjson.dumps({"jid": 7, "queue": "bad", "operation": "ok", "params": {}}), "jid"),
    "params-list": (orjson.dumps({"jid": "p", "queue": "bad", "operation": "ok", "params": [1]}), "params"),
    "attempt-str": (
        orjson.dumps({"jid": "a", "queue": "bad", "operation": "ok", "params": {}, "attempt": "0"}),
        "attempt",
    ),
}


async def test_i7_garbage_and_unknown_operations_become_dead_letters_with_their_reason(
    redis_url: str, r: Any
) -> None:
    done: list[str] = []

    class Ok:
        queue = "bad"
        operation = "ok"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            done.append(payload.get("n", "?"))

    for raw, _ in GARBAGE.values():
        r.lpush(qkey("bad", "pending"), raw)
    server = new_server(redis_url, Ok)
    async with Client(redis_url=redis_url) as client:
        orphan = await client.enqueue(Task("bad", "nobody", {"n": "orphan"}))
        await client.enqueue(Task("bad", "ok", {"n": "before"}))
        async with running(server) as task:
            await eventually(lambda: stats(r, "bad")["failed"] == len(GARBAGE) + 1, timeout=8)
            await client.enqueue(Task("bad", "ok", {"n": "after"}))
            await eventually(lambda: "after" in done)
            assert not task.done()  # nothing crashed
        s = stats(r, "bad")
        assert s["failed"] == s["dead"] == len(GARBAGE) + 1
        assert s["processed"] == 2
        assert done == ["before", "after"]
        assert r.llen(qkey("bad", "pending")) == 0
        assert inflight_count(r, "bad") == 0

        queue = client.queue("bad")
        letters = await queue.dead_letters(limit=100)
        assert len(letters) == len(GARBAGE) + 1 == await queue.dead_count()
        by_raw = {letter.raw: letter for letter in letters}
        for name, (raw, words) in GARBAGE.items():
            assert raw in by_raw, name  # the raw payload is kept byte for byte
            assert words in by_raw[raw].reason, (name, by_raw[raw].reason)
        unknown = [letter for letter in letters if letter.jid == orphan]
        assert len(unknown) == 1
        assert "nobody" in unknown[0].reason
        assert "no worker" in unknown[0].reason
        # Stored where an operator can see them, in Redis.
        assert r.zcard(qkey("bad", "dead:index")) == len(GARBAGE) + 1

        # Revive the unknown-operation task, as stored: it is enqueued again, once.
        assert await queue.revive(unknown[0].id) is True
        assert await queue.revive(unknown[0].id) is False
        assert [e["jid"] for e in pending(r, "bad")] == [orphan]
        assert r.zcard(qkey("bad", "dead:index")) == len(GARBAGE)
        s = stats(r, "bad")
        assert s["revived"] == 1
        assert s["enqueued"] == 4

        # Revive another as a corrected task: it runs.
        letter = by_raw[GARBAGE["no-jid"][0]]
        assert await queue.revive(letter.id, Task("bad", "ok", {"n": "revived"}))
    server = new_server(redis_url, Ok)
    async with running(server):
        await eventually(lambda: "revived" in done)
        await eventually(lambda: stats(r, "bad")["failed"] == len(GARBAGE) + 2)  # the orphan again


# -- the reaper's forget rule, and the registry ---------------------------------------------


async def test_the_reaper_keeps_a_consumer_whose_beat_came_back_and_forgets_a_silent_one(
    redis_url: str, r: Any, ar: Any
) -> None:
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task("reap", "op", {"i": i}) for i in range(2)])
    for cid in ("alive", "dead"):
        await claim(ar, "reap", cid)
        await arun(
            ar,
            scripts.heartbeat(
                consumers=KEYS.consumers,
                beats=KEYS.beats,
                store=KEYS.store,
                new_store_id="s",
                entries=[(cid, orjson.dumps({"queues": ["reap"]}))],
            ),
        )
    now_ms = int(r.time()[0]) * 1000
    r.zadd(BEATS, {"dead": now_ms - 60_000})
    log = capture_logger("test.reaper")
    reaper = Reaper(ar, KEYS, WorkerRegistry(), ttl=5.0, logger=log, retention=RETENTION)
    moved = await reaper.reap_once()
    assert moved == 1
    lines = log.list_handler.messages()  # type: ignore[attr-defined]
    assert [m for m in lines if m.startswith("reaped consumer")] == [
        "reaped consumer dead (no heartbeat for 5s: it died, or is paused or cut off from Redis): "
        "1 task(s) returned or failed"
    ]
    assert sum(" returned to queue reap from consumer dead " in m for m in lines) == 1
    assert r.hexists(CONSUMERS, "alive")
    assert not r.hexists(CONSUMERS, "dead")
    assert r.zscore(BEATS, "dead") is None
    assert [e["attempt"] for e in pending(r, "reap")] == [1]  # a crash is a failed attempt
    assert stats(r, "reap")["retried"] == 1
    # Reaped while its beat is fresh (it came back meanwhile): tasks return, registration stays.
    assert await reaper.reap("alive", forget_if_silent=True) == 1
    assert r.hexists(CONSUMERS, "alive")
    assert r.zscore(BEATS, "alive") is not None
    assert inflight_count(r, "reap") == 0


async def test_a_reaper_uses_its_own_workers_policy_and_the_default_for_unknown_ones(
    redis_url: str, r: Any, ar: Any
) -> None:
    class NoRetry:
        queue = "pol"
        operation = "once"
        retry = False

        @classmethod
        async def perform(cls, payload: dict) -> None:
            return None

    registry = WorkerRegistry()
    registry.add([NoRetry])
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many(
            [Task("pol", "once"), Task("pol", "unknown"), Task("pol", "unknown", attempt=1)]
        )
    await claim(ar, "pol", "gone", want=3)
    reaper = Reaper(ar, KEYS, registry, ttl=5.0, logger=capture_logger("test.reaper2"), retention=RETENTION)
    await reaper.reap("gone", forget_if_silent=False, queues=["pol"])
    back = pending(r, "pol")
    assert [(e["operation"], e["attempt"]) for e in back] == [("unknown", 1)]
    s = stats(r, "pol")
    assert s["failed"] == 2
    assert s["retried"] == 1
    assert s["dead"] == 0
