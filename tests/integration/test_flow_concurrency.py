"""Per-key concurrency on a real Redis and real processes (docs/guides/flow.md): the slot is
taken in ``ack_claim.lua`` and given back by whatever ends the delivery (ack,
retry, fail, timeout, cancel, the reaper); a task whose key is full is parked, not
lost, failed or counted, and does not hold up other keys."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.queue_helpers import (
    BEATS,
    capture_logger,
    eventually,
    new_server,
    pending,
    qkey,
    running,
    stats,
    worker,
)

from fencekit import App, Client, Task, current_job
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit.consume._settle import Retention
from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs.flow import flow_specs
from fencekit.jobs.worker import WorkerRegistry, inspect_worker
from fencekit.services._reaper import Reaper
from fencekit.settings import ServerSettings, defaults

KEYS = KeySpace()
RETENTION = Retention.of(defaults(ServerSettings))


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def slots_clear(r: Any, queue: str) -> bool:
    return not r.keys(qkey(queue, "slots:*")) and not r.keys(qkey(queue, "parked:*"))


async def test_two_at_once_per_tenant_and_other_tenants_go_on(redis_url: str, r: Any) -> None:
    runs: dict[str, list[tuple[float, float]]] = defaultdict(list)

    async def perform(payload: dict[str, Any]) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.05)
        runs[payload["tenant"]].append((start, time.monotonic()))

    keyed = worker("tenants", "run", perform, max_concurrency=2)
    async with Client(redis_url=redis_url) as client:
        # tenant a first, so a's parked tasks sit in front of b's
        tasks = [Task("tenants", "run", {"tenant": "a"}, concurrency_key="a") for _ in range(12)]
        tasks += [Task("tenants", "run", {"tenant": "b"}, concurrency_key="b") for _ in range(4)]
        await client.enqueue_many(tasks)
        server = new_server(redis_url, keyed, concurrency=16)
        async with running(server):
            await eventually(lambda: sum(len(v) for v in runs.values()) == 16, timeout=10, what="all ran")
    assert most_at_once(runs["a"]) == 2
    assert most_at_once(runs["b"]) == 2
    # b did not wait for a's queue to drain: its runs ended before a's last ones started
    assert max(e for _, e in runs["b"]) < max(s for s, _ in runs["a"])
    s = stats(r, "tenants")
    assert (s["processed"], s["failed"], s["retried"]) == (16, 0, 0)
    assert slots_clear(r, "tenants")


@pytest.mark.parametrize("how", ["retry", "fail", "timeout", "cancel"])
async def test_the_slot_is_given_back(redis_url: str, r: Any, how: str) -> None:
    ran: list[str] = []
    first = asyncio.Event()

    async def perform(payload: dict[str, Any]) -> None:
        ran.append(payload["name"])
        if payload["name"] == "first":
            first.set()
            if how in ("retry", "fail"):
                raise RuntimeError(how)
            await asyncio.sleep(30)  # timed out or cancelled

    queue = f"give_{how}"
    options: dict[str, Any] = {"max_concurrency": 1, "retry_count": 1 if how == "retry" else 0}
    if how == "timeout":
        options["timeout"] = 0.2
    keyed = worker(queue, "run", perform, **options)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task(queue, "run", {"name": "first"}, concurrency_key="t"))
        await client.enqueue(Task(queue, "run", {"name": "second"}, concurrency_key="t"))
        server = new_server(redis_url, keyed, concurrency=4)
        async with running(server):
            await asyncio.wait_for(first.wait(), 5)
            await asyncio.sleep(0.1)
            if how == "cancel":
                assert "second" not in ran  # parked behind the one slot
                assert await client.cancel(jid, queue=queue)
            await eventually(lambda: "second" in ran, timeout=10, what="the parked task ran")
            await eventually(lambda: slots_clear(r, queue), timeout=10, what="no slot left held")
    assert ran.index("second") > 0


async def dead_holder(redis_url: str, r: Any, queue: str, keyed: type) -> int:
    """A consumer "dead" claimed task "first" (the one slot of key t; "second" parked behind it)
    and stopped beating a minute ago; returns the token holding the slot."""
    async with Client(redis_url=redis_url) as client:
        await client.enqueue(Task(queue, "run", {"name": "first"}, concurrency_key="t"))
        await client.enqueue(Task(queue, "run", {"name": "second"}, concurrency_key="t"))
    qk = KEYS.queue(queue)
    flow = flow_specs([inspect_worker(keyed)], {queue: qk})[queue]
    ar = async_client(redis_url)
    try:
        reply = await arun(
            ar,
            scripts.ack_claim(
                pending=qk.pending,
                inflight=qk.inflight("dead"),
                token_counter=qk.token_counter,
                stats=qk.stats,
                wake=qk.wake,
                want=2,
                acks=[],
                flow=flow,
            ),
        )
        await arun(
            ar,
            scripts.heartbeat(
                consumers=KEYS.consumers,
                beats=KEYS.beats,
                store=KEYS.store,
                new_store_id="s",
                entries=[("dead", orjson.dumps({"queues": [queue]}))],
            ),
        )
    finally:
        await aclose_client(ar)
    _, token, _, _, *claimed = reply
    assert [orjson.loads(e)["params"]["name"] for e in claimed] == ["first"]
    assert r.smembers(qkey(queue, "slots:t")) == {str(token).encode()}
    assert r.llen(qkey(queue, "parked:t")) == 1  # "second" waits for the slot
    r.zadd(BEATS, {"dead": int(r.time()[0]) * 1000 - 60_000})
    return int(token)


@pytest.mark.parametrize("retry", [True, False], ids=["returned", "failed"])
async def test_a_reaped_holder_gives_its_slot_back(redis_url: str, r: Any, retry: bool) -> None:
    """The reaper returns (requeue.lua) or fails (fail.lua) the dead holder's task: its slot is
    free again and the task parked behind it is back in the queue."""
    queue = f"reaped_slot_{'r' if retry else 'f'}"

    async def perform(payload: dict[str, Any]) -> None:
        return None

    keyed = worker(queue, "run", perform, max_concurrency=1, retry=retry)
    await dead_holder(redis_url, r, queue, keyed)
    registry = WorkerRegistry()
    registry.add([keyed])
    ar = async_client(redis_url)
    try:
        reaper = Reaper(ar, KEYS, registry, ttl=5.0, logger=capture_logger("test.slots"), retention=RETENTION)
        assert await reaper.reap_once() == 1
    finally:
        await aclose_client(ar)
    assert not r.exists(qkey(queue, "slots:t"))  # the dead delivery's slot given back
    assert not r.exists(qkey(queue, "parked:t"))
    assert not r.sismember(qkey(queue, "parkedkeys"), "t")
    back = [(e["params"]["name"], e["attempt"]) for e in pending(r, queue)]  # next to claim first
    s = stats(r, queue)
    if retry:
        assert back == [("first", 1), ("second", 0)]
        assert (s["retried"], s["failed"]) == (1, 0)
    else:
        assert back == [("second", 0)]
        assert (s["retried"], s["failed"]) == (0, 1)


async def test_a_servers_reaper_frees_the_slot_a_dead_consumer_held(redis_url: str, r: Any) -> None:
    """A running Server's own reaper loop reaps the dead holder; its one slot then serves both tasks."""
    queue = "reaped_slot_server"
    ran: list[tuple[str, int]] = []

    async def perform(payload: dict[str, Any]) -> None:
        ran.append((payload["name"], current_job().attempt))

    keyed = worker(queue, "run", perform, max_concurrency=1)
    await dead_holder(redis_url, r, queue, keyed)
    server = new_server(redis_url, keyed, concurrency=4)
    async with running(server):
        await eventually(lambda: len(ran) == 2, what="both tasks ran: the dead consumer's slot came back")
        await eventually(lambda: slots_clear(r, queue), what="no slot left held")
    assert ran == [("first", 1), ("second", 0)]
    assert server.services is not None
    assert server.services.reaper.returned == 1
    assert stats(r, queue)["processed"] == 2


