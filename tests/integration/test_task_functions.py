"""``@app.task`` functions on a ``Server``: enqueue, run, binding both ways, options, bad input.

Each test runs a real ``Server`` on the session Redis and reads outcomes from
Redis (tests/queue_helpers.py) or through ``Client.result``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import tests.task_functions_app as tf
from tests.queue_helpers import eventually, new_server, running, scheduled, stats
from tests.servers import direct

from fencekit import App, Client, ConfigError, JobFailed, PayloadError, Task


@pytest.fixture(autouse=True)
async def _close_the_app_s_client() -> AsyncIterator[None]:
    """``tf.greet.run(...)`` outside a server opens the module app's client on the test's loop."""
    yield
    await tf.app.close()


@pytest.fixture
def r(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    monkeypatch.setenv("TEST_REDIS_URL", redis_url)
    client = direct(redis_url)
    yield client
    client.close()


async def test_an_async_task_function_runs_on_a_server_and_run_returns_its_result(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.greet)
    async with running(server):
        assert await tf.greet.run("ada") == "hello, ada"
        assert await tf.greet.run("bob", greeting="hi") == "hi, bob"
        jid = await tf.greet.enqueue(name="cy")
        async with Client(redis_url) as client:
            assert await client.result(jid, timeout=10) == "hello, cy"
            info = await client.job(jid)
            assert info is not None
            assert info.params == {"name": "cy"}


async def test_a_sync_task_function_runs_in_a_thread_and_run_returns_its_result(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.shout)
    async with running(server):
        assert await tf.shout.run("ada") == "ADA!"
        assert await tf.shout.run("bo", times=2) == "BO!BO!"
        assert await tf.shout.run("cy", 3) == "CY!CY!CY!"


async def test_positional_keyword_default_star_args_and_star_kwargs_round_trip_async_and_sync(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.gather, tf.gather_sync)
    async with running(server):
        for fn in (tf.gather, tf.gather_sync):
            assert await fn.run(1) == {"total": 1, "labels": {}}
            assert await fn.run(1, 2, 3, scale=10, color="red") == {"total": 60, "labels": {"color": "red"}}
            assert await fn.run(first=4, who="me") == {"total": 4, "labels": {"who": "me"}}
        task = tf.gather.build(1, 2, 3, scale=10, color="red")
        assert task.params == {"first": 1, "rest": [2, 3], "scale": 10, "color": "red"}


async def test_a_task_enqueued_by_hand_with_the_parameter_names_runs_like_a_call(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.greet)
    async with running(server), Client(redis_url) as client:
        jid = await client.enqueue(Task("tf", "greet", {"name": "eve", "greeting": "hey"}))
        assert await client.result(jid, timeout=10) == "hey, eve"


async def test_a_bad_call_is_refused_at_enqueue_with_an_error_naming_the_parameter(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.greet)
    async with running(server):
        with pytest.raises(PayloadError, match="'name'"):
            await tf.greet.enqueue()  # type: ignore[call-arg]
        with pytest.raises(PayloadError, match="'colour'"):
            await tf.greet.enqueue("x", colour="red")  # type: ignore[call-arg]
        with pytest.raises(PayloadError, match=r"'greeting'.*set is not JSON"):
            await tf.greet.enqueue("x", greeting={1, 2})  # type: ignore[arg-type]
    assert stats(r, "tf").get("enqueued", 0) == 0


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({}, "missing param 'name'"),
        ({"name": "x", "colour": "red"}, "unknown param 'colour'"),
    ],
)
async def test_hand_enqueued_params_that_do_not_bind_are_dead_lettered_with_the_reason_not_retried(
    redis_url: str, r: redis.Redis, params: dict[str, Any], reason: str
) -> None:
    server = new_server(redis_url, tf.greet)
    async with running(server), Client(redis_url) as client:
        jid = await client.enqueue(Task("tf", "greet", params))
        with pytest.raises(JobFailed, match=reason):
            await client.result(jid, timeout=10)
        letters = await client.queue("tf").dead_letters()
    assert [d.jid for d in letters] == [jid]
    assert reason in letters[0].reason
    assert stats(r, "tf").get("retried", 0) == 0


async def test_options_delay_schedules_the_call_and_options_carry_task_fields(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.greet)
    async with running(server):
        jid = await tf.greet.options(delay=60, jid="greet-later").enqueue("zed")
        assert jid == "greet-later"
        waiting = scheduled(r, "tf")
        assert [e["jid"] for e, _ in waiting] == ["greet-later"]
        assert waiting[0][0]["params"] == {"name": "zed"}
        assert await tf.greet.options(keep_result=5, timeout=3).run("amy") == "hello, amy"


async def test_retry_options_of_the_decorator_retry_a_failing_sync_task_then_it_succeeds(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.flaky_sync)
    async with running(server):
        jid = await tf.flaky_sync.enqueue("flaky")
        async with Client(redis_url) as client:
            assert await client.result(jid, timeout=20) == 2
    assert stats(r, "tf")["retried"] == 2


async def test_a_sync_task_past_its_timeout_is_retried_and_its_late_fenced_write_refused(
    redis_url: str, r: redis.Redis
) -> None:
    server = new_server(redis_url, tf.slow_sync)
    async with running(server):
        jid = await tf.slow_sync.enqueue("slow", 2.0)
        async with Client(redis_url) as client:
            assert await client.result(jid, timeout=20) == "on time"
        # the first run's thread outlives the retry: it wakes and its write is refused
        await eventually(lambda: r.get("seen:slow:refused"), timeout=10, what="the late write refused")
    assert r.get("effect:slow") == b"attempt 1"
    assert stats(r, "tf")["retried"] == 1


async def test_current_job_works_inside_a_sync_task_in_a_thread(redis_url: str, r: redis.Redis) -> None:
    server = new_server(redis_url, tf.who)
    async with running(server):
        jid = await tf.who.enqueue()
        async with Client(redis_url) as client:
            seen = await client.result(jid, timeout=10)
    assert seen["jid"] == jid
    assert seen["operation"] == "who_sync"
    assert seen["pid"] == os.getpid()


async def test_the_app_opens_its_own_client_lazily_outside_a_server_and_closes_it(
    redis_url: str, r: redis.Redis
) -> None:
    app = App(redis_url=redis_url, keep_result=0)

    @app.task(queue="own", retry_count=0)
    async def double(x: int) -> int:
        return 2 * x

    assert app.workers == (double,)
    jid = await double.enqueue(21)
    assert [e["params"] for e in _pending(r, "own")] == [{"x": 21}]
    server = new_server(redis_url, *app.workers)
    async with running(server), Client(redis_url) as client:
        await eventually(lambda: stats(r, "own").get("processed") == 1, what="processed")
        assert await client.job(jid) is None  # the app's client keeps no record (keep_result=0)
        assert await double.run(5) == 10  # run() keeps one anyway: it must read the result
    await app.close()
    assert await double(4) == 8  # calling it runs the function itself


def _pending(r: redis.Redis, queue: str) -> list[dict[str, Any]]:
    from tests.queue_helpers import pending

    return pending(r, queue)


async def test_decorator_options_are_the_worker_options_and_unknown_ones_are_a_config_error() -> None:
    app = App()

    async def f(x: int) -> None:
        return None

    with pytest.raises(ConfigError, match="unknown option 'retries'"):
        app.task(retries=3)(f)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="option 'retry_count' must be an int >= 0"):
        app.task(retry_count=-1)(f)
    with pytest.raises(ConfigError, match="option 'timeout'"):
        app.task(timeout=-2)(f)
    made = app.task(queue="q1", name="op1", retry=False, timeout=2, keep_result=9, keep_failed=False)(f)
    spec = made.spec
    assert (spec.queue, spec.operation, spec.policy.retry, spec.timeout, spec.keep_ms, spec.keep_failed) == (
        "q1",
        "op1",
        False,
        2.0,
        9000,
        False,
    )
    assert app.task(f).queue == "default"
    assert app.task(f).operation == "f"


async def test_a_task_function_enqueued_from_inside_a_job_uses_the_servers_connection(
    redis_url: str, r: redis.Redis
) -> None:
    app = App(redis_url="redis://127.0.0.1:1")  # nothing listens: only the server's client can work

    @app.task(queue="chain")
    async def second(x: int) -> int:
        return x + 1

    @app.task(queue="chain")
    async def first(x: int) -> str:
        return await second.enqueue(x)

    server = new_server(redis_url, *app.workers)
    async with running(server), Client(redis_url) as client:
        jid = await first.run(1)
        assert await client.result(jid, timeout=10) == 2


async def test_a_sync_task_does_not_block_the_loop_async_tasks_complete_meanwhile(
    redis_url: str, r: redis.Redis
) -> None:
    import threading

    release = threading.Event()
    app = App()

    @app.task(queue="mix")
    def blocker() -> str:
        release.wait(30)
        return "released"

    @app.task(queue="mix")
    async def quick(i: int) -> int:
        return i

    server = new_server(redis_url, *app.workers, concurrency=8)
    async with running(server), Client(redis_url) as client:
        blocked = await blocker.enqueue()
        await eventually(lambda: server.running() == 1, what="the sync task running")
        assert [await quick.run(i) for i in range(5)] == list(range(5))
        assert (await client.job(blocked)).status.value == "running"  # type: ignore[union-attr]
        release.set()
        assert await client.result(blocked, timeout=10) == "released"


async def test_sync_concurrency_bounds_the_threads_running_sync_tasks_at_once(
    redis_url: str, r: redis.Redis
) -> None:
    import threading
    import time

    lock = threading.Lock()
    now = 0
    peak = 0
    app = App()

    @app.task(queue="threads")
    def hold() -> None:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.05)
        with lock:
            now -= 1

    server = new_server(redis_url, *app.workers, concurrency=16, sync_concurrency=3)
    async with running(server), Client(redis_url) as client:
        jids = await client.enqueue_many(hold.build() for _ in range(40))
        for jid in jids:
            await client.result(jid, timeout=30)
    assert peak == 3


async def test_a_class_worker_may_declare_a_plain_def_perform_run_in_a_thread(
    redis_url: str, r: redis.Redis
) -> None:
    import threading

    from fencekit import current_job

    class Blocking:
        queue = "cls"
        operation = "block"

        @classmethod
        def perform(cls, payload: dict[str, Any]) -> dict[str, Any]:
            on_main = threading.current_thread() is threading.main_thread()
            return {"n": payload["n"] * 2, "jid": current_job().jid, "on_main": on_main}

    server = new_server(redis_url, Blocking)
    async with running(server), Client(redis_url) as client:
        jid = await client.enqueue(Task("cls", "block", {"n": 4}))
        assert await client.result(jid, timeout=10) == {"n": 8, "jid": jid, "on_main": False}


async def test_progress_sync_writes_the_progress_from_a_sync_task(redis_url: str, r: redis.Redis) -> None:
    import threading

    from fencekit import current_job

    release = threading.Event()
    app = App()

    @app.task(queue="prog")
    def step() -> bool:
        landed = current_job().progress_sync(0.5, "half")
        release.wait(30)
        return landed

    server = new_server(redis_url, *app.workers)
    async with running(server), Client(redis_url) as client:
        jid = await step.enqueue()

        async def halfway() -> bool:
            info = await client.job(jid)
            return info is not None and info.progress is not None and info.progress.fraction == 0.5

        await eventually(halfway, what="progress 0.5")
        release.set()
        assert await client.result(jid, timeout=10) is True
    await asyncio.sleep(0)


async def test_the_app_tells_what_became_of_what_it_enqueued_without_a_client(redis_url: str) -> None:
    """The first hour, item 9: a task function's user reaches status, result and cancel of what
    they enqueued through the app itself (``app.job``/``result``/``cancel`` and their ``_sync``
    forms), with no ``Client`` of their own."""
    app = App(redis_url=redis_url)

    @app.task(queue="app_views")
    async def triple(x: int) -> int:
        return 3 * x

    server = new_server(redis_url, *app.workers)
    try:
        async with running(server):
            jid = await triple.enqueue(14)
            assert await app.result(jid, timeout=10) == 42
            info = await app.job(jid)
            assert info is not None
            assert info.status == "done"
            later = await triple.options(delay=3600).enqueue(1)
            assert await app.cancel(later) is True
            assert (await app.job(later)).status == "cancelled"  # type: ignore[union-attr]
            sync_jid = await asyncio.to_thread(triple.enqueue_sync, 5)
            assert await asyncio.to_thread(app.result_sync, sync_jid, timeout=10) == 15
            assert (await asyncio.to_thread(app.job_sync, sync_jid)).status == "done"  # type: ignore[union-attr]
            assert await asyncio.to_thread(app.cancel_sync, sync_jid) is False  # finished: nothing to cancel
    finally:
        await app.close()


async def test_a_mistyped_call_is_refused_at_enqueue_and_a_mistyped_task_is_a_dead_letter(
    redis_url: str, r: Any
) -> None:
    """The first hour, item 6: ``nap.enqueue_sync("abc")`` for ``def nap(seconds: float)`` was
    accepted, then failed in the worker with a ``TypeError`` that was retried."""
    app = App(redis_url=redis_url)

    @app.task(queue="typed", retry_count=5)
    def nap(seconds: float) -> float:
        return seconds

    try:
        with pytest.raises(PayloadError, match=r"argument 'seconds' must be float, got str 'abc'"):
            await asyncio.to_thread(nap.enqueue_sync, "abc")
        with pytest.raises(PayloadError, match=r"argument 'seconds' must be float"):
            await nap.enqueue("abc")  # type: ignore[arg-type]
        async with Client(redis_url=redis_url) as client:
            assert await client.queue("typed").length() == 0  # nothing enqueued
            jid = await client.enqueue(Task("typed", "nap", {"seconds": "abc"}))  # made by hand
            server = new_server(redis_url, *app.workers)
            async with running(server):
                dead = await eventually(lambda: client.queue("typed").dead_letters(), what="a dead letter")
            letters = await client.queue("typed").dead_letters()
    finally:
        await app.close()
    assert dead is not None
    assert [d.jid for d in letters] == [jid]
    assert "param 'seconds' must be float, got str 'abc'" in letters[0].reason
    assert stats(r, "typed").get("retried", 0) == 0  # a dead letter at once, never a retry


async def test_a_stopped_server_leaves_no_result_listener_behind_after_its_task_functions_waited(
    redis_url: str, r: redis.Redis
) -> None:
    """``run()`` inside a Server waits through the server's client, whose result waiter listens on
    a sharded pub/sub; the server closes it with itself. Left running, the listener reconnected to
    the closed pool, and that connection leaked when the loop closed."""
    before = {int(c["id"]) for c in r.client_list()}  # another test's client may still be closing
    server = new_server(redis_url, tf.slow_async)
    async with running(server):
        assert await tf.slow_async.run(0.3) == "slept"  # not done at the first read: subscribed
        assert [t for t in asyncio.all_tasks() if t.get_name() == "fencekit-results"]
    await asyncio.sleep(0.3)  # a listener left running would reconnect meanwhile
    assert [t for t in asyncio.all_tasks() if t.get_name() == "fencekit-results"] == []
    own = r.client_id()
    assert [c["cmd"] for c in r.client_list() if int(c["id"]) not in before | {own}] == []
