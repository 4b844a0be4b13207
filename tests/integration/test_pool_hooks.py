"""The one hook contract on a real pool, and what the shared assembly checks before any child starts.

``App.on_startup``/``on_shutdown`` run in every child (each has its own
resources, as a ``Server`` has), ``App.on_pool_startup``/``on_pool_shutdown``
once in the supervisor; a hook takes no argument or the process's ``Client``.
Each hook writes its pid and what it got into Redis, which the test reads.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import redis

from fencekit.testing import RedisServer, wait_until

APP = textwrap.dedent(
    """
    import os
    import redis.asyncio
    from fencekit import App, Client, Task

    URL = os.environ["TEST_REDIS_URL"]

    async def note(what):
        r = redis.asyncio.Redis.from_url(URL)
        await r.rpush("hooks", f"{what}:{os.getpid()}")
        await r.aclose()

    async def child_start():                       # the seed's form: no argument
        await note("start")

    async def child_stop(client: Client):          # or the process's Client
        await note("stop:" + client.keys.prefix)

    async def pool_start(client: Client):
        await client.enqueue(Task("hooks", "echo", {"n": 1}))
        await note("pool-start")

    async def pool_stop():
        await note("pool-stop")

    class Echo:
        queue = "hooks"
        operation = "echo"

        @classmethod
        async def perform(cls, payload):
            await note("ran")

    app = App(
        workers=[Echo],
        on_startup=[child_start],
        on_shutdown=[child_stop],
        on_pool_startup=[pool_start],
        on_pool_shutdown=[pool_stop],
    )
    """
)


def _pool(tmp_path: Path, url: str, *args: str) -> subprocess.Popen[bytes]:
    (tmp_path / "hookapp.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TEST_REDIS_URL": url, "FENCEKIT_APP": "hookapp:app"}
    return subprocess.Popen(
        [sys.executable, "-m", "fencekit.pool", "--redis-url", url, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_child_hooks_run_in_every_child_and_pool_hooks_once_in_the_supervisor(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    r = private_redis.client()
    pool = _pool(tmp_path, private_redis.url(), "--procs", "2", "--web-port", "off")
    try:
        wait_until(lambda: r.llen("hooks") >= 4, 30, what="the startup hooks and the seeded task")
        wait_until(lambda: any(e.startswith(b"ran:") for e in r.lrange("hooks", 0, -1)), 20, what="a run")
    finally:
        pool.send_signal(signal.SIGTERM)
        out, _ = pool.communicate(timeout=30)
    assert pool.returncode == 0, out.decode(errors="replace")[-3000:]
    entries = [e.decode() for e in r.lrange("hooks", 0, -1)]
    r.close()
    by_kind: dict[str, list[int]] = {}
    for entry in entries:
        kind, _, pid = entry.rpartition(":")
        by_kind.setdefault(kind, []).append(int(pid))
    supervisor = pool.pid
    assert by_kind["pool-start"] == [supervisor]
    assert by_kind["pool-stop"] == [supervisor]
    children = set(by_kind["start"])
    assert len(children) == 2
    assert supervisor not in children
    assert set(by_kind["stop:fencekit"]) == children  # each child's on_shutdown got its Client
    assert set(by_kind["ran"]) <= children
    assert entries.index(f"pool-start:{supervisor}") < min(
        i for i, e in enumerate(entries) if e.startswith("start:")
    )
    assert entries[-1] == f"pool-stop:{supervisor}"  # after the children stopped


def test_a_busy_web_port_stops_the_pool_before_any_child_starts(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pool = _pool(tmp_path, private_redis.url(), "--procs", "2", "--web-port", str(port))
        out, _ = pool.communicate(timeout=30)
    text = out.decode(errors="replace")
    assert pool.returncode == 2, text[-3000:]
    assert f"web_port {port}: cannot listen on 127.0.0.1:{port}" in text
    assert "--web-port" in text
    assert "started child" not in text
    assert "Traceback" not in text
    r: redis.Redis = private_redis.client()
    assert r.lrange("hooks", 0, -1) == []  # not even the pool's startup hook ran
    r.close()
