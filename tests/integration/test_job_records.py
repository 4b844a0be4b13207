"""A task's record on a real Redis: status and result by jid, result() woken by the
finishing ack, failures kept with their traceback and run again, progress, retention
(records that expire, a queue that keeps at most keep_finished), a stale delivery whose
result never lands, and result() for a task run by a real pool child."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.queue_helpers import eventually, new_server, qkey, running, stats, worker
from tests.servers import client_lists, node_of, nodes

import fencekit.produce._results
from fencekit import (
    Client,
    FencedOutError,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    JobStatus,
    Task,
    current_job,
)
from fencekit._redis import scripts
from fencekit._redis.clients import async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit.consume import _settle as settle
from fencekit.consume._settle import Delivery, Retention
from fencekit.jobs import records
from fencekit.testing import RedisServer

KEYS = KeySpace()
RETENTION = Retention(fence_ttl_ms=60_000, keep_dead=10)


class Gate:
    """Workers wait on it, so the test can look at a running task."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()


# -- status and result -------------------------------------------------------------------------


async def test_a_task_s_life_read_by_jid_from_pending_to_done(redis_url: str, r: Any) -> None:
    gate = Gate()

    async def analyse(payload: dict[str, Any]) -> dict[str, Any]:
        gate.started.set()
        await current_job().progress(0.4, "parsed 40 of 100 games")
        await gate.release.wait()
        return {"best": "e4", "n": payload["n"]}

    server = new_server(redis_url, worker("games", "analyse", analyse))
    async with Client(redis_url=redis_url) as client:
        before = time.time()
        jid = await client.enqueue(Task("games", "analyse", {"n": 7}))
        later = await client.enqueue(Task("games", "analyse", {"n": 8}), delay=60)
        info = await client.job(jid)
        assert info is not None
        assert (info.status, info.queue, info.operation, info.params, info.attempt) == (
            JobStatus.PENDING,
            "games",
            "analyse",
            {"n": 7},
            1,  # the run it waits for
        )
        assert info.enqueued_at is not None
        assert before - 1 <= info.enqueued_at <= time.time() + 1
        assert (info.started_at, info.finished_at, info.result) == (None, None, None)
        waiting = await client.job(later, queue="games")
        assert waiting is not None
        assert waiting.status is JobStatus.SCHEDULED
        assert waiting.due_at is not None
        assert waiting.due_at == pytest.approx(time.time() + 60, abs=5)

        async with running(server):
            await asyncio.wait_for(gate.started.wait(), 10)
            running_info = await eventually(lambda: client.job(jid), what="the record")
            running_info = await eventually(
                lambda: _with_progress(client, jid), what="the running task with its progress"
            )
            assert running_info.status is JobStatus.RUNNING
            assert running_info.token is not None
            assert running_info.started_at == pytest.approx(time.time(), abs=5)  # its claim's Redis time
            assert running_info.progress is not None
            assert (running_info.progress.fraction, running_info.progress.message) == (
                0.4,
                "parsed 40 of 100 games",
            )
            gate.release.set()
            assert await client.result(jid, timeout=10) == {"best": "e4", "n": 7}
            done = await client.job(jid)
        assert done is not None
        assert done.status is JobStatus.DONE
        assert done.result == {"best": "e4", "n": 7}
        assert done.finished_at is not None
        assert done.started_at is not None
        assert done.started_at <= done.finished_at
        assert done.token == running_info.token
        assert done.progress == running_info.progress  # the last report stays with the record
        assert 0 < r.pttl(qkey("games", f"job:{jid}")) <= 3_600_000  # keep_result's default: 1 h
        assert await client.job("no-such-jid") is None
        with pytest.raises(JobNotFound, match="no record of task no-such-jid"):
            await client.result("no-such-jid")


async def _with_progress(client: Client, jid: str) -> Any:
    info = await client.job(jid)
    return info if info is not None and info.progress is not None else None


