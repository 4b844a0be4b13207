"""Dedupe at enqueue on a real Redis: Task(unique_key=...) returns the live task's jid
(pending, running, finished within its retention), decided in one script, so racing
producers -- 50 clients, and several processes -- create exactly one task."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, qkey, running, stats, worker

from fencekit import Client, Enqueued, PayloadError, Task
from fencekit._redis import scripts
from fencekit._redis.run import arun
from fencekit.testing import RedisServer


class Charge:
    queue = "payments"
    operation = "charge"
    release: asyncio.Event | None = None
    runs: list[str] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> dict[str, Any]:
        cls.runs.append(payload["order"])
        if cls.release is not None:
            await cls.release.wait()
        return {"charged": payload["order"]}


async def test_a_duplicate_gets_the_live_task_s_jid_and_its_result(redis_url: str, r: Any) -> None:
    Charge.release, Charge.runs = asyncio.Event(), []
    server = new_server(redis_url, Charge)
    async with Client(redis_url=redis_url) as client:
        first = await client.enqueue_unique(Task("payments", "charge", {"order": 42}, unique_key="order-42"))
        assert first.created
        pending_dup = await client.enqueue_unique(
            Task("payments", "charge", {"order": 42}, unique_key="order-42")
        )
        assert pending_dup == Enqueued(first.jid, False)
        async with running(server):
            await eventually(lambda: Charge.runs == [42], what="the run")
            running_dup = await client.enqueue(
                Task("payments", "charge", {"order": 42}, unique_key="order-42")
            )
            assert running_dup == first.jid  # enqueue returns the existing jid too
            Charge.release.set()
            assert await client.result(first.jid, timeout=10) == {"charged": 42}
            finished_dup = await client.enqueue_unique(
                Task("payments", "charge", {"order": 42}, unique_key="order-42")
            )
            assert finished_dup == Enqueued(first.jid, False)
            assert await client.result(finished_dup.jid) == {"charged": 42}
            other = await client.enqueue_unique(
                Task("payments", "charge", {"order": 43}, unique_key="order-43")
            )
            assert other.created
            await client.result(other.jid, timeout=10)
    assert Charge.runs == [42, 43]  # the duplicates never ran
    s = stats(r, "payments")
    assert (s["enqueued"], s["deduped"], s["processed"]) == (2, 3, 2)


async def test_fifty_racing_producers_create_exactly_one_task(redis_url: str, r: Any) -> None:
    clients = [Client(redis_url=redis_url) for _ in range(50)]
    try:
        for c in clients:  # connected before the race
            await c.queues()
            await c.enqueue(Task("warm", "up"))
        start = asyncio.Event()

        async def race(c: Client) -> Enqueued:
            await start.wait()
            return await c.enqueue_unique(Task("race", "op", unique_key="the-one"))

        racers = [asyncio.ensure_future(race(c)) for c in clients]
        await asyncio.sleep(0.05)
        start.set()
        outcomes = await asyncio.gather(*racers)
    finally:
        for c in clients:
            await c.close()
    assert sum(o.created for o in outcomes) == 1
    assert len({o.jid for o in outcomes}) == 1
    assert r.llen(qkey("race", "pending")) == 1
    assert stats(r, "race")["deduped"] == 49


RACER = textwrap.dedent(
    """
    import asyncio, sys, time
    from fencekit import Client, Task

    async def main(url, start_at):
        clients = [Client(redis_url=url) for _ in range(10)]
        for c in clients:
            await c.queues()
        while time.time() < start_at:
            await asyncio.sleep(0.001)
        outs = await asyncio.gather(
            *(c.enqueue_unique(Task("procs", "op", unique_key="shared")) for c in clients)
        )
        for c in clients:
            await c.close()
        for o in outs:
            print(int(o.created), o.jid)

    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
    """
)


def test_racing_processes_create_exactly_one_task(tmp_path: Path, private_redis: RedisServer) -> None:
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    start_at = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), private_redis.url(0), repr(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        for _ in range(4)
    ]
    lines = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        lines += out.split("\n")
    outcomes = [line.split() for line in lines if line.strip()]
    assert len(outcomes) == 40
    assert sum(int(created) for created, _ in outcomes) == 1
    assert len({jid for _, jid in outcomes}) == 1
    client = private_redis.client()
    assert client.llen(qkey("procs", "pending")) == 1
    client.close()


async def test_a_key_is_free_again_once_its_task_is_forgotten_or_unique_for_passed(
    redis_url: str, r: Any
) -> None:
    class Quick:
        queue = "short"
        operation = "op"

        @classmethod
        async def perform(cls, payload: dict[str, Any]) -> str:
            return "ok"

    server = new_server(redis_url, Quick)
    async with Client(redis_url=redis_url) as client:
        # unique_for bounds the dedupe even while the first task still waits
        a = await client.enqueue_unique(Task("short", "op", unique_key="k1", unique_for=0.2))
        await asyncio.sleep(0.3)
        b = await client.enqueue_unique(Task("short", "op", unique_key="k1", unique_for=0.2))
        assert a.created
        assert b.created
        assert a.jid != b.jid
        # keep_result bounds it once the task finished
        c = await client.enqueue_unique(Task("short", "op", unique_key="k2", keep_result=0.3))
        async with running(server):
            assert await client.result(c.jid, timeout=10) == "ok"
            assert not (await client.enqueue_unique(Task("short", "op", unique_key="k2"))).created
            await eventually(lambda: r.exists(qkey("short", f"job:{c.jid}")) == 0, timeout=5)
            assert r.exists(qkey("short", "unique:k2")) == 0  # the key expired with the record
            again = await client.enqueue_unique(Task("short", "op", unique_key="k2", keep_result=0.3))
            assert again.created
            await client.result(again.jid, timeout=10)


async def test_without_records_a_key_dedupes_while_its_task_is_unfinished(redis_url: str, r: Any) -> None:
    async with Client(redis_url=redis_url, keep_result=0) as client:
        first = await client.enqueue_unique(Task("norec", "op", unique_key="k"))
        assert not (await client.enqueue_unique(Task("norec", "op", unique_key="k"))).created
        assert await client.queue("norec").purge() == 1  # gone: its record and its key with it
        assert r.exists(qkey("norec", "unique:k")) == 0
        assert (await client.enqueue_unique(Task("norec", "op", unique_key="k"))).created
    assert first.created


async def test_enqueue_many_dedupes_each_unique_task_and_keeps_the_order(redis_url: str, r: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        held = await client.enqueue(Task("mix", "op", unique_key="held"))
        jids = await client.enqueue_many(
            [
                Task("mix", "op", {"i": 0}),
                Task("mix", "op", {"i": 1}, unique_key="held"),
                Task("mix", "op", {"i": 2}, unique_key="new"),
                Task("mix", "op", {"i": 3}),
            ]
        )
    assert jids[1] == held
    assert len(set(jids)) == 4
    assert r.llen(qkey("mix", "pending")) == 4  # held, 0, new, 3


@pytest.mark.parametrize("key", ["", "two words", "tab\\there", "x" * 201, 42])
async def test_a_bad_unique_key_is_refused_at_enqueue(redis_url: str, key: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        rule = r"unique_key must (be a str \(|not contain .* \(|be )1 to 200 printable characters"
        with pytest.raises(PayloadError, match=rule):
            await client.enqueue(
                Task("bad", "op", unique_key=key.replace("\\t", "\t") if isinstance(key, str) else key)
            )


@pytest.mark.parametrize("layout", ["uk", "whole name"])
async def test_a_unique_task_s_record_names_its_key_by_the_key_alone(
    redis_url: str, r: Any, layout: str
) -> None:
    """A record holds only ``<key>`` of the unique key ``P:{Q}:unique:<key>`` it holds (field
    ``uk``), so a 50-character key keeps it a listpack (the whole name, 73 bytes, made it a
    hashtable). A record written before (the whole name in ``unique``) still reads: its failure
    gives the key the record's retention, and dropping it (the admin page) or a purge deletes
    the key."""
    key = "sha1:" + "9f" * 20 + ":game"  # 50 characters
    assert len(key) == 50

    async def crash(payload: dict[str, Any]) -> None:
        raise RuntimeError("the engine crashed")

    def as_before(jid: str, unique_key: str) -> None:  # the layout of a record written before
        record = qkey("uniq", f"job:{jid}")
        r.hdel(record, "uk")
        r.hset(record, "unique", qkey("uniq", f"unique:{unique_key}"))

    async with Client(redis_url=redis_url, keep_result=60) as client:
        held = await client.enqueue_unique(Task("uniq", "op", unique_key=key))
        record = qkey("uniq", f"job:{held.jid}")
        if layout == "uk":
            assert r.hget(record, "uk") == key.encode()
            assert not r.hexists(record, "unique")
            assert r.object("encoding", record) == b"listpack"
        else:
            as_before(held.jid, key)
        assert not (await client.enqueue_unique(Task("uniq", "op", unique_key=key))).created
        unique = qkey("uniq", f"unique:{key}")
        assert r.pttl(unique) == -1  # no expiry while its task is unfinished
        async with running(new_server(redis_url, worker("uniq", "op", crash, retry=False))):
            await eventually(lambda: r.hget(record, "state") == b"failed", timeout=10)
        assert 0 < r.pttl(unique) <= 60_000  # the failure gave the key the record's retention
        admin = client.redis
        index = qkey("uniq", "failed")
        assert await arun(admin, scripts.record_drop(index=index, record=record)) == 1
        assert r.exists(unique) == 0

        waiting = await client.enqueue_unique(Task("uniq", "op", unique_key=key))
        assert waiting.created
        if layout == "whole name":
            as_before(waiting.jid, key)
        purge = scripts.purge(
            pending=qkey("uniq", "pending"), stats=qkey("uniq", "stats"), record_prefix=qkey("uniq", "job:")
        )
        assert await arun(admin, purge) == 1
        assert r.exists(unique) == 0
        assert (await client.enqueue_unique(Task("uniq", "op", unique_key=key))).created
