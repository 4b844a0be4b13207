"""Poison input never disables recovery: every shape below is refused at the boundary or dead-lettered,
and a pool that meets all of them still reaps every task of a pool SIGKILLed beside it.

The shapes: a jid that cannot be a jid (whitespace, control characters, lone
surrogates, too long) given to ``enqueue`` or pushed raw; an in-flight hash of a
dead consumer whose field is not a delivery token; a queue name in the registry
that is not a queue name; a consumer record that is not JSON.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from tests.queue_helpers import eventually, inflight_count, new_server, qkey, running, stats
from tests.servers import direct

from fencekit import Client, PayloadError, Task, current_job
from fencekit.testing import RedisServer, wait_until

BAD_JIDS = ["order 42", "tab\there", "new\nline", "\x00nul", "\ud800lone", "x" * 201, ""]


@pytest.mark.parametrize(
    "jid", BAD_JIDS, ids=["space", "tab", "newline", "nul", "surrogate", "long", "empty"]
)
async def test_enqueue_refuses_a_jid_that_cannot_be_a_jid(redis_url: str, jid: str) -> None:
    async with Client(redis_url) as client:
        with pytest.raises(
            PayloadError, match=r"jid must (not contain .* \(|be )1 to 200 printable characters without"
        ):
            await client.enqueue(Task("poison", "echo", {}, jid=jid))
        assert await client.queue("poison").length() == 0


class Echo:
    queue = "poison"
    operation = "echo"

    @classmethod
    async def perform(cls, payload: dict) -> None:
        return None


def _raw(jid: object) -> bytes:
    return orjson.dumps({"jid": jid, "queue": "poison", "operation": "echo", "params": {}, "attempt": 0})


async def test_raw_envelopes_with_bad_jids_become_dead_letters_and_the_server_still_stops(
    redis_url: str,
) -> None:
    r = direct(redis_url)
    bad = [jid for jid in BAD_JIDS if jid != "\ud800lone"]  # orjson will not write a lone surrogate
    raws = [_raw(jid) for jid in bad]
    raws.append(
        b'{"jid": "\\ud800", "queue": "poison", "operation": "echo", "params": {}}'
    )  # orjson refuses it
    server = new_server(redis_url, Echo)
    async with running(server):
        r.lpush(qkey("poison", "pending"), *raws)
        r.lpush(qkey("poison", "wake"), "1")
        await eventually(lambda: stats(r, "poison")["dead"] == len(raws), what="every bad jid dead-lettered")
        assert inflight_count(r, "poison") == 0
        async with Client(redis_url) as client:
            ok = await client.enqueue(Task("poison", "echo", {}))
        await eventually(lambda: stats(r, "poison")["processed"] == 1, what="good work still runs")
    assert ok
    letters = [orjson.loads(v) for k, v in r.hgetall(qkey("poison", "dead")).items() if k.endswith(b":why")]
    assert len(letters) == len(raws)
    reasons = sorted(m["reason"] for m in letters)
    assert sum("field 'jid' must be 1 to 200 printable characters" in m for m in reasons) == len(bad), reasons
    assert sum("payload is not valid JSON" in m for m in reasons) == 1, reasons
    assert all(m["jid"] is None for m in letters)  # never a key, a log line or a page built from a bad one
    assert not list(r.scan_iter("fencekit:fence:*"))  # and no fence key named after one
    r.close()


APP = textwrap.dedent(
    """
    import asyncio, os
    from fencekit import current_job

    RUNS = os.environ["TEST_RUNS_DIR"]

    class Hold:
        queue = "poison"
        operation = "hold"
        retry_count = 3

        @classmethod
        async def perform(cls, payload):
            await asyncio.sleep(payload.get("seconds", 0))
            with open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a") as f:
                f.write(current_job().jid + "\\n")

    WORKERS = [Hold]
    """
)


def _pool(tmp_path: Path, url: str, name: str) -> subprocess.Popen[bytes]:
    (tmp_path / "poisonapp.py").write_text(APP)
    (tmp_path / "runs").mkdir(exist_ok=True)
    with (tmp_path / f"pool-{name}.log").open("wb") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            [sys.executable, "-m", "fencekit.pool", "poisonapp:WORKERS", "--redis-url", url, "--procs", "1",
             "--concurrency", "50", "--heartbeat-ttl", "2", "--web-port", "off"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path), "TEST_RUNS_DIR": str(tmp_path / "runs")},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _runs(tmp_path: Path) -> set[str]:
    return {line for p in (tmp_path / "runs").glob("runs-*.log") for line in p.read_text().split()}


def test_a_pool_that_meets_every_poison_shape_still_reaps_a_killed_pool(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    r = private_redis.client()
    url = private_redis.url()
    # A consumer that died long ago, whose in-flight hash holds a field that is no token.
    ghost = "ghost:1:server:000000000000"
    r.zadd("fencekit:{registry}:beats", {ghost: 1})
    r.hset("fencekit:{registry}:consumers", ghost, b"this is not json")
    r.hset(
        qkey("poison", f"inflight:{ghost}"), mapping={b"not-a-token": _raw("fine-jid"), b"12": _raw("ok 1")}
    )
    r.sadd("fencekit:{registry}:queues", "bad name", "{tagged}", "poison")
    r.lpush(qkey("poison", "pending"), _raw("order 42"), _raw("tab\there"))

    survivor = _pool(tmp_path, url, "survivor")
    victim = _pool(tmp_path, url, "victim")
    try:
        wait_until(
            lambda: sum(b":child0:" in m for m in r.zrange("fencekit:{registry}:beats", 0, -1)) == 2,
            20,
            what="both pools registered",
        )

        async def enqueue() -> list[str]:
            async with Client(url) as client:
                return await client.enqueue_many([Task("poison", "hold", {"seconds": 3}) for _ in range(40)])

        jids = asyncio.run(enqueue())
        wait_until(lambda: inflight_count(r, "poison") >= 40, 20, what="the 40 tasks running")
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        wait_until(
            lambda: set(jids) <= _runs(tmp_path), 60, interval=0.2, what="every task of the killed pool ran"
        )
        wait_until(lambda: inflight_count(r, "poison") == 0, 30, what="nothing left in flight")
    finally:
        survivor.send_signal(signal.SIGTERM)
        code = survivor.wait(30)
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(10)
    log = (tmp_path / "pool-survivor.log").read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert "unexpected error" not in log, log[-3000:]
    s = stats(r, "poison")
    assert s["processed"] == 40
    assert s["dead"] >= 3  # the two bad jids pushed raw and the ghost's field that is no token
    assert r.hlen(qkey("poison", f"inflight:{ghost}")) == 0
    assert not r.zscore("fencekit:{registry}:beats", ghost)  # the ghost was reaped and forgotten
    r.close()


# -- bounded memory: fenced jobs leave no key behind ------------------------------------------


class Fenced:
    queue = "memory"
    operation = "write"

    @classmethod
    async def perform(cls, payload: dict) -> None:
        await current_job().set_if_fresh("{memory}:latest", payload["i"])


async def test_ten_thousand_fenced_jobs_leave_no_key_per_job(redis_url: str) -> None:
    """A job's fenced write checks its delivery's in-flight record: no per-job fence key, ever
    (and with ``keep_result=0`` no record either)."""
    r = direct(redis_url)
    server = new_server(redis_url, Fenced, concurrency=64)
    async with Client(redis_url, keep_result=0) as client, running(server):
        for start in range(0, 10_000, 1_000):
            await client.enqueue_many(
                [Task("memory", "write", {"i": i}) for i in range(start, start + 1_000)]
            )
        await eventually(lambda: stats(r, "memory")["processed"] == 10_000, timeout=120, what="10,000 jobs")
    keys = sorted(k.decode() for k in r.scan_iter(count=1000))
    r.close()
    assert not [k for k in keys if k.startswith("fencekit:fence:")], keys[:10]
    assert len(keys) <= 8, keys  # stats, token counter, the registry, the one target: not one per job


async def test_kept_records_are_bounded_by_keep_finished_whatever_the_number_of_jobs(redis_url: str) -> None:
    """With records kept (the default ``keep_result``), a queue holds at most ``keep_finished`` of them."""
    r = direct(redis_url)
    server = new_server(redis_url, Fenced, concurrency=64, keep_finished=50)
    async with Client(redis_url) as client, running(server):
        for start in range(0, 2_000, 500):
            await client.enqueue_many([Task("memory", "write", {"i": i}) for i in range(start, start + 500)])
        await eventually(lambda: stats(r, "memory")["processed"] == 2_000, timeout=60, what="2,000 jobs")
        newest = await client.job(r.lindex("fencekit:{memory}:finished", 0).decode().rsplit(":", 1)[1])
    records = list(r.scan_iter(match="fencekit:{memory}:job:*", count=1000))
    assert len(records) == 50
    assert r.llen("fencekit:{memory}:finished") == 50
    assert all(0 < r.pttl(k) <= 3_600_000 for k in records)  # each also expires after keep_result
    assert newest is not None
    assert newest.status.value == "done"
    assert not list(r.scan_iter(match="fencekit:fence:*"))
    r.close()
