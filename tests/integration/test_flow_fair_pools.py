"""Fair share and per-key rate limits over two real pools (``python -m fencekit.pool``).

- A small key's 20 tasks queued after 2,000 of a big key all run before 200 of the big key's
  (before fair keys: after all 2,000).
- Under a 100:1 backlog skew (10,000 : 100), the two keys' throughput while both have work is
  even: Jain's index (sum x)^2 / (n * sum x^2) of their claim counts is at least 0.95.
- A per-key limit of 5/s over 10 keys: no key ever starts more than 5 + burst (1) tasks in any
  second, on Redis's clock, across both pools -- and the keys run side by side, not one
  bucket's worth for all.
- A task parked for its key's token, whose pool is SIGKILLed, runs on the other pool.

Claim order and times are the delivery tokens (Redis TIME in µs at the claim, rising).
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
import redis
from tests.fault_helpers import PoolRunner, write_app
from tests.integration.test_flow_rate import assert_within_bucket
from tests.queue_helpers import qkey

from fencekit import Task
from fencekit.jobs.flow import parse_rate
from fencekit.produce.sync_client import SyncClient
from fencekit.testing import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults")]

APP = textwrap.dedent(
    """
    import os
    from fencekit import current_job

    RUNS = os.environ["TEST_RUNS_DIR"]

    def record(params):
        with open(os.path.join(RUNS, f"fair-{os.getpid()}.log"), "a") as f:
            f.write(f"{params['k']} {params['n']} {current_job().token.value}\\n")

    class Tenant:
        queue = "tenants"
        operation = "work"

        @staticmethod
        async def perform(payload):
            record(payload)

    class Partner:
        queue = "partners"
        operation = "call"
        rate_limit = "5/s"
        rate_key = staticmethod(lambda p: p["k"])

        @staticmethod
        async def perform(payload):
            record(payload)

    WORKERS = [Tenant, Partner]
    """
)


def claims(directory: Path) -> list[tuple[int, str]]:
    """(delivery token, key) of every run so far, in claim order."""
    return sorted((token, key) for token, key, _ in runs(directory))


def small(directory: Path) -> int:
    return sum(key == "small" for _, key in claims(directory))


def runs(directory: Path) -> list[tuple[int, str, int]]:
    """(delivery token, key, n) of every run so far."""
    out = []
    for path in directory.glob("fair-*.log"):
        for line in path.read_text().splitlines():
            key, n, token = line.split()
            out.append((int(token), key, int(n)))
    return out


def two_pools(tmp_path: Path, url: str, *args: str) -> list[PoolRunner]:
    pools = [PoolRunner(tmp_path, url, "--procs", "1", *args, app="fairapp:WORKERS") for _ in range(2)]
    for pool in pools:
        pool.wait_ready()
    return pools


def enqueue(url: str, queue: str, operation: str, counts: dict[str, int], **keys: bool) -> None:
    with SyncClient(url) as client:
        for key, n in counts.items():
            client.enqueue_many(
                [
                    Task(queue, operation, {"k": key, "n": i}, fair_key=key if keys.get("fair") else None,
                         rate_key=key if keys.get("rate") else None)
                    for i in range(n)
                ]
            )  # fmt: skip


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    directory = write_app(tmp_path)
    (tmp_path / "fairapp.py").write_text(APP)
    return directory


def test_a_small_keys_20_run_before_200_of_the_big_keys_2000_over_two_pools(
    tmp_path: Path, runs_dir: Path, redis_url: str
) -> None:
    enqueue(redis_url, "tenants", "work", {"big": 2000}, fair=True)
    enqueue(redis_url, "tenants", "work", {"small": 20}, fair=True)
    pools = two_pools(tmp_path, redis_url)
    try:
        wait_until(
            lambda: sum(k == "small" for _, k in claims(runs_dir)) == 20, 60, what="the small key's 20"
        )
    finally:
        for pool in pools:
            pool.stop()
    order = [k for _, k in claims(runs_dir)]
    last_small = max(i for i, k in enumerate(order) if k == "small")
    assert order[:last_small].count("big") < 200, order[: last_small + 1]


def test_jains_index_of_two_keys_under_a_100_to_1_skew_is_at_least_095(
    tmp_path: Path, runs_dir: Path, redis_url: str
) -> None:
    enqueue(redis_url, "tenants", "work", {"big": 10_000}, fair=True)
    enqueue(redis_url, "tenants", "work", {"small": 100}, fair=True)
    pools = two_pools(tmp_path, redis_url, "--concurrency", "32")
    try:
        wait_until(
            lambda: sum(k == "small" for _, k in claims(runs_dir)) == 100, 90, what="the small key's 100"
        )
    finally:
        for pool in pools:
            pool.stop()
    order = [k for _, k in claims(runs_dir)]
    both = order[: max(i for i, k in enumerate(order) if k == "small") + 1]  # while both had work
    x = [both.count("big"), both.count("small")]
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x))
    print(f"claims while both keys had work: big {x[0]}, small {x[1]}; Jain's index {jain:.4f}")
    assert jain >= 0.95, x


def test_a_per_key_limit_of_5_per_second_over_10_keys_and_two_pools(
    tmp_path: Path, runs_dir: Path, redis_url: str
) -> None:
    keys = [f"partner-{i}" for i in range(10)]
    enqueue(redis_url, "partners", "call", dict.fromkeys(keys, 16), rate=True)
    pools = two_pools(tmp_path, redis_url)
    try:
        wait_until(lambda: len(claims(runs_dir)) == 160, 60, what="every key's 16")
    finally:
        for pool in pools:
            pool.stop()
    by_key: dict[str, list[float]] = {}
    for token, key in claims(runs_dir):
        by_key.setdefault(key, []).append(token / 1e6)
    assert sorted(by_key) == keys
    rate = parse_rate("5/s")
    for key, times in by_key.items():
        assert len(times) == 16
        for start in times:  # the bound: in any second, at most 5 + burst
            assert sum(start <= t < start + 1.0 for t in times) <= 5 + rate.burst, (key, times)
        assert_within_bucket(times, rate)  # and the bucket's own, between any two claims
    first = min(t for times in by_key.values() for t in times)
    early = sum(t < first + 2.0 for times in by_key.values() for t in times)
    assert early > 2 * (5 + rate.burst), early  # the keys ran side by side, not one bucket for all


def test_a_task_parked_for_its_keys_token_whose_pool_was_sigkilled_runs_on_another_pool(
    tmp_path: Path, runs_dir: Path, redis_url: str, r: redis.Redis
) -> None:
    first = PoolRunner(tmp_path, redis_url, "--procs", "1", "--heartbeat-ttl", "2", app="fairapp:WORKERS")
    first.wait_ready()
    enqueue(redis_url, "partners", "call", {"p-1": 12, "p-2": 12}, rate=True)
    wait_until(lambda: len(claims(runs_dir)) >= 4, 30, what="the first runs")
    assert r.exists(qkey("partners", "rparked:call\x1fp-1"), qkey("partners", "rparked:call\x1fp-2")) > 0
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    first.stop()
    time.sleep(1.0)  # the parked keys' tokens come due with nobody to look again
    second = PoolRunner(tmp_path, redis_url, "--procs", "1", app="fairapp:WORKERS")
    try:
        second.wait_ready()
        everyone = {(k, n) for k in ("p-1", "p-2") for n in range(12)}
        wait_until(lambda: {(k, n) for _, k, n in runs(runs_dir)} == everyone, 60, what="all 24 ran")
    finally:
        second.stop()
    assert not r.exists(qkey("partners", "rparkedops"), qkey("partners", "rparked:call\x1fp-1"))
