"""``enqueue_sync``: a task function enqueued from synchronous code.

Outside a process that serves the app, every thread shares the app's one
``SyncClient``; inside one (a sync task's thread), the enqueue goes through the
serving loop's own client -- the test app's URL points at a port where nothing
listens, so anything else would fail.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import tests.task_functions_app as tf
from tests.queue_helpers import new_server, running, scheduled

from fencekit import App, Client, SyncClient
from fencekit.testing import drain_sync


@pytest.fixture(autouse=True)
async def _close_the_app_s_client() -> AsyncIterator[None]:
    """``tf.greet.run(...)`` outside a server opens the module app's client on the test's loop."""
    yield
    await tf.app.close()


@pytest.fixture
def r(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    monkeypatch.setenv("TEST_REDIS_URL", redis_url)
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_threads_enqueue_sync_through_the_app_s_one_sync_client_and_the_tasks_run(
    redis_url: str, r: redis.Redis
) -> None:
    app = App(redis_url=redis_url)

    @app.task(queue="se")
    async def double(n: int) -> int:
        return 2 * n

    jids: list[str] = []
    clients: set[int] = set()
    lock = threading.Lock()

    def produce(base: int) -> None:
        mine = [double.enqueue_sync(base + i) for i in range(50)]
        with lock:
            jids.extend(mine)
            clients.add(id(app.place.sync_client()))

    threads = [threading.Thread(target=produce, args=(k * 100,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(set(jids)) == 400
    assert len(clients) == 1
    assert isinstance(app.place.sync_client(), SyncClient)
    assert r.llen("fencekit:{se}:pending") == 400

    later = double.options(delay=60).enqueue_sync(7)
    assert [envelope["jid"] for envelope, _ in scheduled(r, "se")] == [later]
    assert r.delete("fencekit:{se}:scheduled") == 1  # drain below would wait a minute for it

    drained = drain_sync(app, redis_url)
    assert sorted(drained.results("double")) == sorted(2 * (k * 100 + i) for k in range(8) for i in range(50))
    app.close_sync()


async def test_a_sync_task_s_enqueue_sync_goes_through_the_serving_loop_s_client(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.fan_out_sync, tf.greet)
    async with running(server):
        jids = await tf.fan_out_sync.run(3)
        assert len(set(jids)) == 3
        async with Client(redis_url) as client:
            results = [await client.result(jid, timeout=10) for jid in jids]
        assert results == ["hello, n0", "hello, n1", "hello, n2"]


async def test_enqueue_sync_on_the_serving_loop_is_refused_as_it_would_block_it(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.greet)
    async with running(server):
        with pytest.raises(RuntimeError, match=r"would block it: use await \.enqueue"):
            tf.greet.enqueue_sync("on the loop")
        assert await tf.greet.run("after") == "hello, after"