def test_options_are_checked_and_task_functions_apply_the_key() -> None:
    class NoMax:
        queue, operation = "q", "op"
        concurrency_key = staticmethod(lambda p: p["tenant"])

        @staticmethod
        async def perform(payload: dict[str, Any]) -> None:
            return None

    with pytest.raises(ConfigError, match="NoMax: attribute 'concurrency_key' needs 'max_concurrency'"):
        inspect_worker(NoMax)
    app = App()

    @app.task(queue="q", concurrency_key=lambda p: p["tenant"], max_concurrency=2)
    async def work(tenant: int, n: int = 0) -> None:
        return None

    assert work.build(7).concurrency_key == "7"
    assert work.options(concurrency_key="other").build(7).concurrency_key == "other"
    assert b'"ckey":"7"' in work.build(7).envelope()
    with pytest.raises(PayloadError, match="concurrency_key"):
        Task("q", "op", concurrency_key="has space").envelope()


POOL_APP = textwrap.dedent(
    """
    import asyncio
    import os
    import signal
    import time

    from fencekit import current_job

    OUT = os.environ["CONC_OUT"]


    class Tenant:
        queue = "keyed"
        operation = "run"
        max_concurrency = 2
        retry_count = 1

        @staticmethod
        async def perform(payload):
            start = time.time()
            if payload.get("kill") and current_job().attempt == 0:
                with open(os.path.join(OUT, "killed"), "w") as f:
                    f.write(f"{os.getpid()} {start}")
                os.kill(os.getpid(), signal.SIGKILL)
            await asyncio.sleep(0.1)
            with open(os.path.join(OUT, f"{os.getpid()}.txt"), "a") as f:
                f.write(f"{payload['tenant']} {payload['i']} {start} {time.time()}\\n")


    WORKERS = [Tenant]
    """
)


