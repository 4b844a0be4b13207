"""No orphaned children: a child notices within a second that its supervisor is gone, stops claiming,
returns its tasks and exits (Linux's parent-death signal, and a parent check on its event loop)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import redis
from tests.queue_helpers import inflight_count, pending

from fencekit import Client, Task
from fencekit.testing import RedisServer, wait_until

APP = textwrap.dedent(
    """
    import asyncio

    class Slow:
        queue = "orphans"
        operation = "slow"

        @classmethod
        async def perform(cls, payload):
            await asyncio.sleep(60)

    WORKERS = [Slow]
    """
)


def _children(supervisor: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(supervisor)], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_children_return_their_tasks_and_exit_when_the_supervisor_is_killed(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    (tmp_path / "orphanapp.py").write_text(APP)
    url = private_redis.url()
    with (tmp_path / "pool.log").open("wb") as log:
        pool = subprocess.Popen(
            [sys.executable, "-m", "fencekit.pool", "orphanapp:WORKERS", "--redis-url", url, "--procs", "2",
             "--concurrency", "3", "--grace", "0.5", "--web-port", "off"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    r: redis.Redis = private_redis.client()
    children: list[int] = []
    try:
        wait_until(lambda: b"pool ready" in (tmp_path / "pool.log").read_bytes(), 30, what="pool ready")
        children = _children(pool.pid)
        assert len(children) == 2

        async def enqueue() -> list[str]:
            async with Client(url) as client:
                return await client.enqueue_many([Task("orphans", "slow") for _ in range(6)])

        jids = asyncio.run(enqueue())
        wait_until(lambda: inflight_count(r, "orphans") == 6, 20, what="the six tasks running")
        pool.send_signal(signal.SIGKILL)  # the supervisor only: its children are not signalled
        pool.wait(10)
        wait_until(lambda: not any(_alive(c) for c in children), 15, what="the orphaned children to exit")
        assert inflight_count(r, "orphans") == 0
        back = pending(r, "orphans")
        assert sorted(e["jid"] for e in back) == sorted(jids)
        assert all(e["attempt"] == 0 for e in back)  # returned as they were: no crash counted
        # Each child took itself out of the registry as it exited (the first hour, item 7: they
        # showed alive in `fencekit consumers` for about 30 s, until their beats aged out).
        listed = [k.decode() for k in r.hkeys("fencekit:{registry}:consumers")]
        beating = [k.decode() for k in r.zrange("fencekit:{registry}:beats", 0, -1)]
        assert [k for k in listed + beating if ":child" in k] == [], (listed, beating)
    finally:
        for child in children:
            if _alive(child):
                os.kill(child, signal.SIGKILL)
        if pool.poll() is None:
            pool.kill()
            pool.wait(10)
        r.close()
    text = (tmp_path / "pool.log").read_text(errors="replace")
    returned = [
        int(line.split("returned ")[1].split()[0])
        for line in text.splitlines()
        if "unfinished task(s)" in line
    ]
    assert sum(returned) == 6, text[-3000:]  # each child returned its own
    assert text.count("left the consumer registry (its supervisor is gone)") == 2, text[-3000:]
