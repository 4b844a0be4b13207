"""``@app.task`` functions in real pools: ``python -m fencekit.pool tests.task_functions_app:app``
(forked children) and the embedded ``Pool`` (exec'd children importing the functions by path).

Outcomes come through ``Client.result`` and from Redis; the pool runs in its
own processes on a private Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import tests.task_functions_app as tf

from fencekit import Client, JobFailed, Pool, Task
from fencekit.testing import RedisServer, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pool_env(private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    url = private_redis.url()
    monkeypatch.setenv("TEST_REDIS_URL", url)
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return url


@pytest.fixture
def pool(pool_env: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = (tmp_path / "pool.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencekit.pool", "tests.task_functions_app:app", "--procs", "2",
         "--concurrency", "4", "--sync-concurrency", "2", "--redis-url", pool_env, "--web-port", "-1"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    text = lambda: (tmp_path / "pool.log").read_text(errors="replace")  # noqa: E731
    try:
        wait_until(lambda: "pool ready" in text() or proc.poll() is not None, 30, what="pool ready")
        assert proc.poll() is None, text()
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    assert proc.returncode == 0, text()


async def test_async_and_sync_task_functions_run_in_a_pool_and_return_their_results(
    pool: subprocess.Popen[bytes], pool_env: str
) -> None:
    async with Client(pool_env) as client:
        detach = tf.app.place.attach(client)  # as a Server or child does: enqueue on this client
        try:
            assert await tf.greet.run("ada", greeting="hi") == "hi, ada"
            assert await tf.shout.run("bo", 2) == "BO!BO!"
            assert await tf.gather.run(1, 2, scale=3, tag="t") == {"total": 9, "labels": {"tag": "t"}}
            assert await tf.gather_sync.run(first=5) == {"total": 5, "labels": {}}
            assert await client.result("seeded", timeout=20) == "hello, supervisor"  # on_pool_startup
            seen = await tf.who.run()
            assert seen["pid"] != os.getpid()
            assert seen["operation"] == "who_sync"
        finally:
            detach()


async def test_hand_enqueued_wrong_params_are_dead_lettered_by_a_pool_child(
    pool: subprocess.Popen[bytes], pool_env: str
) -> None:
    async with Client(pool_env) as client:
        jid = await client.enqueue(Task("tf", "shout", {"nom": "x"}))
        with pytest.raises(JobFailed, match="missing param 'name'"):
            await client.result(jid, timeout=20)
        (letter,) = await client.queue("tf").dead_letters()
        assert letter.jid == jid
        assert "missing param 'name'" in letter.reason
        assert (await client.queue("tf").stats()).retried == 0


async def test_a_sync_task_past_its_timeout_in_a_pool_child_is_retried_and_its_late_write_refused(
    pool: subprocess.Popen[bytes], pool_env: str
) -> None:
    r = redis.Redis.from_url(pool_env)
    async with Client(pool_env) as client:
        jid = await client.enqueue(tf.slow_sync.build("pool", 2.0))
        assert await client.result(jid, timeout=30) == "on time"
    wait_until(lambda: r.get("seen:pool:refused") is not None, 15, what="the late write refused")
    assert r.get("effect:pool") == b"attempt 1"
    r.close()


async def test_task_functions_run_in_an_embedded_pool_whose_children_import_them_by_path(
    pool_env: str,
) -> None:
    async with Pool([tf.greet, tf.shout], procs=1, redis_url=pool_env, web_port=None) as embedded:
        assert embedded.supervisor is not None
        async with Client(pool_env) as client:
            first = await client.enqueue(tf.greet.build("eve"))
            second = await client.enqueue(tf.shout.options().build("eve"))
            assert await client.result(first, timeout=20) == "hello, eve"
            assert await client.result(second, timeout=20) == "EVE!"
