"""The pool and the app agree on Redis (the first hour, item 1).

A new user's scenario (rerun it with these tests): ``App(redis_url="redis://localhost:6391")``
served by ``python -m fencekit.pool myapp:app --procs 2`` without ``--redis-url`` served
``redis://127.0.0.1:6379/0`` instead: the tasks waited in the app's Redis, ``result()``
timed out after 10 s, and nothing warned.

The rule (``fencekit.runtime.app.pool_url``, shared by the CLI and ``Pool``): the pool's
own URL (``--redis-url``, ``FENCEKIT_REDIS_URL``, ``Pool(redis_url=...)``) wins; else the
app's; else the default. The pool logs which URL it serves and where it came from; the
pool's own and the app's both given and different is one WARNING naming both.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekit import SyncClient
from fencekit.testing import RedisServer, wait_until

APP = textwrap.dedent(
    """
    import os
    from fencekit import App

    app = App(redis_url=os.environ["TEST_APP_URL"])

    @app.task(queue="appurl")
    async def double(x: int) -> int:
        return 2 * x
    """
)


@pytest.fixture
def other_redis(tmp_path: Path, server_binary: str) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "other", binary=server_binary)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def start_pool(tmp_path: Path, app_url: str, env_url: str | None) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp_path / "urlapp.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if k != "FENCEKIT_REDIS_URL"}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}", TEST_APP_URL=app_url)
    if env_url is not None:
        env["FENCEKIT_REDIS_URL"] = env_url
    log = tmp_path / "pool.log"
    with log.open("wb") as out:  # the child has its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "fencekit.pool", "urlapp:app", "--procs", "1", "--web-port", "-1"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    wait_until(lambda: "pool ready" in log.read_text() or proc.poll() is not None, 30, what="pool ready")
    assert proc.poll() is None, log.read_text()
    return proc, log


def enqueue_and_wait(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """Enqueue ``double(21)`` through the app module (as its user does) and wait for its result."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TEST_APP_URL", url)
    sys.modules.pop("urlapp", None)
    module = importlib.import_module("urlapp")
    try:
        jid = module.double.enqueue_sync(21)
        with SyncClient(redis_url=url) as client:
            return int(client.result(jid, timeout=20))
    finally:
        module.app.close_sync()
        sys.modules.pop("urlapp", None)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_a_pool_without_a_url_of_its_own_serves_the_apps(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = private_redis.url()
    proc, log = start_pool(tmp_path, url, None)
    try:
        assert enqueue_and_wait(tmp_path, url, monkeypatch) == 42  # it ran in the app's Redis
    finally:
        stop(proc)
    text = log.read_text()
    assert f"Redis: {url} (from App(redis_url=...))" in text, text
    assert "WARNING" not in text, text


def test_a_url_given_both_ways_and_different_is_one_warning_naming_both(
    tmp_path: Path, private_redis: RedisServer, other_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_url, pool_url = private_redis.url(), other_redis.url()
    proc, log = start_pool(tmp_path, app_url, pool_url)
    try:
        assert enqueue_and_wait(tmp_path, pool_url, monkeypatch) == 42  # the pool's own URL wins
    finally:
        stop(proc)
    text = log.read_text()
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, text
    assert pool_url in warnings[0], warnings
    assert app_url in warnings[0], warnings
    assert "FENCEKIT_REDIS_URL" in warnings[0]
    assert f"Redis: {pool_url} (from FENCEKIT_REDIS_URL)" in text, text


def test_a_database_the_server_does_not_have_exits_2_not_4(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """The first hour, item 7: ``--redis-url redis://.../99`` on a Redis of 16 databases exited 4
    ("cannot reach Redis"), as for an outage; it is a configuration error: exit 2, one line."""
    (tmp_path / "urlapp.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if k != "FENCEKIT_REDIS_URL"}
    env.update(PYTHONPATH=str(tmp_path), TEST_APP_URL=private_redis.url())
    url = private_redis.url().rsplit("/", 1)[0] + "/99"
    done = subprocess.run(
        [sys.executable, "-m", "fencekit.pool", "urlapp:app", "--procs", "1", "--web-port", "-1",
         "--redis-url", url],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "DB index is out of range" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_wait_for_redis_lets_a_pool_start_before_its_redis(tmp_path: Path, server_binary: str) -> None:
    """The first hour, item 5: a pool started before its Redis exited 4 at once; with
    ``--wait-for-redis 30`` it waits (one line when the wait begins, one when Redis answers),
    then serves. Without it, exit 4 as before."""
    (tmp_path / "urlapp.py").write_text(APP)
    server = RedisServer(tmp_path / "late", binary=server_binary)
    url = server.url()
    env = {k: v for k, v in os.environ.items() if k != "FENCEKIT_REDIS_URL"}
    env.update(PYTHONPATH=str(tmp_path), TEST_APP_URL=url)
    argv = [sys.executable, "-m", "fencekit.pool", "urlapp:app", "--procs", "1", "--web-port", "-1"]
    at_once = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert at_once.returncode == 4, at_once.stderr
    log = tmp_path / "pool.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--wait-for-redis", "30"], cwd=tmp_path, env=env, stdout=out, stderr=out
        )
    try:
        wait_until(lambda: "waiting up to 30s" in log.read_text(), 20, what="the wait begins")
        assert proc.poll() is None
        server.start()
        wait_until(lambda: "pool ready" in log.read_text() or proc.poll() is not None, 30, what="pool ready")
        assert proc.poll() is None, log.read_text()
        stop(proc)
        assert proc.returncode == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.cleanup()
    text = log.read_text()
    assert text.count("does not answer") == 1, text
    assert "answered after" in text, text
