"""Priorities on a real Redis (docs/guides/flow.md): claim order by priority, FIFO within
one, decided by ``ack_claim.lua``; retries keep their priority; every script that
touches a queue's pending list knows the priority lists."""

from __future__ import annotations

import asyncio
import re
from importlib import resources
from typing import Any

import orjson
import pytest
from tests.queue_helpers import (
    BEATS,
    capture_logger,
    eventually,
    inflight_count,
    new_server,
    qkey,
    running,
    stats,
    worker,
)

from fencekit import Client, Task
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit.consume._settle import Retention
from fencekit.errors import PayloadError
from fencekit.jobs.worker import WorkerRegistry
from fencekit.services._reaper import Reaper
from fencekit.settings import ServerSettings, defaults

KEYS = KeySpace()
RETENTION = Retention.of(defaults(ServerSettings))

# Every script naming the pending list, and how it is priority-aware: "_prio" (it includes
# lua/_prio.lua and pushes/reads through it) or a reason it need not be.
PENDING_SCRIPTS = {
    "ack_claim.lua": "_prio",
    "periodic_enqueue.lua": "_prio",
    "cancel.lua": "_prio",
    "dead_revive.lua": "_prio",
    "dead_revive_many.lua": "_prio",
    "dep_release.lua": "_prio",
    "drain_probe.lua": "_prio",
    "backlog.lua": "_prio",
    "enqueue.lua": "_prio",
    "enqueue_tracked.lua": "_prio",
    "enqueue_unique.lua": "_prio",
    "outbox_push.lua": "_prio",
    "failed_retry.lua": "_prio",
    "failed_retry_many.lua": "_prio",
    "history_sample.lua": "_prio",
    "pending_read.lua": "_prio",
    "purge.lua": "_prio",
    "requeue.lua": "_prio",
    "run_now.lua": "_prio",
    "schedule.lua": "_prio",
    "has_work.lua": "reads the default list's length and the priority marker (_prio.lua's ZSET)",
    "job_info.lua": "reads the record and the in-flight hashes, never the lists",
    "idem_begin.lua": "'pending:<owner>' is an idempotency state, not a queue",
    "idem_done.lua": "'pending:<owner>' is an idempotency state, not a queue",
    "idem_reclaim.lua": "'pending:<owner>' is an idempotency state, not a queue",
    "upgrade_move.lua": "moves 0.6 keys, which had no priorities",
    "enqueue_debounce.lua": "puts its task on the scheduled set only (schedule.lua moves it, by _prio)",
}


def test_every_script_touching_pending_is_priority_aware() -> None:
    lua = resources.files("fencekit._redis").joinpath("lua")
    touching = {}
    for item in lua.iterdir():
        if item.name.endswith(".lua") and not item.name.startswith("_"):
            text = item.read_text("utf-8")
            if "pending" in text:
                touching[item.name] = text
    assert set(touching) == set(PENDING_SCRIPTS), "a script touches pending: classify it here"
    for name, how in PENDING_SCRIPTS.items():
        text = touching[name]
        if how == "_prio":
            assert "--!include _prio.lua" in text, name
            # no bare list command on the pending list left: pushes and pops go through _prio.lua
            assert not re.search(r"'(L|R)PUSH', KEYS\[\d\], (ARGV|raw|item|envelope|unpack\(due)", text), name