async def subscribed(r: Any, queue: str) -> None:
    """Until a connection is subscribed to ``queue``'s done channel: a ``result()`` wait is listening."""
    channel = qkey(queue, "done")
    node = node_of(r, channel)  # on a Redis Cluster, the node of the channel's slot
    await eventually(
        lambda: int(node.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1]) >= 1,
        what=f"a subscriber on {channel}",
    )


async def test_result_is_woken_by_the_finishing_ack_not_by_a_re_read(
    redis_url: str, r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the safety re-read pushed out to a minute and no deadline (a wait re-reads at its
    deadline), only the ack's message can end the wait; ``wait_for`` fails the test otherwise."""
    monkeypatch.setattr(fencekit.produce._results, "SAFETY_REREAD", 60.0)
    release = asyncio.Event()
    finished_at: list[float] = []

    async def slow(payload: dict[str, Any]) -> str:
        await release.wait()
        finished_at.append(time.perf_counter())
        return "ok"

    server = new_server(redis_url, worker("wake", "slow", slow))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("wake", "slow"))
        waiter = asyncio.ensure_future(client.result(jid))
        await subscribed(r, "wake")  # the wait subscribes, then reads "running"
        assert not waiter.done()
        release.set()
        assert await asyncio.wait_for(waiter, 20) == "ok"
        woke = time.perf_counter()
    print(f"\n[result() wake] {1000 * (woke - finished_at[0]):.2f} ms from the job's return to result()")