@pytest.mark.slow
def test_max_2_per_tenant_over_two_pools_with_a_killed_child_holding_a_slot(
    tmp_path: Path, redis_url: str, r: Any
) -> None:
    (tmp_path / "conc_app.py").write_text(POOL_APP)
    out = tmp_path / "out"
    out.mkdir()
    tenants = ["t1", "t2", "t3"]
    n = 20  # per tenant

    async def fill() -> None:
        async with Client(redis_url=redis_url) as client:
            tasks = [
                Task("keyed", "run", {"tenant": t, "i": i, "kill": t == "t1" and i == 0}, concurrency_key=t)
                for i in range(n)
                for t in tenants
            ]
            await client.enqueue_many(tasks)

    asyncio.run(fill())
    env = {
        **os.environ,
        "CONC_OUT": str(out),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    pools, logs = [], []
    for k in range(2):
        log = (tmp_path / f"pool{k}.log").open("wb")
        logs.append(log)
        pools.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fencekit.pool",
                    "conc_app:WORKERS",
                    "--procs",
                    "2",
                    "--concurrency",
                    "8",
                    "--redis-url",
                    redis_url,
                    "--web-port",
                    "off",
                ],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def lines() -> list[list[str]]:
        return [line.split() for f in out.glob("*.txt") for line in f.read_text().splitlines()]

    try:
        deadline = time.time() + 25
        while time.time() < deadline and len(lines()) < n * len(tenants):
            time.sleep(0.2)
    finally:
        for pool in pools:
            pool.send_signal(signal.SIGTERM)
        for pool in pools:
            pool.wait(30)
        for log in logs:
            log.close()
    done = lines()
    assert (out / "killed").exists()  # a child died holding a slot of t1
    ran = {(t, int(i)) for t, i, _, _ in done}
    assert ran == {(t, i) for t in tenants for i in range(n)}  # every task ran, t1's too
    for t in tenants:
        intervals = [(float(s), float(e)) for tt, _, s, e in done if tt == t]
        assert most_at_once(intervals) <= 2, t
    print(f"\n[max_concurrency 2, 2 pools x 2 children] {len(done)} runs, at most "
          f"{max(most_at_once([(float(s), float(e)) for tt, _, s, e in done if tt == t]) for t in tenants)} "
          "per tenant at once; the killed child's slot given back")  # fmt: skip
    assert slots_clear(r, "keyed")


async def test_parked_tasks_count_as_pending_and_are_purged(redis_url: str, r: Any) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    ran: list[int] = []

    async def perform(payload: dict[str, Any]) -> None:
        ran.append(payload["i"])
        started.set()
        await release.wait()

    keyed = worker("parked", "run", perform, max_concurrency=1)
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task("parked", "run", {"i": i}, concurrency_key="k") for i in range(4)])
        server = new_server(redis_url, keyed, concurrency=4)
        async with running(server):
            await asyncio.wait_for(started.wait(), 5)
            await eventually(lambda: r.llen(qkey("parked", "parked:k")) == 3, what="three parked")
            queue = client.queue("parked")
            assert await queue.length() == 3
            assert [t.params["i"] for t in await queue.pending()] == [1, 2, 3]
            assert await queue.purge() == 3
            assert await queue.length() == 0
            release.set()
            await eventually(lambda: slots_clear(r, "parked"), what="the slot given back")
    assert ran == [0]
    assert r.exists(qkey("parked", "parkedkeys")) == 0
