"""A stop ends before its grace deadline whatever Redis does: Server and pool children stopped while
their loops are blocked in Redis calls, 20 stops per placement and topology.

Redis (one server, or every node of a Redis Cluster) is paused with SIGSTOP, so every call in
flight and every next one hangs with its socket open; then the process is stopped. Every task
of a Server or a child belongs to a task scope (:mod:`fencekit._aio.scope`): a stop cancels the
loops wherever they wait, and the consumer gives Redis
:data:`~fencekit.consume._returns.RETURN_WAIT` after the grace to take back what it holds, so
the stop ends before ``grace`` + :data:`~fencekit.runtime.services.GRACE_MARGIN` -- the
deadline past which the pool's supervisor kills a child. Before, a Server stopped on a hung
Redis waited for it forever (in the consumer's return of its unfinished tasks), and a child
until the supervisor killed it.

- **Server**: two jobs run; one holds until Redis is paused, then finishes, so the consumer's
  turn (its ack) hangs too; the other runs until the stop's grace is over and it is cancelled.
  The test waits until the heartbeat, the reaper, the scheduler, the
  consumer's turn loop and its cancel listener are each blocked in a Redis call
  (read from their tasks' await chains), stops the Server and asserts that ``run()`` returned,
  without an error, before the deadline.
- **Pool**: two exec'd children hold a job each; Redis is paused, the jobs finish (their acks
  hang), and both children get SIGTERM: each must exit by itself (not be killed) before the
  deadline. Redis comes back, the supervisor restarts them, and so on; the last round stops
  the whole pool instead: no child is killed, and the pool's stop ends too (within the
  children's deadline and one :data:`~fencekit.runtime.services.STOP_STEP`, the supervisor's
  bounded wait to return their tasks to a Redis that does not answer).

Nothing is asserted about speed, only that each stop ended before its deadline. The 20 stops
per placement and topology are split over parametrized tests to keep each well within the
suite's per-test timeout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import capture_logger, messages, new_server

from fencekit import Client, Task
from fencekit._aio.scope import where
from fencekit.pool import Pool
from fencekit.runtime.services import GRACE_MARGIN, STOP_STEP
from fencekit.testing import RedisServer
from fencekit.testing.cluster import LocalCluster

GRACE = 0.5
DEADLINE = GRACE + GRACE_MARGIN
"""Seconds from the stop (a SIGTERM, ``server.stop()``) by which the process must have ended."""
SERVER_ROUNDS = (4, 5)  # 4 tests x 5 stops = 20 Server stops per topology
POOL_ROUNDS = (2, 4)  # 2 tests x (4 rounds + the pool's stop) x 2 children = 20 child stops per topology

BLOCKING = (
    "fencekit-heartbeat",
    "fencekit-reaper",
    "fencekit-scheduler",
    "fencekit-turns-",
    "fencekit-cancels-",
)
"""Tasks (by name prefix) that must each be blocked in a Redis call when the Server is stopped (the
waker's BLPOP too while the consumer is idle; here its turn hangs, so the waker may be idle)."""


class Paused:
    """One topology of Redis that a test can pause (SIGSTOP) and resume; its URL."""

    def __init__(self, url: str, nodes: list[RedisServer], cluster: LocalCluster | None = None) -> None:
        self.url = url
        self.nodes = nodes
        self.cluster = cluster

    def pause(self) -> None:
        for node in self.nodes:
            node.pause()

    def resume(self) -> None:
        for node in self.nodes:
            node.resume()
        if self.cluster is not None:
            self.cluster.wait_stable(timeout=30)

    def flush(self) -> None:
        for node in self.nodes:
            with node.client() as client:
                if self.cluster is None or client.execute_command("ROLE")[0] in (b"master", "master"):
                    client.flushall()


@pytest.fixture(scope="module", params=["single", "cluster"])
def topology(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, server_binary: str
) -> Iterator[Paused]:
    """A Redis of this module's own (it is paused): one server, or a 3-master cluster."""
    if request.param == "single":
        server = RedisServer(tmp_path_factory.mktemp("stop-redis"), binary=server_binary)
        server.start()
        try:
            yield Paused(server.url(), [server])
        finally:
            server.resume()
            server.cleanup()
        return
    cluster = LocalCluster(tmp_path_factory.mktemp("stop-cluster"), binary=server_binary)
    cluster.start(timeout=60)
    try:
        yield Paused(cluster.url(), list(cluster.nodes), cluster)
    finally:
        for node in cluster.nodes:
            node.resume()
        cluster.cleanup()


# -- Server -----------------------------------------------------------------------------------


class Hold:
    """Holds until :attr:`release` is set (the test sets it once Redis is paused), then succeeds;
    with ``{"forever": true}``, holds until cancelled (the stop's grace runs out on it)."""

    queue = "stop-server"
    operation = "hold"
    release: asyncio.Event | None = None
    started: list[str] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        assert cls.release is not None
        cls.started.append("forever" if payload.get("forever") else "released")
        await (asyncio.Event() if payload.get("forever") else cls.release).wait()


def in_redis_call(task: asyncio.Task[Any]) -> bool:
    """True while ``task`` waits inside redis-py or fencekit's Redis boundary (its await chain)."""
    chain = where(task, depth=100)
    return "/redis/" in chain or "/fencekit/_redis/" in chain


async def blocked_in_redis(scope_tasks: Any, timeout: float = 10.0) -> dict[str, str]:
    """Wait until a task of each :data:`BLOCKING` prefix is in a Redis call; their chains, by name."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = scope_tasks()
        blocked = {t.get_name(): where(t, depth=2) for t in tasks if in_redis_call(t)}
        missing = [p for p in BLOCKING if not any(name.startswith(p) for name in blocked)]
        if not missing:
            return blocked
        if time.monotonic() > deadline:
            chains = "\n".join(f"  {t.get_name()}: {where(t, depth=3)}" for t in tasks)
            raise AssertionError(f"not blocked in a Redis call: {missing}; the tasks:\n{chains}")
        await asyncio.sleep(0.05)


async def _stop_a_blocked_server(topology: Paused) -> float:
    """One Server, stopped while its loops are blocked in Redis calls; seconds its stop took."""
    Hold.release, Hold.started = asyncio.Event(), []
    server = new_server(topology.url, Hold, grace=GRACE, heartbeat_ttl=1.5, concurrency=2)
    run = asyncio.create_task(server.run())
    paused = False
    try:
        await asyncio.wait_for(server.started.wait(), 30)
        async with Client(topology.url) as client:
            await client.enqueue(Task(Hold.queue, Hold.operation, {}))
            await client.enqueue(Task(Hold.queue, Hold.operation, {"forever": True}))
        await asyncio.wait_for(_until(lambda: len(Hold.started) == 2, "both jobs started"), 30)
        topology.pause()
        paused = True
        Hold.release.set()  # the job ends: its ack is the consumer's next (hung) call
        assert server.scope is not None
        await blocked_in_redis(server.scope.tasks)
        stopped = time.monotonic()
        server.stop()
        done, _ = await asyncio.wait({run}, timeout=DEADLINE)
        took = time.monotonic() - stopped
        assert run in done, f"the Server did not stop within {DEADLINE}s of its stop (grace {GRACE}s)"
        run.result()  # ended without an error
        log = messages(server.logger)
        assert any("could not return unfinished tasks" in m for m in log), log
        return took
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        if paused:
            topology.resume()
        topology.flush()


@pytest.mark.slow
@pytest.mark.parametrize("part", range(SERVER_ROUNDS[0]))
async def test_a_server_blocked_in_redis_calls_stops_before_its_grace_deadline(
    topology: Paused, part: int
) -> None:
    took = [await _stop_a_blocked_server(topology) for _ in range(SERVER_ROUNDS[1])]
    assert all(t < DEADLINE for t in took), took


# -- pool children ----------------------------------------------------------------------------

APP = textwrap.dedent(
    """
    import asyncio
    import os

    from fencekit import current_job

    class Hold:
        queue = "stop-pool"
        operation = "hold"

        @classmethod
        async def perform(cls, payload):
            # says it started, then holds until the test's flag file exists (Redis paused by then)
            open(os.path.join(payload["dir"], "started-" + current_job().jid), "w").close()
            while not os.path.exists(payload["flag"]):
                await asyncio.sleep(0.01)

    WORKERS = [Hold]
    """
)


@pytest.fixture
def stop_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "stopapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    yield "stopapp:WORKERS"
    sys.modules.pop("stopapp", None)


async def _exited(pid: int) -> None:
    """Until process ``pid`` has exited (its pidfd is readable; the supervisor reaps it)."""
    fd = os.pidfd_open(pid)
    try:
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, ready.set)
        try:
            await ready.wait()
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


async def _until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.02)


def _how(log: list[str], pid: int) -> str:
    """How the supervisor says child ``pid`` ended ("exited with code N" / "killed by SIG...")."""
    lines = [m for m in log if f"(pid {pid})" in m and (" exited with code " in m or " killed by " in m)]
    return lines[-1] if lines else f"(no exit line for pid {pid})"


async def _hold_one_job_each(pool: Pool, url: str, directory: Path, flag: Path) -> None:
    """Every child serving and running one held job (the jobs wait for ``flag``)."""
    assert pool.supervisor is not None
    supervisor = pool.supervisor
    await _until(lambda: all(c.ready for c in supervisor.children), "every child serving")
    before = {p.name for p in directory.glob("started-*")}
    async with Client(url) as client:
        for _ in supervisor.children:
            await client.enqueue(Task("stop-pool", "hold", {"dir": str(directory), "flag": str(flag)}))
    need = len(supervisor.children)
    await _until(
        lambda: len({p.name for p in directory.glob("started-*")} - before) >= need, "each child holds a job"
    )


@pytest.mark.slow
@pytest.mark.parametrize("part", range(POOL_ROUNDS[0]))
async def test_pool_children_blocked_in_redis_calls_exit_before_their_grace_deadline(
    topology: Paused, stop_app: str, tmp_path: Path, part: int
) -> None:
    logger = capture_logger(f"test.fencekit.stop-pool.{id(tmp_path)}")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    pool = Pool(
        stop_app,
        procs=2,
        redis_url=topology.url,
        grace=GRACE,
        heartbeat_ttl=3.0,
        hang_timeout=60.0,  # a loaded machine's slow child is not the subject here
        web_port=0,
        logger=logger,
    )
    paused = False
    stops: list[tuple[int, float, str]] = []  # (pid, seconds from SIGTERM to exit, how)
    try:
        await asyncio.wait_for(pool.start(), 60)
        assert pool.supervisor is not None
        supervisor = pool.supervisor
        for round_ in range(POOL_ROUNDS[1] + 1):
            flag = jobs / f"release-{round_}"
            await _hold_one_job_each(pool, topology.url, jobs, flag)
            pids = [c.pid for c in supervisor.children]
            exits = [asyncio.ensure_future(_exited(pid)) for pid in pids]
            topology.pause()
            paused = True
            flag.touch()  # the jobs end: their acks hang
            await asyncio.sleep(0.3)
            sent = time.monotonic()
            last = round_ == POOL_ROUNDS[1]
            if last:  # the whole pool
                stopping = asyncio.ensure_future(pool.stop())
            else:
                for pid in pids:
                    os.kill(pid, signal.SIGTERM)
            done, _ = await asyncio.wait(exits, timeout=DEADLINE + 5.0)
            for pid, exit_ in zip(pids, exits):
                took = time.monotonic() - sent if exit_ in done else float("inf")
                stops.append((pid, took, ""))
            if last:
                pool_done, _ = await asyncio.wait({stopping}, timeout=DEADLINE + STOP_STEP + 5.0)
                pool_took = time.monotonic() - sent
                assert stopping in pool_done, f"the pool did not stop ({pool_took:.1f}s)"
                stopping.result()
            topology.resume()
            paused = False
        log = messages(logger)
        stops = [(pid, took, _how(log, pid)) for pid, took, _ in stops]
        assert len(stops) == 2 * (POOL_ROUNDS[1] + 1)
        late = [s for s in stops if not s[1] < DEADLINE or "exited with code" not in s[2]]
        assert not late, f"children not ended by themselves within {DEADLINE}s of SIGTERM: {late}"
        assert not [m for m in log if "did not stop within the grace period" in m]
        assert pool_took < DEADLINE + STOP_STEP, pool_took
    finally:
        if paused:
            topology.resume()
        if pool.supervisor is not None and not pool.supervisor.stopped.is_set():
            await asyncio.wait_for(pool.stop(fast=True), 60)
        topology.flush()
