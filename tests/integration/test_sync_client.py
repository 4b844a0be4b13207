"""``SyncClient`` and ``SyncQueue`` against the same Redis state as ``Client`` and ``Queue``.

The parity test runs one body through either client (the synchronous one in
a worker thread, since a ``Server`` runs on the test's loop) and checks each
answer against what the *other* client reads. Then what is the synchronous
client's own: 16 threads on one instance, a forked child, Redis killed under
a call, the hooks.
"""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, qkey, running, stats, worker

from fencekit import (
    Client,
    ConfigError,
    FenceKitHooks,
    JobEvent,
    JobFailed,
    JobStatus,
    StoreError,
    SyncClient,
    SyncQueue,
    Task,
)
from fencekit.testing import RedisServer


class Either:
    """One method call spelled once for ``Client`` (awaited) and ``SyncClient`` (in a thread)."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.client: Any = Client(url) if kind == "async" else SyncClient(url)

    async def __call__(self, method: str, *args: Any, queue: str | None = None, **kwargs: Any) -> Any:
        target = self.client.queue(queue) if queue is not None else self.client
        fn = getattr(target, method)
        if self.kind == "async":
            return await fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def close(self) -> None:
        if self.kind == "async":
            await self.client.close()
        else:
            self.client.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_every_method_of_either_client_sees_and_changes_the_same_state(
    kind: str, redis_url: str, r: Any
) -> None:
    release = asyncio.Event()

    async def double(payload: dict[str, Any]) -> int:
        return int(payload["i"]) * 2

    async def boom(payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    async def slow(payload: dict[str, Any]) -> None:
        await release.wait()

    server = new_server(
        redis_url,
        worker("par", "double", double),
        worker("par", "boom", boom, retry=False),
        worker("par", "slow", slow),
    )
    mine, theirs = Either(kind, redis_url), Either("async" if kind == "sync" else "sync", redis_url)
    try:
        async with running(server):
            # enqueue, result, job: the other client reads the same record
            jid = await mine("enqueue", Task("par", "double", {"i": 21}))
            assert await mine("result", jid, timeout=10) == 42
            assert await mine("job", jid) == await theirs("job", jid)
            jids = await mine("enqueue_many", [Task("par", "double", {"i": i}) for i in range(3)])
            assert [await theirs("result", j, timeout=10) for j in jids] == [0, 2, 4]
            first = await mine("enqueue_unique", Task("idle", "op", {}, unique_key="k"))
            again = await theirs("enqueue_unique", Task("idle", "op", {}, unique_key="k"))
            assert first.created
            assert not again.created
            assert again.jid == first.jid

            # a failure: kept, listed, retried
            bad = await mine("enqueue", Task("par", "boom", {}))
            with pytest.raises(JobFailed, match="RuntimeError: boom"):
                await mine("result", bad, timeout=10)
            assert [f.jid for f in await mine("failed", queue="par")] == [bad]
            assert await mine("failed_count", queue="par") == await theirs("failed_count", queue="par") == 1
            assert await mine("retry_failed", bad, queue="par") == 1
            await eventually(lambda: stats(r, "par")["failed"] == 2, what="the retried failure")

            # a running task: in flight, then cancelled
            running_jid = await mine("enqueue", Task("par", "slow", {}))
            await eventually(lambda: theirs("in_flight", queue="par"), what="the slow task claimed")
            assert await mine("in_flight", queue="par") == 1
            assert await mine("cancel", running_jid) is True
            assert (await theirs("job", running_jid)).status is JobStatus.CANCELLED

            # a dead letter (not an envelope), revived as a valid task
            r.lpush(qkey("par", "pending"), b"not an envelope")
            await eventually(lambda: theirs("dead_count", queue="par"), what="the dead letter")
            (letter,) = await mine("dead_letters", queue="par")
            assert letter == (await theirs("dead_letters", queue="par"))[0]
            assert await mine("revive", letter.id, Task("par", "double", {"i": 1}), queue="par") is True
            assert await mine("dead_count", queue="par") == 0

            # waiting and scheduled tasks of a queue nobody serves
            later = await mine("enqueue", Task("idle", "op", {"n": 1}), delay=3600)
            at = datetime.now(timezone.utc) + timedelta(hours=2)
            planned = await mine("schedule", Task("idle", "op", {"n": 2}), at, queue="idle")
            assert [t.jid for t in await mine("scheduled", queue="idle")] == [later, planned]
            assert await mine("scheduled", 1, queue="idle") == (await theirs("scheduled", queue="idle"))[:1]
            assert await mine("run_now", later, queue="idle") is True
            assert await mine("cancel", planned) is True
            assert await mine("scheduled", queue="idle") == []
            await mine("enqueue", Task("idle", "op", {"n": 3}))
            pending = [t.params for t in await mine("pending", queue="idle")]
            assert pending == [{"n": 1}, {}, {"n": 3}]  # run_now put its task at the head
            assert await mine("length", queue="idle") == await theirs("length", queue="idle") == 3
            assert await mine("purge", queue="idle") == 3
            assert await theirs("length", queue="idle") == 0

            # counters, names, history: what the other client reads
            assert await mine("stats", queue="par") == await theirs("stats", queue="par")
            assert await mine("stats") == await theirs("stats")
            assert await mine("queues") == await theirs("queues") == ["idle", "par"]
            history = await mine("history", "1h", queue="par")
            assert (history.queues, history.window, history.step) == (("par",), "1h", 60)
    finally:
        release.set()
        await mine.close()
        await theirs.close()


def test_sixteen_threads_share_one_client_and_every_enqueue_counts(redis_url: str) -> None:
    jids: list[list[str]] = [[] for _ in range(16)]
    errors: list[BaseException] = []
    with SyncClient(redis_url, keep_result=0) as client:
        client.logger.disabled = True  # 8,000 INFO lines otherwise

        def produce(k: int) -> None:
            try:
                for i in range(500):
                    jids[k].append(client.enqueue(Task("threads", "op", {"k": k, "i": i})))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        every = [j for mine in jids for j in mine]
        assert len(every) == len(set(every)) == 8000
        handle = client.queue("threads")
        assert handle.length() == 8000
        assert handle.stats().enqueued == client.stats().enqueued == 8000
        assert {t.jid for t in handle.pending()} == set(every)


def test_a_forked_child_uses_its_own_connections_and_the_parent_carries_on(redis_url: str) -> None:
    with SyncClient(redis_url) as client:
        before = client.enqueue(Task("fork", "op", {"who": "parent"}))
        parent_pool_pid = client.redis.connection_pool.pid
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, leave with os._exit
            code = 1
            try:
                jid = client.enqueue(Task("fork", "op", {"who": "child"}))
                info = client.job(before)
                ok = info is not None and client.redis.connection_pool.pid == os.getpid()
                os.write(write, f"{jid} {ok}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            child_jid, ok = pipe.read().split()
        assert os.waitstatus_to_exitcode(status) == 0
        assert ok == "True"
        assert client.redis.connection_pool.pid == parent_pool_pid == os.getpid()
        after = client.enqueue(Task("fork", "op", {"who": "parent"}))  # the parent's sockets still work
        assert [t.jid for t in client.queue("fork").pending()] == [before, child_jid, after]


async def test_redis_killed_under_a_call_is_a_store_error_and_the_next_call_after_it_is_back_works(
    private_redis: RedisServer,
) -> None:
    with SyncClient(private_redis.url()) as client:
        jid = client.enqueue(Task("outage", "op", {}))
        waiting = asyncio.create_task(asyncio.to_thread(client.result, jid))  # subscribed, nobody serves it
        await eventually(lambda: private_redis.client().pubsub_shardnumsub(qkey("outage", "done"))[0][1])
        private_redis.kill()
        with pytest.raises(StoreError):
            await asyncio.wait_for(waiting, 30)
        with pytest.raises(StoreError):
            client.enqueue(Task("outage", "op", {}))
        private_redis.restart()
        assert client.job(jid) is None  # the data went with the process (no AOF)
        fresh = client.enqueue(Task("outage", "op", {}))
        assert client.queue("outage").length() == 1
        # queue= : the names this client registered went with the data (as for Client; a Server's
        # heartbeat registers them again)
        assert client.job(fresh, queue="outage") is not None


def test_the_hooks_are_told_of_each_enqueue_and_of_a_refused_one(private_redis: RedisServer) -> None:
    events: list[JobEvent] = []
    hooks = FenceKitHooks(on_enqueued=events.append, trace_enqueue=lambda q, op, jid: f"00-{jid[:8]}")
    with SyncClient(private_redis.url(), hooks=hooks) as client:
        jids = client.enqueue_many([Task("hooked", "a", {}), Task("hooked", "b", {})])
        assert [(e.jid, e.operation, e.error) for e in events] == [(jids[0], "a", None), (jids[1], "b", None)]
        assert [e.trace for e in events] == [f"00-{jid[:8]}" for jid in jids]
        assert [t.jid for t in client.queue("hooked").pending()] == jids
        private_redis.kill()
        with pytest.raises(StoreError):
            client.enqueue(Task("hooked", "c", {}))
        assert events[-1].operation == "c"
        assert isinstance(events[-1].error, StoreError)


def test_the_handle_of_a_sync_client_is_a_sync_queue(redis_url: str) -> None:
    with SyncClient(redis_url) as client:
        handle = client.queue("named")
        assert isinstance(handle, SyncQueue)
        assert handle.name == "named"
        with pytest.raises(ConfigError, match="scheduled through the handle of 'named'"):
            handle.schedule(Task("other", "op", {}), datetime.now(timezone.utc))