async def test_claim_order_is_by_priority_then_fifo(redis_url: str, r: Any) -> None:
    order: list[tuple[int, int]] = []

    async def perform(payload: dict[str, Any]) -> None:
        order.append((payload["p"], payload["i"]))

    mix = [(p, i) for i in range(30) for p in (0, 3, -2, 5, 0, 1)]
    async with Client(redis_url=redis_url) as client:
        # one by one, and in batches (enqueue_many) with priorities mixed in one batch
        for p, i in mix[:60]:
            await client.enqueue(Task("prio", "run", {"p": p, "i": i}, priority=p))
        await client.enqueue_many([Task("prio", "run", {"p": p, "i": i}, priority=p) for p, i in mix[60:]])
        assert await client.queue("prio").length() == len(mix)
        waiting = await client.queue("prio").pending()
        assert [(t.params["p"], t.params["i"]) for t in waiting] == sorted(mix, key=lambda x: -x[0])
    assert r.llen(qkey("prio", "pending")) == 60  # priority 0 stays on the plain list
    assert r.llen(qkey("prio", "pending:5")) == 30
    server = new_server(redis_url, worker("prio", "run", perform), concurrency=1, max_claim=1)
    async with running(server):
        await eventually(lambda: len(order) == len(mix), what="all ran")
        # a marker of an emptied list goes at the next claim (the one sent with the last ack,
        # or the idle re-poll): wait for it while the server runs
        await eventually(
            lambda: stats(r, "prio")["processed"] == len(mix) and not r.exists(qkey("prio", "pending:prio")),
            what="acknowledged, markers of emptied lists gone",
        )
    expected = sorted(mix, key=lambda x: -x[0])  # stable: FIFO within one priority
    assert order == expected


async def test_a_retry_keeps_its_priority(redis_url: str, r: Any) -> None:
    order: list[str] = []

    async def perform(payload: dict[str, Any]) -> None:
        order.append(payload["name"])
        if payload["name"] == "high" and len(order) == 1:
            raise RuntimeError("once")
        await asyncio.sleep(0)

    async with Client(redis_url=redis_url) as client:
        await client.enqueue(Task("prio_retry", "run", {"name": "high"}, priority=4))
        high = worker("prio_retry", "run", perform, retry_count=3)
        server = new_server(redis_url, high, concurrency=1, max_claim=1)
        async with running(server):
            await eventually(lambda: r.zcard(qkey("prio_retry", "scheduled")) == 1, what="retry scheduled")
            # while the retry waits, plain tasks pile up; the retry, once due, goes before them
            for n in range(200):
                await client.enqueue(Task("prio_retry", "run", {"name": f"low{n}"}))
            await eventually(lambda: len(order) == 202, timeout=10, what="all ran")
    assert order[0] == "high"
    second = order.index("high", 1)
    # due after ~1 s; the plain tasks take far less, but the retry jumps whatever is left
    assert all(name.startswith("low") for name in order[1:second])
    assert stats(r, "prio_retry")["retried"] == 1


