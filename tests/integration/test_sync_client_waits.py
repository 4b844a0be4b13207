"""``SyncClient.result()`` from many threads while a ``Server`` works; Sentinel; the Flask example.

The ``Server`` runs on the test's loop; every synchronous call runs in a
worker thread (``asyncio.to_thread``), as a WSGI server's threads would call it.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from tests.queue_helpers import eventually, new_server, qkey, running, worker
from werkzeug.serving import make_server

import fencekit.produce._results
from fencekit import Client, JobCancelled, JobFailed, JobStatus, StoreError, SyncClient, Task
from fencekit.jobs.codec import decode
from fencekit.testing.sentinel import LocalSentinel

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "flask_enqueue.py"


def subscribers(r: redis.Redis, queue: str) -> int:
    """How many connections are subscribed to the queue's ``done`` channel."""
    return int(r.pubsub_shardnumsub(qkey(queue, "done"))[0][1])


class Waits:
    """A ``Server`` whose tasks wait for :attr:`go`, and ``result()`` calls made in 16 threads."""

    def __init__(self, client: SyncClient) -> None:
        self.client = client
        self.go = asyncio.Event()
        self.threads = ThreadPoolExecutor(16)  # asyncio.to_thread's default pool has 6 on 2 cores

    def server(self, url: str) -> Any:
        async def answer(payload: dict[str, Any]) -> int:
            await self.go.wait()
            if payload["i"] == 3:
                raise ValueError("three is refused")
            return int(payload["i"]) * 10

        async def forever(payload: dict[str, Any]) -> None:
            await asyncio.Event().wait()

        answering = worker("waits", "answer", answer, retry=False)
        return new_server(url, answering, worker("waits", "forever", forever), concurrency=8)

    def outcome(self, jid: str, timeout: float | None = None) -> asyncio.Future[Any]:
        """The result of ``jid`` as a thread's ``result()`` call returns it (or its error's type)."""

        def wait() -> Any:
            try:
                return self.client.result(jid, timeout=timeout)
            except (JobFailed, JobCancelled, TimeoutError) as exc:
                return type(exc)

        return asyncio.get_running_loop().run_in_executor(self.threads, wait)


async def test_results_from_many_threads_are_woken_by_the_finishing_acks(
    redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fencekit.produce._results, "SAFETY_REREAD", 60.0)  # only a message can wake a wait
    with SyncClient(redis_url) as client:
        waits = Waits(client)
        async with running(waits.server(redis_url)):
            jids = client.enqueue_many([Task("waits", "answer", {"i": i}) for i in (0, 1, 2, 4)])
            lonely = client.enqueue(Task("unserved", "op", {}))
            results = [waits.outcome(jid) for jid in [*jids, jids[0]]]  # two threads wait for one task
            timed_out = waits.outcome(lonely, timeout=0.5)
            await eventually(lambda: subscribers(r, "waits") == len(results), what="every wait subscribed")
            assert not any(w.done() for w in results)
            waits.go.set()
            assert await asyncio.gather(*results) == [0, 10, 20, 40, 0]
            assert await timed_out is TimeoutError
        waits.threads.shutdown()
    assert subscribers(r, "waits") == 0  # each wait closed its subscription


async def test_failures_and_cancels_reach_the_waiting_threads(
    redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fail.lua`` and ``cancel.lua`` publish the jid on the done channel: no re-read is needed."""
    monkeypatch.setattr(fencekit.produce._results, "SAFETY_REREAD", 60.0)  # only a message can wake a wait
    with SyncClient(redis_url) as client:
        waits = Waits(client)
        async with Client(redis_url) as other, running(waits.server(redis_url)):
            refused = client.enqueue(Task("waits", "answer", {"i": 3}))
            stuck = client.enqueue(Task("waits", "forever", {}))
            await eventually(lambda: client.job(stuck).status is JobStatus.RUNNING, what="the stuck task")
            results = [waits.outcome(jid, timeout=30) for jid in (refused, stuck, stuck)]
            await eventually(lambda: subscribers(r, "waits") == len(results), what="every wait subscribed")
            waits.go.set()
            assert await other.cancel(stuck) is True
            assert await asyncio.gather(*results) == [JobFailed, JobCancelled, JobCancelled]
        waits.threads.shutdown()
    assert subscribers(r, "waits") == 0


def test_a_sentinel_url_enqueues_and_reads_without_any_event_loop(
    tmp_path: Path, server_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_loop(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("SyncClient made an event loop")

    monkeypatch.setattr(asyncio, "new_event_loop", no_loop)
    monkeypatch.setattr(asyncio.events, "new_event_loop", no_loop)
    threads = set(threading.enumerate())
    with (
        LocalSentinel(tmp_path / "sentinel", binary=server_binary) as cluster,
        SyncClient(cluster.url) as client,
    ):
        jid = client.enqueue(Task("behind", "op", {"x": 1}), delay=3600)
        assert client.job(jid).status is JobStatus.SCHEDULED
        assert [t.jid for t in client.queue("behind").scheduled()] == [jid]
        host, port = cluster.master_address()
        with redis.Redis(host=host, port=port) as master:
            assert master.zcard(qkey("behind", "scheduled")) == 1
        assert set(threading.enumerate()) == threads  # no watch thread either

        new_host, new_port = cluster.failover()
        # Without a master watch (no event loop), a connection in use follows the master once
        # the old one is demoted: its READONLY drops the connection, the next one asks the
        # sentinels. (The asyncio side leaves the old master at once; docs/design.md.)
        with redis.Redis(host=host, port=port) as old:
            for _ in range(300):
                if old.role()[0] in (b"slave", "slave"):
                    break
                threading.Event().wait(0.1)

        def enqueued_after_failover() -> str | None:
            try:
                return client.enqueue(Task("behind", "op", {"x": 2}))
            except StoreError:
                return None  # the old master refused it (READONLY) or was left: nothing written

        later = None
        for _ in range(300):  # at most 30 s: the sentinels reconfigure the old master
            later = enqueued_after_failover()
            if later is not None:
                break
            threading.Event().wait(0.1)
        assert later is not None
        with redis.Redis(host=new_host, port=new_port) as master:
            assert [decode(raw).jid for raw in master.lrange(qkey("behind", "pending"), 0, -1)] == [later]
        assert client.job(later).status is JobStatus.PENDING


@pytest.fixture
def flask_server(redis_url: str) -> Iterator[str]:
    """The README's Flask example, on its Redis URL replaced by the test's, served by werkzeug."""
    source = re.sub(r"redis://localhost:6379", redis_url, EXAMPLE.read_text())
    namespace: dict[str, Any] = {"__name__": "flask_enqueue"}
    exec(compile(source, str(EXAMPLE), "exec"), namespace)
    server = make_server("127.0.0.1", 0, namespace["app"], threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="wsgi", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)
        namespace["jobs"].close()


def test_the_flask_example_enqueues_from_a_real_wsgi_server(flask_server: str, r: redis.Redis) -> None:
    with httpx.Client(base_url=flask_server) as http:
        replies = [http.post(f"/reports/{n}") for n in (7, 8)]
    assert [reply.status_code for reply in replies] == [200, 200]
    jids = [reply.json()["jid"] for reply in replies]
    waiting = [decode(raw) for raw in reversed(r.lrange(qkey("reports", "pending"), 0, -1))]
    assert [(e.jid, e.operation, e.params) for e in waiting] == [
        (jids[0], "build", {"report_id": 7}),
        (jids[1], "build", {"report_id": 8}),
    ]
