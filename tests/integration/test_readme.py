"""The README's Python examples run as written (only the Redis URL is the test's)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from tests.queue_helpers import eventually, running

from fencekit import Task
from fencekit.testing import RedisServer

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def block_with(marker: str) -> str:
    (block,) = [b for b in python_blocks() if marker in b]
    return block


def with_url(code: str, url: str) -> str:
    return re.sub(r"redis://localhost:6379(/0)?", url, code)


def test_the_primitives_example_runs(redis_url: str):
    namespace: dict[str, object] = {}
    exec(with_url(block_with("def analyze_batch"), redis_url), namespace)
    namespace["analyze_batch"]()  # type: ignore[operator]
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    assert r.get("analysis:batch-42:status") == "running"
    assert [k for k in r.keys("fencekit:idem:*") if not k.endswith(":result")]
    r.close()


async def test_the_time_limits_example_enqueues_as_it_says(redis_url: str):
    namespace: dict[str, object] = {}
    exec(block_with("class AnalyseGame"), namespace)
    from fencekit import Client
    from fencekit.jobs.codec import decode

    async with Client(redis_url=redis_url) as client:
        await namespace["produce"](client)  # type: ignore[operator]
    r = redis.Redis.from_url(redis_url)
    waiting = [decode(raw) for raw in r.lrange("fencekit:{games}:pending", 0, -1)]
    later = [decode(raw) for raw in r.zrange("fencekit:{games}:scheduled", 0, -1)]
    r.close()
    by_id = {e.params["id"]: e for e in waiting}
    assert by_id[7].timeout == 600
    assert by_id[8].expires_at is not None
    assert sorted(e.params["id"] for e in later) == [9, 10]


async def test_the_status_and_results_example_runs(redis_url: str):
    from fencekit import Client, Server

    namespace: dict[str, object] = {}
    exec(block_with("async def ask"), namespace)
    server = Server(redis_url=redis_url, web_port=None, grace=0.5)
    server.add_workers(namespace["Analyse"])
    serving = asyncio.ensure_future(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 15)
        async with Client(redis_url=redis_url) as client:
            await namespace["ask"](client)  # type: ignore[operator]
            jobs = {
                s.decode(): v
                for s, v in redis.Redis.from_url(redis_url).hgetall("fencekit:{games}:stats").items()
            }
    finally:
        server.stop()
        await asyncio.wait_for(serving, 15)
    assert int(jobs["processed"]) + int(jobs.get("cancelled", 0)) == 2  # id 8 may finish first
    assert int(jobs["deduped"]) == 1


def test_the_job_queue_example_runs_until_sigterm(redis_url: str):
    r = redis.Redis.from_url(redis_url)

    def stop_when_sent() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if r.hget("fencekit:{emails}:stats", "processed") == b"1":
                os.kill(os.getpid(), signal.SIGTERM)  # the server's own handler stops it
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=stop_when_sent)
    watcher.start()
    code = with_url(block_with("class SendEmailWorker"), redis_url.rsplit("/", 1)[0])
    exec(code, {"__name__": "readme_example"})
    watcher.join()
    keys = r.keys("email:*:status")
    assert len(keys) == 1
    assert r.get(keys[0]) == b"sent"
    r.close()


async def test_the_starlette_lifespan_example_runs_the_pool(
    private_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "workers.py").write_text(
        textwrap.dedent(
            """
            class Noop:
                queue = "readme"
                operation = "noop"

                @classmethod
                async def perform(cls, payload):
                    return None

            WORKERS = [Noop]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    namespace: dict[str, object] = {"__name__": "readme_lifespan"}
    exec(with_url(block_with("lifespan"), private_redis.url()), namespace)
    app = namespace["app"]
    async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/pool")
    children = response.json()
    assert len(children) == 2
    assert all(child["ready"] for child in children)
    sys.modules.pop("myapp.workers", None)
    sys.modules.pop("myapp", None)
    await asyncio.sleep(0)


async def test_the_hooks_example_tells_failures_busy_locks_and_traces(
    redis_url: str, capsys: pytest.CaptureFixture[str]
):
    from datetime import timedelta

    from fencekit import Client, LockNotAcquired, Server, Task

    namespace: dict[str, Any] = {}
    exec(with_url(block_with("class BuildReport"), redis_url), namespace)
    lock, metrics, failed = namespace["lock"], namespace["metrics"], namespace["failed"]
    handle = lock.acquire("report-7", ttl=timedelta(seconds=5))
    with pytest.raises(LockNotAcquired):
        lock.acquire("report-7", ttl=timedelta(seconds=5))
    assert capsys.readouterr().out == "report-7\n"  # on_lock_acquire_failed=print
    lock.release(handle)

    class Broken:
        queue = "reports"
        operation = "broken"
        retry = False

        @classmethod
        async def perform(cls, payload: dict) -> None:
            raise RuntimeError("no data")

    server = Server(redis_url=redis_url, web_port=None, hooks=metrics)
    server.add_workers(*namespace["app"].workers, Broken)
    client = namespace["client"]
    async with running(server):
        ok = await client.enqueue(Task("reports", "build", {"id": 7}))
        bad = await client.enqueue(Task("reports", "broken", {}))
        await eventually(lambda: failed, what="the failure told")
    await client.close()
    assert [e.jid for e in failed] == [bad]
    assert isinstance(failed[0].error, RuntimeError)
    assert ok != bad
    assert namespace["app"].hooks.trace_enqueue is not None  # otel_hooks
    assert isinstance(client, Client)


