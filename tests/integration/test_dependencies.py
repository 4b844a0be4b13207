"""Dependencies and chains on a real Redis and a real ``Server``: a task held (status
``waiting``) until every parent succeeded, then run once with their results; a parent that
fails for good cancels its dependants (the reason naming it) unless they say
``on_parent_failure="run"``; bad parents and cycles refused at enqueue; a chain of 5 across a
Redis restart with an AOF."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, running, worker

from fencekit import Client, JobCancelled, JobStatus, PayloadError, SyncClient, Task, current_job
from fencekit.testing import RedisServer


class Seen:
    def __init__(self) -> None:
        self.runs: list[tuple[str, dict[str, Any]]] = []  # (name, parent_results)


def workers(seen: Seen) -> list[type]:
    async def step(payload: dict[str, Any]) -> Any:
        seen.runs.append((payload["name"], current_job().parent_results))
        if payload.get("fail"):
            raise RuntimeError(f"{payload['name']} broke")
        return payload["name"] + "!"

    return [worker("steps", "step", step, retry=False)]


def step(name: str, **kwargs: Any) -> Task:
    fail = kwargs.pop("fail", False)
    return Task("steps", "step", {"name": name, "fail": fail}, **kwargs)


async def test_a_chain_runs_in_order_and_each_link_reads_the_one_before(redis_url: str) -> None:
    seen = Seen()
    server = new_server(redis_url, *workers(seen), concurrency=4)
    async with Client(redis_url=redis_url) as client:
        chain = await client.chain([step("fetch"), step("analyse"), step("report")])
        infos = [await client.job(jid) for jid in chain.jids]
        assert [i.status for i in infos if i is not None] == [
            JobStatus.PENDING,
            JobStatus.WAITING,
            JobStatus.WAITING,
        ]
        async with running(server):
            assert await chain.result(timeout=20) == "report!"
    fetch, analyse, _ = chain.jids
    assert seen.runs == [("fetch", {}), ("analyse", {fetch: "fetch!"}), ("report", {analyse: "analyse!"})]


async def test_a_task_with_two_parents_waits_for_both_and_runs_once(redis_url: str) -> None:
    seen = Seen()
    server = new_server(redis_url, *workers(seen), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        a = await client.enqueue(step("a"))
        b = await client.enqueue(step("b"))
        joined = await client.enqueue(step("join", depends_on=[a, b]))
        assert await client.result(joined, timeout=20) == "join!"
        await asyncio.sleep(0.3)  # a second release would run it again here
    assert [name for name, _ in seen.runs].count("join") == 1
    assert dict(seen.runs)["join"] == {a: "a!", b: "b!"}


async def test_a_parent_that_fails_cancels_its_dependants_down_the_chain_naming_it(redis_url: str) -> None:
    seen = Seen()
    server = new_server(redis_url, *workers(seen), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        chain = await client.chain([step("one"), step("two", fail=True), step("three"), step("four")])
        with pytest.raises(JobCancelled):
            await chain.result(timeout=20)
        three = await client.job(chain.jids[2])
        four = await client.job(chain.jids[3])
    assert [name for name, _ in seen.runs] == ["one", "two"]
    assert three is not None
    assert four is not None
    assert three.status is JobStatus.CANCELLED
    assert three.error is not None
    assert chain.jids[1] in three.error.message
    assert "failed" in three.error.message
    assert four.error is not None
    assert chain.jids[2] in four.error.message  # cancelled because three was


async def test_on_parent_failure_run_runs_it_with_the_results_that_exist(redis_url: str) -> None:
    seen = Seen()
    server = new_server(redis_url, *workers(seen), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        good = await client.enqueue(step("good"))
        bad = await client.enqueue(step("bad", fail=True))
        cleanup = await client.enqueue(step("cleanup", depends_on=[good, bad], on_parent_failure="run"))
        assert await client.result(cleanup, timeout=20) == "cleanup!"
    assert dict(seen.runs)["cleanup"] == {good: "good!"}


async def test_cancelling_a_waiting_task_cancels_it_and_its_dependants(redis_url: str) -> None:
    seen = Seen()
    server = new_server(redis_url, *workers(seen), concurrency=2)
    async with Client(redis_url=redis_url) as client:
        parent = await client.enqueue(step("parent"))
        child = await client.enqueue(step("child", depends_on=[parent]))
        grandchild = await client.enqueue(step("grandchild", depends_on=[child]))
        assert await client.cancel(child) is True
        async with running(server):
            await client.result(parent, timeout=20)
            with pytest.raises(JobCancelled):
                await client.result(grandchild, timeout=20)
    assert [name for name, _ in seen.runs] == ["parent"]


async def test_bad_parents_and_cycles_are_refused_at_enqueue(redis_url: str) -> None:
    async with Client(redis_url=redis_url) as client:
        with pytest.raises(PayloadError, match="unknown or its record expired"):
            await client.enqueue(step("orphan", depends_on=["no-such-task"]))
        with pytest.raises(PayloadError, match="itself"):
            await client.enqueue(step("self", jid="me", depends_on=["me"]))
        with pytest.raises(PayloadError, match="twice"):
            await client.enqueue(step("twice", depends_on=["x", "x"]))
        with pytest.raises(PayloadError, match="list of jids"):
            await client.enqueue(step("str", depends_on="abc"))  # type: ignore[arg-type]
        with pytest.raises(PayloadError, match="on_parent_failure"):
            await client.enqueue(step("bad", depends_on=["a"], on_parent_failure="maybe"))
        no_record = await client.enqueue(step("plain", keep_result=0))
        with pytest.raises(PayloadError, match="keep a record"):
            await client.enqueue(step("late", depends_on=[no_record]))
        first = await client.enqueue(step("first", jid="a1"))
        await client.enqueue(step("b", jid="b1", depends_on=[first]))
        with pytest.raises(PayloadError, match="cycle"):  # a1 again, now waiting on b1, which waits on a1
            await client.enqueue(step("again", jid="a1", depends_on=["b1"]))
        with pytest.raises(Exception, match="no delay"):
            await client.enqueue(step("later", depends_on=[first]), delay=5)


def test_the_sync_client_chains_too(redis_url: str) -> None:
    with SyncClient(redis_url=redis_url) as client:
        jids = client.chain([step("x"), step("y")])
        info = client.job(jids[1])
    assert info is not None
    assert info.status is JobStatus.WAITING


@pytest.mark.slow
async def test_a_chain_of_five_survives_a_redis_restart_with_an_aof(
    tmp_path: Path, server_binary: str
) -> None:
    redis = RedisServer(
        tmp_path / "redis", binary=server_binary, appendonly=True, config={"appendfsync": "always"}
    )
    redis.start()
    seen = Seen()
    gate = asyncio.Event()

    async def slow(payload: dict[str, Any]) -> Any:
        seen.runs.append((payload["name"], current_job().parent_results))
        if payload["name"] == "s2":
            await gate.wait()
        return payload["name"]

    try:
        url = redis.url()
        server = new_server(url, worker("steps", "step", slow), concurrency=2, wait_for_redis=30.0)
        async with Client(redis_url=url) as client, running(server):
            chain = await client.chain([step(f"s{i}") for i in range(5)])
            await eventually(lambda: [n for n, _ in seen.runs] == ["s0", "s1", "s2"], timeout=20)
            redis.stop()
            gate.set()  # s2 finishes while Redis is down: its ack waits for it
            await asyncio.sleep(1.0)
            redis.start()
            assert await chain.result(timeout=60) == "s4"
    finally:
        redis.cleanup()
    names = [n for n, _ in seen.runs]
    assert names[:3] == ["s0", "s1", "s2"]
    assert sorted(set(names)) == ["s0", "s1", "s2", "s3", "s4"]
    assert names.count("s3") == 1
    assert names.count("s4") == 1
    assert dict(seen.runs)["s4"] == {chain.jids[3]: "s3"}