async def test_a_failure_a_cancel_and_an_expiry_wake_result_without_a_re_read(
    redis_url: str, r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fail.lua, cancel.lua and drop.lua publish the jid as the ack does: ``result()`` raises at once.

    As above: no re-read within the test (none before a minute, no deadline), only the message.
    """
    monkeypatch.setattr(fencekit.produce._results, "SAFETY_REREAD", 60.0)
    release = asyncio.Event()

    async def broken(payload: dict[str, Any]) -> None:
        await release.wait()
        raise ValueError("broken on purpose")

    async def forever(payload: dict[str, Any]) -> None:
        await asyncio.Event().wait()

    # two queues: each wait's subscription shows on its own channel (waits on one queue share one)
    server = new_server(
        redis_url,
        worker("wake2", "broken", broken, retry=False),
        worker("wake2s", "forever", forever),
        concurrency=4,
    )
    async with Client(redis_url=redis_url) as client, running(server):
        failing = await client.enqueue(Task("wake2", "broken"))
        stuck = await client.enqueue(Task("wake2s", "forever"))
        waits = [asyncio.ensure_future(client.result(jid)) for jid in (failing, stuck)]
        await subscribed(r, "wake2")  # each wait subscribes, then reads "running"
        await subscribed(r, "wake2s")
        assert not any(w.done() for w in waits)
        release.set()
        with pytest.raises(JobFailed, match="broken on purpose"):
            await asyncio.wait_for(waits[0], 20)
        assert await client.cancel(stuck) is True
        with pytest.raises(JobCancelled):
            await asyncio.wait_for(waits[1], 20)
    expiring = new_server(redis_url, worker("wake3", "late", forever))
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("wake3", "late", expires=0.05))
        (raw,) = r.lrange(qkey("wake3", "pending"), 0, -1)
        expires_at = orjson.loads(raw)["expires_at"]  # Unix ms, judged by the claiming host's clock
        wait = asyncio.ensure_future(client.result(jid))
        await subscribed(r, "wake3")  # the wait subscribes, then reads "pending"
        # the task expires before any consumer claims it
        await eventually(lambda: time.time_ns() // 1_000_000 > expires_at, what="the task expired")
        assert not wait.done()
        async with running(expiring):
            with pytest.raises(JobExpired):
                await asyncio.wait_for(wait, 20)


async def test_result_times_out_with_the_builtin_timeout_error(redis_url: str) -> None:
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("nobody", "runs-it"))
        with pytest.raises(TimeoutError, match=f"task {jid} did not finish within 0.3s"):
            await client.result(jid, timeout=0.3)


async def test_many_concurrent_result_calls_share_one_subscription(redis_url: str, r: Any) -> None:
    gate = asyncio.Event()

    async def double(payload: dict[str, Any]) -> int:
        await gate.wait()  # held until every wait is in: a job done before its wait never subscribes
        return int(payload["n"]) * 2

    server = new_server(redis_url, worker("many", "double", double), concurrency=16)
    async with Client(redis_url=redis_url) as client, running(server):
        jids = await client.enqueue_many([Task("many", "double", {"n": i}) for i in range(100)])
        waits = asyncio.gather(*(client.result(j) for j in jids))
        await eventually(lambda: client._waiter is not None and len(client._waiter._waiting) == 100)
        done = qkey("many", "done")

        def subscribers() -> list[int]:  # on every node: the subscription is where the client put it
            return [int(node.execute_command("PUBSUB", "SHARDNUMSUB", done)[1]) for node in nodes(r)]

        # One connection for all hundred waits. Eventually: under load the listener may be between
        # a dropped connection and its resubscription (ResultWaiter._listen) when this looks.
        try:
            await eventually(lambda: sum(subscribers()) == 1, what="one subscription for all the waits")
        except TimeoutError:
            raise AssertionError(
                f"subscriptions per node {subscribers()} (the key's node by the map: "
                f"{node_of(r, done).connection_pool.connection_kwargs.get('port')}); pub/sub connections: "
                f"{[c for c in client_lists(r) if str(c.get('ssub', '0')) != '0']}"
            ) from None
        gate.set()
        assert await asyncio.wait_for(waits, 30) == [2 * i for i in range(100)]


# -- failures ------------------------------------------------------------------------------


async def test_a_failure_is_kept_with_its_traceback_and_can_run_again(redis_url: str, r: Any) -> None:
    fixed: list[bool] = []

    async def parse_game(payload: dict[str, Any]) -> str:
        if not fixed:
            return payload["lines"]  # KeyError: the producer forgot "lines"
        return "parsed"

    server = new_server(redis_url, worker("pgn", "parse", parse_game, retry=False))
    async with Client(redis_url=redis_url, keep_result=0) as client, running(server):
        jid = await client.enqueue(Task("pgn", "parse", {"id": 1}))  # no record while it lives ...
        await eventually(lambda: client.job(jid), what="the failure's record")  # ... one once it failed
        with pytest.raises(JobFailed, match=f"task {jid} failed: KeyError: 'lines'") as caught:
            await client.result(jid, timeout=10)
        error = caught.value.error
        assert error.type == "KeyError"
        assert error.message == "'lines'"
        assert "Traceback (most recent call last)" in error.traceback
        assert 'return payload["lines"]' in error.traceback
        info = await client.job(jid)
        assert info is not None
        assert (info.status, info.params, info.attempt) == (JobStatus.FAILED, {"id": 1}, 1)
        assert r.pttl(qkey("pgn", f"job:{jid}")) == -1  # kept until keep_failed pushes it out
        handle = client.queue("pgn")
        assert [f.jid for f in await handle.failed()] == [jid]
        assert await handle.failed_count() == 1

        fixed.append(True)
        assert await handle.retry_failed(jid) == 1
        assert await handle.retry_failed(jid) == 0  # no longer a kept failure
        await eventually(lambda: stats(r, "pgn")["processed"] == 1, timeout=10, what="the retried run")
        assert await handle.failed() == []
    s = stats(r, "pgn")
    assert (s["failed"], s["processed"], s["revived"]) == (1, 1, 1)
    assert r.exists(qkey("pgn", f"job:{jid}")) == 0  # the new attempt kept none (keep_result=0)


async def test_retry_failed_without_a_jid_runs_every_kept_failure(redis_url: str, r: Any) -> None:
    broken = [True]

    async def flaky(payload: dict[str, Any]) -> int:
        if broken[0]:
            raise RuntimeError(f"broken {payload['i']}")
        return int(payload["i"])

    server = new_server(redis_url, worker("bulk", "run", flaky, retry=False), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        jids = await client.enqueue_many([Task("bulk", "run", {"i": i}) for i in range(5)])
        await eventually(lambda: stats(r, "bulk")["failed"] == 5, timeout=10)
        kept = await client.queue("bulk").failed()
        assert sorted(f.jid for f in kept) == sorted(jids)
        assert all(f.error is not None and f.error.message.startswith("broken") for f in kept)
        broken[0] = False
        assert await client.queue("bulk").retry_failed() == 5
        assert [await client.result(j, timeout=10) for j in jids] == [0, 1, 2, 3, 4]


async def test_a_worker_can_opt_out_of_keeping_its_failures(redis_url: str, r: Any) -> None:
    async def boom(payload: dict[str, Any]) -> None:
        raise ValueError("nope")

    server = new_server(redis_url, worker("quiet", "boom", boom, retry=False, keep_failed=False))
    async with Client(redis_url=redis_url, keep_result=0) as client, running(server):
        jid = await client.enqueue(Task("quiet", "boom"))
        await eventually(lambda: stats(r, "quiet")["failed"] == 1, timeout=10)
        assert await client.job(jid) is None
        assert await client.queue("quiet").failed() == []


async def test_the_newest_keep_failed_failures_are_kept(redis_url: str, r: Any) -> None:
    async def boom(payload: dict[str, Any]) -> None:
        raise ValueError(str(payload["i"]))

    server = new_server(redis_url, worker("capped", "boom", boom, retry=False), keep_failed=3)
    async with Client(redis_url=redis_url, keep_result=0) as client, running(server):
        for i in range(8):  # one at a time, so "newest" is well defined
            await client.enqueue(Task("capped", "boom", {"i": i}))
            await eventually(lambda i=i: stats(r, "capped")["failed"] == i + 1, timeout=10)
        kept = await client.queue("capped").failed()
    assert [f.error.message for f in kept if f.error] == ["7", "6", "5"]
    assert len(list(r.scan_iter(match=qkey("capped", "job:*")))) == 3


async def test_a_retried_task_s_record_says_scheduled_with_its_last_error(redis_url: str, r: Any) -> None:
    async def fails_once(payload: dict[str, Any]) -> str:
        if current_job().attempt == 0:
            raise RuntimeError("first run")
        return "second run"

    server = new_server(redis_url, worker("again", "run", fails_once, retry_count=1))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("again", "run"))
        info = await eventually(lambda: _scheduled(client, jid), timeout=10, what="the retry")
        assert info.attempt == 2  # the run it waits for
        assert info.error is not None
        assert str(info.error) == "RuntimeError: first run"
        assert await client.result(jid, timeout=10) == "second run"
        done = await client.job(jid)
    assert done is not None
    assert (done.status, done.attempt) == (JobStatus.DONE, 2)  # done on its second run


async def _scheduled(client: Client, jid: str) -> Any:
    info = await client.job(jid)
    return info if info is not None and info.status is JobStatus.SCHEDULED else None


# -- retention -------------------------------------------------------------------------------


async def test_keep_result_zero_keeps_no_record_and_a_task_can_ask_for_one(redis_url: str, r: Any) -> None:
    async def echo(payload: dict[str, Any]) -> Any:
        return payload

    server = new_server(redis_url, worker("ret", "echo", echo))
    async with Client(redis_url=redis_url, keep_result=0) as client:
        plain = await client.enqueue(Task("ret", "echo", {"a": 1}))
        kept = await client.enqueue(Task("ret", "echo", {"b": 2}, keep_result=0.5))
        assert await client.job(plain) is None
        pending = await client.job(kept)
        assert pending is not None
        assert pending.status is JobStatus.PENDING
        assert r.pttl(qkey("ret", f"job:{kept}")) == -1  # no expiry while unfinished
        async with running(server):
            assert await client.result(kept, timeout=10) == {"b": 2}
            await eventually(lambda: stats(r, "ret")["processed"] == 2, timeout=10)
        with pytest.raises(JobNotFound):
            await client.result(plain)
        assert 0 < r.pttl(qkey("ret", f"job:{kept}")) <= 500
        await eventually(lambda: r.exists(qkey("ret", f"job:{kept}")) == 0, timeout=5, what="the expiry")
        assert await client.job(kept) is None
    assert not list(r.scan_iter(match=qkey("ret", "job:*")))  # no key of either task left behind


async def test_a_worker_s_keep_result_records_what_its_producer_did_not(redis_url: str) -> None:
    async def answer(payload: dict[str, Any]) -> int:
        return 42

    server = new_server(redis_url, worker("wk", "answer", answer, keep_result=60))
    async with Client(redis_url=redis_url, keep_result=0) as client, running(server):
        jid = await client.enqueue(Task("wk", "answer", {"q": "life"}))
        info = await eventually(lambda: client.job(jid), timeout=10, what="the record the ack wrote")
    assert (info.status, info.result, info.operation, info.params) == (
        JobStatus.DONE,
        42,
        "answer",
        {"q": "life"},
    )


async def test_a_value_that_is_not_json_fails_the_task_with_a_clear_error(redis_url: str, r: Any) -> None:
    async def odd(payload: dict[str, Any]) -> object:
        return {1, 2}

    server = new_server(redis_url, worker("odd", "run", odd))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("odd", "run"))
        with pytest.raises(JobFailed, match="return value is not plain JSON: result: set is not JSON"):
            await client.result(jid, timeout=10)
    assert stats(r, "odd")["processed"] == 0


async def test_expired_and_purged_tasks_say_so_in_their_records(redis_url: str, r: Any) -> None:
    async def never(payload: dict[str, Any]) -> None:
        raise AssertionError("must not run")

    server = new_server(redis_url, worker("gone", "run", never))
    async with Client(redis_url=redis_url) as client:
        late = await client.enqueue(Task("gone", "run", expires=0.05), delay=0.3)
        purged = await client.enqueue_many([Task("gone", "other") for _ in range(3)])
        assert await client.queue("gone").purge() == 3
        for jid in purged:
            assert await client.job(jid) is None
        async with running(server):
            with pytest.raises(JobExpired, match=f"task {late} expired before it started"):
                await client.result(late, timeout=10)
        info = await client.job(late)
    assert info is not None
    assert (info.status, info.started_at) == (JobStatus.EXPIRED, None)


# -- fencing of results ------------------------------------------------------------------------


async def test_a_stale_delivery_s_result_never_lands_after_a_redelivery(redis_url: str, r: Any) -> None:
    """Delivery 1 is returned (as a reaper would), delivery 2 finishes, then delivery 1's ack arrives."""
    ar = async_client(redis_url)
    qk = KEYS.queue("stale")
    try:
        async with Client(redis_url=redis_url) as client:
            jid = await client.enqueue(Task("stale", "op"))
        first = await arun(ar, _claim(qk, "c1"))
        old_token, raw = int(first[1]), first[3]
        verdict = settle.after_stop(
            KEYS, Delivery("stale", qk.inflight("c1"), old_token, raw), retention=RETENTION
        )
        await arun(ar, verdict.call)
        second = await arun(ar, _claim(qk, "c2"))
        new_token = int(second[1])
        assert new_token > old_token
        assert (await arun(ar, _ack(qk, "c2", new_token, jid, "new")))[0] == []
        refused = await arun(ar, _ack(qk, "c1", old_token, jid, "old"))
        assert [int(t) for t in refused[0]] == [old_token]
        async with Client(redis_url=redis_url) as client:
            info = await client.job(jid)
            assert info is not None
            assert (info.status, info.result, info.token) == (JobStatus.DONE, "new", new_token)
            assert await client.result(jid) == "new"
        assert stats(r, "stale")["processed"] == 1
        with pytest.raises(FencedOutError):  # nor can the stale delivery report progress
            await arun(
                ar,
                scripts.job_progress(
                    inflight=qk.inflight("c1"), record=qk.job(jid), token=old_token, progress=b"{}"
                ),
            )
    finally:
        await ar.aclose()


def _claim(qk: Any, consumer: str) -> scripts.Call:
    return _claim_n(qk, consumer, 1)


def _ack(qk: Any, consumer: str, token: int, jid: str, result: str) -> scripts.Call:
    return scripts.ack_claim(
        pending=qk.pending,
        inflight=qk.inflight(consumer),
        token_counter=qk.token_counter,
        stats=qk.stats,
        wake=qk.wake,
        want=0,
        acks=[],
        recorded=[scripts.RecordedAck(qk.job(jid), token, jid, orjson.dumps(result), 60_000, b"")],
        finished=qk.finished,
        channel=qk.done_channel,
        keep_finished=100,
    )


# -- a real pool child ---------------------------------------------------------------------------

POOL_APP = textwrap.dedent(
    """
    import os

    class Square:
        queue = "squares"
        operation = "square"

        @classmethod
        async def perform(cls, payload):
            return {"n": payload["n"], "square": payload["n"] ** 2, "pid": os.getpid()}

    WORKERS = [Square]
    """
)


async def test_result_of_tasks_run_by_pool_children(tmp_path: Path, private_redis: RedisServer) -> None:
    (tmp_path / "squares_app.py").write_text(POOL_APP)
    url = private_redis.url(0)
    log = (tmp_path / "pool.log").open("wb")
    pool = subprocess.Popen(
        [sys.executable, "-m", "fencekit.pool", "squares_app:WORKERS", "--procs", "2", "--redis-url", url,
         "--web-port", "off"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with Client(redis_url=url) as client:
            jids = await client.enqueue_many([Task("squares", "square", {"n": n}) for n in range(40)])
            results = await asyncio.wait_for(asyncio.gather(*(client.result(j) for j in jids)), 60)
        assert [res["square"] for res in results] == [n * n for n in range(40)]
        assert pool.poll() is None
        assert {res["pid"] for res in results} - {pool.pid}  # children ran them, not the supervisor
    finally:
        pool.terminate()
        pool.wait(30)
        log.close()
    assert pool.returncode == 0, (tmp_path / "pool.log").read_text()


# -- Redis Cluster ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_record_scripts_run_on_redis_cluster(tmp_path: Path, server_binary: str) -> None:
    """Each record script stays in its queue's slot: enqueue with records, a recorded ack (and its
    SPUBLISH), job_info, progress, a kept failure and its retry, expiry, dedupe, cancel, purge."""
    from fencekit._redis.run import run
    from fencekit.jobs import codec
    from fencekit.testing.cluster import LocalCluster

    with LocalCluster(tmp_path / "cluster", binary=server_binary) as cluster:
        client = cluster.client()
        try:
            slots = set()
            for queue in ("emails", "reports", "sms"):
                qk = KEYS.queue(queue)
                slots.add(client.keyslot(qk.pending))
                tasks = [Task(queue, "op", {"n": i}) for i in range(4)]
                envs = [t.envelope(keep_result=60) for t in tasks]
                jids = [str(t.jid) for t in tasks]
                call = scripts.enqueue_tracked(
                    pending=qk.pending,
                    scheduled=qk.scheduled,
                    stats=qk.stats,
                    wake=qk.wake,
                    delay_ms=0,
                    keep_ms=60_000,
                    envelopes=envs,
                    records=[qk.job(j) for j in jids],
                )
                assert run(client, call) == 4
                reply = run(client, _claim_n(qk, "c1", 3))
                first = int(reply[1])
                claimed = {codec.decode(raw).jid: first + i for i, raw in enumerate(reply[3:])}
                done_jid, fail_jid, cancel_jid = list(claimed)
                assert run(
                    client,
                    scripts.job_progress(
                        inflight=qk.inflight("c1"), record=qk.job(done_jid), token=claimed[done_jid],
                        progress=b'{"fraction": 0.5, "message": ""}',
                    ),
                ) == 1  # fmt: skip
                info = run(
                    client,
                    scripts.job_info(record=qk.job(done_jid), inflight=[qk.inflight("c1")], jid=done_jid),
                )
                assert int(info[1]) == claimed[done_jid]  # found running in the in-flight hash
                ack = _ack(qk, "c1", claimed[done_jid], done_jid, "ok")
                assert run(client, ack)[0] == []
                assert client.hget(qk.job(done_jid), "state") == b"done"
                failed = settle.fail(
                    KEYS,
                    Delivery(queue, qk.inflight("c1"), claimed[fail_jid]),
                    jid=fail_jid,
                    retention=RETENTION,
                )
                assert run(client, failed) == 1
                assert client.llen(qk.failed) == 1
                kept = {k.decode(): v for k, v in client.hgetall(qk.job(fail_jid)).items()}
                fresh = codec.decode(records.record_envelope(kept))._replace(attempt=0).encode()
                again = scripts.failed_retry(
                    failed=qk.failed,
                    record=qk.job(fail_jid),
                    pending=qk.pending,
                    stats=qk.stats,
                    wake=qk.wake,
                    envelope=fresh,
                    keep_ms=60_000,
                )
                assert run(client, again) == 1
                cancel = scripts.cancel(
                    record=qk.job(cancel_jid), pending=qk.pending, scheduled=qk.scheduled, stats=qk.stats,
                    finished=qk.finished, inflight=[qk.inflight("c1")], jid=cancel_jid,
                    channel=qk.cancel_channel, keep_finished=100, done=qk.done_channel,
                )  # fmt: skip
                assert run(client, cancel) == [1, b"running"]
                unique = Task(queue, "op", unique_key="u")
                env = unique.envelope(keep_result=60)
                dedupe = scripts.enqueue_unique(
                    pending=qk.pending, scheduled=qk.scheduled, stats=qk.stats, wake=qk.wake,
                    record=qk.job(str(unique.jid)), unique=qk.unique("u"), delay_ms=0, keep_ms=60_000,
                    envelope=env, jid=str(unique.jid), record_prefix=qk.job(""), unique_for_ms=0,
                )  # fmt: skip
                assert run(client, dedupe)[0] == 1
                assert run(client, dedupe)[0] == 0
                reply = run(client, _claim_n(qk, "c2", 1))
                expired = settle.drop(
                    KEYS, Delivery(queue, qk.inflight("c2"), int(reply[1])), "expired",
                    jid=codec.decode(reply[3]).jid, recorded=True, retention=RETENTION,
                )  # fmt: skip
                assert run(client, expired) == 1
                purge = scripts.purge(pending=qk.pending, stats=qk.stats, record_prefix=qk.job(""))
                assert run(client, purge) == 2  # the retried failure and the unique task
                assert client.exists(qk.unique("u")) == 0
            assert len(slots) > 1
        finally:
            client.close()


def _claim_n(qk: Any, consumer: str, n: int) -> scripts.Call:
    return scripts.ack_claim(
        pending=qk.pending,
        inflight=qk.inflight(consumer),
        token_counter=qk.token_counter,
        stats=qk.stats,
        wake=qk.wake,
        want=n,
        acks=[],
    )


async def test_result_survives_its_subscription_being_killed(
    redis_url: str, r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pub/sub connection is killed while result() waits: it resubscribes and is still woken."""
    monkeypatch.setattr(fencekit.produce._results, "SAFETY_REREAD", 60.0)
    release = asyncio.Event()

    async def held(payload: dict[str, Any]) -> str:
        await release.wait()
        return "after the reconnect"

    server = new_server(redis_url, worker("resub", "held", held))
    resub = qkey("resub", "done")
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("resub", "held"))
        waiter = asyncio.ensure_future(client.result(jid, timeout=20))
        await eventually(lambda: node_of(r, resub).execute_command("PUBSUB", "SHARDNUMSUB", resub)[1] == 1)
        assert r.client_kill_filter(_type="pubsub") >= 1
        await eventually(
            lambda: node_of(r, resub).execute_command("PUBSUB", "SHARDNUMSUB", resub)[1] == 1,
            what="the new subscription",
        )
        release.set()
        assert await waiter == "after the reconnect"


@pytest.mark.parametrize("kept_by", ["the letter", "the replacement"])
async def test_a_dead_letter_revived_as_a_corrected_task_ends_done_in_its_record(
    redis_url: str, kept_by: str
):
    """The revive makes the letter's record pending again; the corrected task's run must finish it
    (its envelope keeps a record: the letter's retention, or its own), or ``result()`` waits forever."""
    from fencekit import App, JobStatus
    from fencekit.testing import drain

    app = App()

    @app.task(queue="pay")
    def charge(order: int) -> str:
        return f"order {order} charged"

    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("pay", "charge", {"order_id": 5}))  # the wrong name
        await drain(app, redis_url)
        info = await client.job(jid)
        assert info is not None
        assert info.status is JobStatus.DEAD
        (letter,) = await client.queue("pay").dead_letters()
        keep = None if kept_by == "the letter" else 60
        fixed = Task("pay", "charge", {"order": 5}, jid=jid, keep_result=keep)
        assert await client.queue("pay").revive(letter.id, fixed)
        await drain(app, redis_url)
        assert await client.result(jid, timeout=10) == "order 5 charged"
        info = await client.job(jid)
        assert info is not None
        assert info.status is JobStatus.DONE


async def test_a_failed_first_subscription_is_made_again_by_the_listener(
    redis_url: str, r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first SSUBSCRIBE of the result channel fails: the waits re-read meanwhile, and the
    listener subscribes the channel after (once, it stayed unsubscribed for good)."""
    real = fencekit.produce._results.sharded_pubsub
    failed: list[str] = []

    def failing_once(client: Any) -> Any:
        pubsub = real(client)
        subscribe = pubsub.ssubscribe

        async def ssubscribe(*channels: Any) -> Any:
            if not failed:
                failed.append(str(channels))
                raise ConnectionError("the first SSUBSCRIBE fails")
            return await subscribe(*channels)

        pubsub.ssubscribe = ssubscribe
        return pubsub

    monkeypatch.setattr(fencekit.produce._results, "sharded_pubsub", failing_once)

    gate = asyncio.Event()

    async def double(payload: dict[str, Any]) -> int:
        await gate.wait()  # held until the wait subscribed: a job done before its wait never subscribes
        return int(payload["n"]) * 2

    server = new_server(redis_url, worker("again", "double", double))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("again", "double", {"n": 4}))
        wait = asyncio.ensure_future(client.result(jid))
        done = qkey("again", "done")
        await eventually(
            lambda: sum(int(n.execute_command("PUBSUB", "SHARDNUMSUB", done)[1]) for n in nodes(r)) == 1,
            what="the channel subscribed again",
        )
        assert len(failed) == 1
        gate.set()
        assert await asyncio.wait_for(wait, 30) == 8
        jid = await client.enqueue(Task("again", "double", {"n": 5}))
        assert await asyncio.wait_for(client.result(jid), 30) == 10