def test_the_celery_example_runs(redis_url: str):
    namespace: dict[str, object] = {}
    exec(with_url(block_with("def charge(self, order)"), redis_url), namespace)
    namespace["app"].close()  # type: ignore[attr-defined]
    r = redis.Redis.from_url(redis_url)
    assert r.get("order:order-7:charged") == b"yes"
    assert r.get("fencekit:idem:{charge:order-7}") == b"done"
    r.close()


def test_the_quick_start_runs_on_a_pool_as_written(redis_url: str, tmp_path: Path):
    """tasks.py served by ``python -m fencekit.pool tasks:app --procs 2``; main.py prints both results."""
    url = redis_url.rsplit("/", 1)[0]
    (tmp_path / "tasks.py").write_text(with_url(block_with("# tasks.py"), url))
    (tmp_path / "main.py").write_text(with_url(block_with("# main.py"), url))
    serve = re.search(r"Serve it: `(python -m fencekit\.pool [^`]+)`", README.read_text())
    assert serve is not None
    argv = with_url(serve.group(1), url).split()[1:]  # the README's command, only the URL is the test's
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("FENCEKIT_REDIS_URL", None)  # the app's URL, written once in tasks.py, is the one served
    pool = subprocess.Popen(
        [sys.executable, *argv, "--web-port", "off"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        done = subprocess.run(
            [sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        printed = [line for line in done.stdout.splitlines() if " fencekit.client: " not in line]
        assert printed == ["sent 'hi' to ada@example.com", "report 42 rendered"], done.stdout
    finally:
        pool.send_signal(signal.SIGTERM)
        _, log = pool.communicate(timeout=60)
    assert pool.returncode == 0, log


def test_the_testing_example_runs_as_a_user_s_test(tmp_path: Path):
    """The README's test, in a project of its own that opts in to the plugin, passes under pytest."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["fencekit.testing.pytest"]\n')
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    (tmp_path / "test_orders.py").write_text(block_with("async def test_charging_marks_the_order_paid"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEKIT_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout


def test_the_flask_example_is_the_one_the_sync_client_tests_serve():
    """The README's Flask view is docs/examples/flask_enqueue.py, which test_sync_client_waits serves."""
    example = (README.parent / "docs" / "examples" / "flask_enqueue.py").read_text()
    assert block_with("from flask import Flask") == example


def test_the_sync_client_script_runs(redis_url: str, capsys: pytest.CaptureFixture[str]):
    exec(with_url(block_with("with SyncClient("), redis_url.rsplit("/", 1)[0]), {"__name__": "readme_sync"})
    assert capsys.readouterr().out.splitlines()[-1] == "scheduled True"


async def test_the_periodic_example_registers_both_schedules(redis_url: str):
    """The README's schedules validate, and a Server serving them lists both with their next runs."""
    from fencekit import Client, Server

    namespace: dict[str, Any] = {"__name__": "readme_periodic"}
    exec(block_with('cron="0 9 * * MON-FRI"'), namespace)
    app = namespace["app"]
    server = Server(redis_url=redis_url, web_port=None)
    server.add_workers(*app.workers)
    async with Client(redis_url) as client, running(server):
        await eventually_async(lambda: client.schedules(), lambda found: len(found) == 2)
        found = {s.operation: s for s in await client.schedules()}
    assert found["morning_report"].cron == "0 9 * * MON-FRI"
    assert found["morning_report"].tz == "Europe/Paris"
    assert found["refresh"].every == 30
    assert found["refresh"].params == {"region": "eu"}
    assert all(s.next_run > time.time() - 1 for s in found.values())


async def eventually_async(read: Any, done: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if done(await read()):
            return
        assert time.monotonic() < deadline, "the schedules were never listed"
        await asyncio.sleep(0.05)


def test_the_flow_control_examples_declare_valid_workers_and_tasks():
    """The priority, rate-limit and concurrency-key examples run as written and say what they claim."""
    from fencekit.jobs.flow import Rate
    from fencekit.jobs.worker import inspect_worker

    prio: dict[str, Any] = {"__name__": "readme_prio"}
    exec(block_with("async def send_now(client: Client, to: str)"), prio)
    assert inspect_worker(prio["digest"]).priority == -2
    assert Task("emails", "send", {"to": "x"}, priority=3).envelope().startswith(b'{"jid":')

    rate: dict[str, Any] = {"__name__": "readme_rate"}
    exec(block_with("class CallPartner:"), rate)
    assert inspect_worker(rate["CallPartner"]).rate == Rate(50.0, 5)

    keyed: dict[str, Any] = {"__name__": "readme_keyed"}
    exec(block_with("max_concurrency=2)"), keyed)
    spec = inspect_worker(keyed["build_report"])
    assert spec.max_concurrency == 2
    assert keyed["build_report"].build("t-7", "2026-11").concurrency_key == "t-7"
    assert keyed["by_hand"].concurrency_key == "t-7"
