"""Periodic jobs on real processes: three pools on one Redis, each tick enqueued and run once.

Three ``python -m fencekit.pool tests.periodic_app:app --procs 1`` processes
(each its own supervisor, so three schedule loops) share a private Redis and
two one-second schedules in queue ``cron``: ``tick`` (catch-up off) and
``tick_all`` (catch-up on). The window is ten ticks, ``[t0, t0 + 10 s)``,
``t0`` a whole second after all three pools are ready. Runs are counted
outside Redis (each run appends its jid to a file) and enqueues inside it
(the ``enqueued`` counter of the queue, and each run's record).

What is asserted:

- **no tick twice, ever**: every jid in the run files appears once, and the
  queue's ``enqueued`` counter equals the number of distinct ticks run (a
  tick enqueued twice would count twice);
- **undisturbed, and with one pool's whole process group SIGSTOPped for 4 s
  mid-window**: exactly ten runs of each schedule in the window, one per tick;
- **Redis restarted (AOF) mid-window**: ``tick_all`` (catch-up on) still runs
  exactly ten, none skipped; ``tick`` (catch-up off) runs every tick outside
  the outage once (the outage: from 1 s before the stop to 2 s after Redis
  answers again, the loops' back-off included) and may skip ticks inside it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekit.testing import RedisServer, wait_until

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


class PeriodicPool:
    """One ``python -m fencekit.pool`` in its own session (SIGSTOP reaches all of it)."""

    def __init__(self, directory: Path, url: str, name: str, env: dict[str, str] | None = None) -> None:
        self.log = directory / f"pool-{name}.log"
        self._out = self.log.open("wb")
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "TEST_RUNS_DIR": str(directory / "runs"),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fencekit.pool", "tests.periodic_app:app", "--procs", "1",
             "--redis-url", url, "--web-port", "-1"],
            cwd=REPO, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_until(lambda: "pool ready" in self.output() or self.proc.poll() is not None, 30, what="ready")
        assert self.proc.poll() is None, self.output()[-3000:]

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()


@pytest.fixture
def aof_redis(tmp_path: Path, server_binary: str) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", binary=server_binary, appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def runs_of(runs_dir: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for path in runs_dir.glob("runs-*.log"):
        counts.update(line for line in path.read_text().splitlines() if line)
    return counts


def at(ms: int) -> None:
    """Sleep until Unix time ``ms`` (this process's clock)."""
    time.sleep(max(0.0, ms / 1000 - time.time()))


def ready_window(pools: list[PeriodicPool], seconds: int) -> tuple[int, range]:
    """Wait for every pool; the window: ``seconds`` one-second ticks from a whole second 2 s on."""
    for pool in pools:
        pool.wait_ready()
    t0 = (int(time.time()) + 2) * 1000
    return t0, range(t0, t0 + seconds * 1000, 1000)


def ticks(counts: collections.Counter[str], operation: str) -> dict[int, int]:
    """Tick (ms) -> runs, for the runs of ``operation`` (jid ``cron:<operation>:<tick ms>``)."""
    prefix = f"cron:{operation}:"
    return {int(jid[len(prefix) :]): n for jid, n in counts.items() if jid.startswith(prefix)}


@pytest.mark.parametrize("disturbance", ["none", "sigstop", "redis-restart"])
def test_three_pools_run_each_tick_of_a_one_second_schedule_once(
    tmp_path: Path, aof_redis: RedisServer, disturbance: str
) -> None:
    (tmp_path / "runs").mkdir()
    pools = [PeriodicPool(tmp_path, aof_redis.url(), name) for name in "ABC"]
    outage: tuple[int, int] | None = None
    try:
        t0, window = ready_window(pools, 10)
        if disturbance == "sigstop":
            at(t0 + 3000)
            pools[1].signal_group(signal.SIGSTOP)
            at(t0 + 7000)
            pools[1].signal_group(signal.SIGCONT)
        elif disturbance == "redis-restart":
            at(t0 + 3000)
            down = int(time.time() * 1000)
            aof_redis.restart()
            outage = (down - 1000, int(time.time() * 1000) + 2000)
        at(t0 + 10_000 + 1500)  # the last tick's run has had 1.5 s
        counts = runs_of(tmp_path / "runs")
        enqueued = int(aof_redis.client().hget("fencekit:{cron}:stats", "enqueued") or 0)
    finally:
        for pool in pools:
            pool.stop()
        logs = "\n".join(p.output()[-2000:] for p in pools)

    assert all(n == 1 for n in counts.values()), (counts, logs)  # no tick run twice, ever
    assert enqueued == len(counts), (enqueued, counts)  # no tick enqueued twice, ever
    every = ticks(counts, "tick_all")
    assert [t for t in window if t in every] == list(window), (sorted(every), logs)  # catch-up on: all ten
    latest = ticks(counts, "tick")
    if outage is None:
        assert [t for t in window if t in latest] == list(window), (sorted(latest), logs)  # exactly ten
    else:
        outside = [t for t in window if not outage[0] <= t <= outage[1]]
        assert [t for t in outside if t in latest] == outside, (sorted(latest), outage, logs)
        assert len(outside) >= 6


FAKETIME = next(
    (
        str(p)
        for p in (
            Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
            Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
            Path("/usr/lib/faketime/libfaketime.so.1"),
        )
        if p.exists()
    ),
    None,
)


def test_a_pool_whose_clock_runs_3_s_ahead_skips_no_tick(tmp_path: Path, aof_redis: RedisServer) -> None:
    """Two pools on one Redis, pool A's clock 3 s ahead (libfaketime, ``FAKETIME=+3s``), over 12 s.

    The campaign's scenario: A, ahead, enqueues each tick first (up to 3 s early),
    so the newest tick stored is ahead of B's clock and B's proposals are
    refused. Whenever one of A's rounds came later than a period (a loaded
    machine; here: A's process group SIGSTOPped for 2.5 s mid-window), A
    proposed only its newest tick (``Schedule.due(282000, 0, 285282) ==
    [285000]``) and the ticks in between were enqueued by nobody (B would reach
    them 3 s later, when they are no longer newer than the stored tick): 3 to 4
    of 30 missing. Now a catch-up-off round proposes every missed tick and the
    script collapses only those already past on Redis's clock. Asserted: A's
    clock is ahead; every tick of the window run exactly once, for catch-up off
    and on; none twice.
    """
    assert FAKETIME is not None, "libfaketime is missing: apt-get install libfaketime (.ci/run does)"
    (tmp_path / "runs").mkdir()
    ahead = {"LD_PRELOAD": FAKETIME, "FAKETIME": "+3s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    pools = [
        PeriodicPool(tmp_path, aof_redis.url(), "A", env=ahead),
        PeriodicPool(tmp_path, aof_redis.url(), "B"),
    ]
    try:
        t0, window = ready_window(pools, 12)
        at(t0 + 4000)
        pools[0].signal_group(signal.SIGSTOP)
        at(t0 + 6500)
        pools[0].signal_group(signal.SIGCONT)
        at(t0 + 12_000 + 1500)
        counts = runs_of(tmp_path / "runs")
        enqueued = int(aof_redis.client().hget("fencekit:{cron}:stats", "enqueued") or 0)
    finally:
        for pool in pools:
            pool.stop()
        logs = "\n".join(p.output()[-2000:] for p in pools)
    skewed = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **ahead}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert float(skewed.stdout) - time.time() > 2.5  # A's clock really was ahead
    assert all(n == 1 for n in counts.values()), (counts, logs)
    assert enqueued == len(counts), (enqueued, counts)
    for operation in ("tick", "tick_all"):
        ran = ticks(counts, operation)
        missing = [t - t0 for t in window if t not in ran]
        assert missing == [], (operation, missing, logs)