async def test_returned_and_reaped_tasks_keep_their_priority(redis_url: str, r: Any) -> None:
    started = asyncio.Event()

    async def slow(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(30)

    async with Client(redis_url=redis_url) as client:
        await client.enqueue(Task("prio_stop", "run", {}, priority=-3))
        server = new_server(redis_url, worker("prio_stop", "run", slow), grace=0.1)
        async with running(server):
            await asyncio.wait_for(started.wait(), 10)
        # returned at stop to the head of ITS list
        assert r.llen(qkey("prio_stop", "pending:-3")) == 1
        assert r.llen(qkey("prio_stop", "pending")) == 0
        assert await client.queue("prio_stop").length() == 1
        assert await client.queue("prio_stop").purge() == 1
        assert await client.queue("prio_stop").length() == 0

    # reaped: a consumer died holding a task of priority 4; plain tasks queued behind it meanwhile
    queue = "prio_reap"
    async with Client(redis_url=redis_url) as client:
        await client.enqueue(Task(queue, "run", {"name": "high"}, priority=4))
    ar = async_client(redis_url)
    try:
        qk = KEYS.queue(queue)
        claimed = await arun(
            ar,
            scripts.ack_claim(
                pending=qk.pending,
                inflight=qk.inflight("dead"),
                token_counter=qk.token_counter,
                stats=qk.stats,
                wake=qk.wake,
                want=1,
                acks=[],
            ),
        )
        assert orjson.loads(claimed[3])["params"] == {"name": "high"}
        assert not r.exists(qkey(queue, "pending:4"))  # in flight only
        await arun(
            ar,
            scripts.heartbeat(
                consumers=KEYS.consumers,
                beats=KEYS.beats,
                store=KEYS.store,
                new_store_id="s",
                entries=[("dead", orjson.dumps({"queues": [queue]}))],
            ),
        )
        r.zadd(BEATS, {"dead": int(r.time()[0]) * 1000 - 60_000})  # its beat stopped a minute ago
        async with Client(redis_url=redis_url) as client:
            await client.enqueue_many([Task(queue, "run", {"name": f"low{n}"}) for n in range(5)])
        reaper = Reaper(
            ar,
            KEYS,
            WorkerRegistry(),
            ttl=5.0,
            logger=capture_logger("test.prio.reaper"),
            retention=RETENTION,
        )
        assert await reaper.reap_once() == 1
    finally:
        await aclose_client(ar)
    assert inflight_count(r, queue) == 0
    back = [orjson.loads(raw) for raw in r.lrange(qkey(queue, "pending:4"), 0, -1)]
    assert [(e["params"], e["priority"], e["attempt"]) for e in back] == [({"name": "high"}, 4, 1)]
    assert r.llen(qkey(queue, "pending")) == 5
    order: list[str] = []

    async def record(payload: dict[str, Any]) -> None:
        order.append(payload["name"])

    server = new_server(redis_url, worker(queue, "run", record), concurrency=1, max_claim=1)
    async with running(server):
        await eventually(lambda: len(order) == 6, what="all ran")
    assert order == ["high"] + [f"low{n}" for n in range(5)]  # the reaped task still goes first


def test_priority_range_is_checked() -> None:
    for bad in (6, -6, 1.5, True, "1"):
        with pytest.raises(PayloadError, match="priority"):
            Task("q", "op", priority=bad).envelope()  # type: ignore[arg-type]
    plain = Task("q", "op", jid="j1").envelope()
    assert b"priority" not in plain  # the default leaves the envelope as it was
    assert Task("q", "op", jid="j1", priority=2).envelope().startswith(b'{"jid":"j1","priority":2,')


async def test_queue_weights_share_claims_3_to_1(redis_url: str, r: Any) -> None:
    claims: list[str] = []

    async def perform(payload: dict[str, Any]) -> None:
        claims.append(payload["q"])

    async with Client(redis_url=redis_url) as client:
        for q in ("w_emails", "w_reports"):
            await client.enqueue_many([Task(q, "run", {"q": q}) for _ in range(300)])
    workers = [worker(q, "run", perform) for q in ("w_emails", "w_reports")]
    server = new_server(
        redis_url, *workers, concurrency=1, max_claim=1, queue_weights={"w_emails": 3, "w_reports": 1}
    )
    async with running(server):
        await eventually(lambda: len(claims) >= 200, what="200 claims")
    first = claims[:200]  # both queues full throughout: a count, not a time
    assert first.count("w_emails") == 150
    assert first.count("w_reports") == 50


def test_queue_weights_setting_reads_text_and_refuses_bad_values() -> None:
    from fencekit import settings
    from fencekit.errors import ConfigError

    setting = settings.table(settings.ServerOptions)["queue_weights"]
    assert setting.from_text("emails=3, reports=1", "flag") == {"emails": 3, "reports": 1}
    assert setting.from_text("off", "flag") is None
    for bad in ("emails", "emails=x", "emails=0"):
        with pytest.raises(ConfigError, match="queue_weights"):
            setting.from_text(bad, "flag")
    with pytest.raises(ConfigError, match="queue_weights"):
        setting.checked({"emails": 1.5}, "argument")


def test_cli_enqueue_reads_priority() -> None:
    from fencekit.cli.enqueue import task_of

    task, _ = task_of({"queue": "q", "operation": "op", "priority": 3}, max_payload=1 << 20, keep_result=0)
    assert task.priority == 3
    with pytest.raises(PayloadError, match="priority"):
        task_of({"queue": "q", "operation": "op", "priority": 9}, max_payload=1 << 20, keep_result=0)


def test_task_functions_carry_their_priority() -> None:
    from fencekit import App
    from fencekit.errors import ConfigError

    app = App()

    @app.task(queue="q", priority=2)
    async def urgent(n: int) -> None:
        return None

    assert urgent.build(1).priority == 2
    assert urgent.options(priority=-1).build(1).priority == -1
    with pytest.raises(ConfigError, match="priority"):

        @app.task(queue="q", priority=7)
        async def bad(n: int) -> None:
            return None
