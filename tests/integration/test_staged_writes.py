"""``current_job().set_on_ack``: a fenced write staged by the job lands with its ack, in
``ack_claim.lua``, on a real Redis and a real ``Server``: only if the job returns and its ack is
accepted, atomically with it; never for a run that raised, was reaped, or fell below its job's
fence; beside a kept record and result; checked at once like ``set_if_fresh``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.queue_helpers import eventually, inflight, new_server, running, stats, worker

from fencekit import Client, JobStatus, Task, current_job
from fencekit.consume.job import MAX_STAGED

PLAIN = {"keep_result": 0}  # no record: the plain ack path


async def test_a_staged_write_lands_with_the_ack_and_not_before(redis_url: str, r: Any) -> None:
    staged, release = asyncio.Event(), asyncio.Event()

    async def perform(payload: dict[str, Any]) -> None:
        current_job().set_on_ack("{sw}:out", payload["v"])
        staged.set()
        await release.wait()

    async with (
        Client(redis_url=redis_url, **PLAIN) as client,
        running(new_server(redis_url, worker("sw", "w", perform))),
    ):
        await client.enqueue(Task("sw", "w", {"v": "42"}))
        await asyncio.wait_for(staged.wait(), 10)
        await asyncio.sleep(0.2)  # turns go by while the job runs: nothing is sent before its ack
        assert r.get("{sw}:out") is None
        release.set()
        await eventually(lambda: stats(r, "sw")["processed"] == 1, what="the ack")
        assert r.get("{sw}:out") == b"42"


async def test_a_run_that_raises_writes_nothing(redis_url: str, r: Any) -> None:
    async def perform(payload: dict[str, Any]) -> None:
        current_job().set_on_ack("{sr}:out", "never")
        raise RuntimeError("boom")

    server = new_server(redis_url, worker("sr", "w", perform, retry=False))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("sr", "w", {}))
        info = await eventually(lambda: _failed(client, jid), what="the failure")
        assert info
    assert r.get("{sr}:out") is None
    assert stats(r, "sr")["processed"] == 0


async def _failed(client: Client, jid: str) -> bool:
    info = await client.job(jid)
    return info is not None and info.status == JobStatus.FAILED


async def test_a_reaped_delivery_writes_nothing_and_the_next_one_writes(redis_url: str, r: Any) -> None:
    release = asyncio.Event()
    runs: list[int] = []

    async def perform(payload: dict[str, Any]) -> None:
        runs.append(current_job().token.value)
        current_job().set_on_ack(f"{{rp}}:run{len(runs)}", "written")
        if len(runs) == 1:
            await release.wait()

    server = new_server(redis_url, worker("rp", "w", perform))
    async with Client(redis_url=redis_url, **PLAIN) as client, running(server):
        await client.enqueue(Task("rp", "w", {}))
        await eventually(lambda: runs, what="the first run")
        assert server.services is not None
        await server.services.reaper.reap(server.consumer_id, forget_if_silent=False, queues=["rp"])
        release.set()  # the first run returns: its ack is refused, its write with it
        await eventually(lambda: stats(r, "rp")["processed"] == 1, what="the second run's ack")
    assert len(runs) == 2
    assert runs[1] > runs[0]
    assert r.get("{rp}:run1") is None
    assert r.get("{rp}:run2") == b"written"
    assert stats(r, "rp")["fenced_out"] == 1


async def test_a_delivery_below_its_jobs_fence_is_refused_whole(redis_url: str, r: Any) -> None:
    staged, release = asyncio.Event(), asyncio.Event()

    async def perform(payload: dict[str, Any]) -> None:
        current_job().set_on_ack("{sf}:out", "stale")
        staged.set()
        await release.wait()

    async with (
        Client(redis_url=redis_url, **PLAIN) as client,
        running(new_server(redis_url, worker("sf", "w", perform))),
    ):
        jid = await client.enqueue(Task("sf", "w", {}))
        await asyncio.wait_for(staged.wait(), 10)
        (token,) = inflight(r, "sf")
        r.set(f"fencekit:fence:{{sf}}:job:{jid}", token + 1)  # a newer delivery exists somewhere
        release.set()
        await eventually(lambda: stats(r, "sf")["fenced_out"] == 1, what="the refused ack")
        assert inflight(r, "sf") == {}  # refused and dropped, not left in flight
    assert r.get("{sf}:out") is None
    assert stats(r, "sf")["processed"] == 0


async def test_staged_writes_land_in_order_beside_a_kept_record_and_result(redis_url: str, r: Any) -> None:
    async def perform(payload: dict[str, Any]) -> dict[str, Any]:
        job = current_job()
        job.set_on_ack("{sk}:best", "e4")
        job.set_on_ack("{sk}:best", "d4")  # the later write wins, as two SETs would
        job.set_on_ack("{sk}:count", payload["n"])
        return {"best": "d4"}

    async with (
        Client(redis_url=redis_url) as client,
        running(new_server(redis_url, worker("sk", "w", perform))),
    ):
        jid = await client.enqueue(Task("sk", "w", {"n": 3}))
        assert await client.result(jid, timeout=10) == {"best": "d4"}
        assert (r.get("{sk}:best"), r.get("{sk}:count")) == (b"d4", b"3")
        info = await client.job(jid)
        assert info is not None
        assert info.status == JobStatus.DONE


@pytest.mark.parametrize(
    ("stage", "error"),
    [
        (lambda job: job.set_on_ack("{sc}:out", ["not", "a", "scalar"]), "TypeError"),
        (lambda job: job.set_on_ack("", "v"), "ConfigError"),
        (lambda job: [job.set_on_ack(f"{{sc}}:k{i}", i) for i in range(MAX_STAGED + 1)], "ValueError"),
    ],
    ids=["value", "key", "too-many"],
)
async def test_a_bad_staged_write_raises_in_the_job_and_nothing_is_written(
    redis_url: str, r: Any, stage: Any, error: str
) -> None:
    async def perform(payload: dict[str, Any]) -> str:
        try:
            stage(current_job())
        except Exception as exc:
            return type(exc).__name__
        return "accepted"

    async with (
        Client(redis_url=redis_url) as client,
        running(new_server(redis_url, worker("sc", "w", perform))),
    ):
        jid = await client.enqueue(Task("sc", "w", {}))
        raised = await client.result(jid, timeout=10)
    assert raised == error
    # what was staged before the error still rides the ack (the job chose to return)
    if error == "ValueError":
        assert r.get("{sc}:k0") == b"0"
        assert r.get(f"{{sc}}:k{MAX_STAGED}") is None
    else:
        assert r.keys("{sc}:*") == []


async def test_a_sync_task_stages_from_its_thread(redis_url: str, r: Any) -> None:
    class SyncWriter:
        queue = "ss"
        operation = "w"

        @staticmethod
        def perform(payload: dict[str, Any]) -> None:  # a plain def: run in the consumer's threads
            current_job().set_on_ack("{ss}:out", payload["v"])

    async with Client(redis_url=redis_url, **PLAIN) as client, running(new_server(redis_url, SyncWriter)):
        await client.enqueue(Task("ss", "w", {"v": 7}))
        await eventually(lambda: stats(r, "ss")["processed"] == 1, what="the ack")
    assert r.get("{ss}:out") == b"7"
