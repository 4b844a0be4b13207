"""What durable acknowledgement costs: enqueue with and without ``WAIT`` for a replica.

A master and one replica on loopback (the replica in sync before timing).
``durable_replicas=1`` sends ``WAIT 1 <timeout>`` after the enqueue script in
the same round trip (redis-py pipeline), so the enqueue returns only once the
replica has the task. Compared side by side with ``durable_replicas=0`` for a
single ``enqueue`` and for ``enqueue_many`` of 1,000 tasks; the ratio is the
price of surviving a failover. Consumers' acks pay the same ``WAIT`` once per
turn (``--durable-replicas``).

    python -m pytest bench/bench_durable.py --benchmark-only
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencekit import Client, Task
from fencekit.testing import RedisServer, wait_until

RESULTS: dict[tuple[str, int], float] = {}


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    base: Path = tmp_path_factory.mktemp("durable")
    primary = RedisServer(base / "m", config={"repl-diskless-sync-delay": 0}).start()
    replica = RedisServer(base / "r", config={"replicaof": f"127.0.0.1 {primary.port}"}).start()
    probe = primary.client()
    wait_until(lambda: probe.info("replication").get("slave0", {}).get("state") == "online", 15)
    probe.close()
    yield primary
    replica.cleanup()
    primary.cleanup()


@pytest.mark.parametrize("batch", [1, 1000])
@pytest.mark.parametrize("replicas", [0, 1])
def test_enqueue(
    benchmark: Any, master: RedisServer, loop: asyncio.AbstractEventLoop, replicas: int, batch: int
):
    benchmark.group = f"enqueue of {batch} task(s), with and without WAIT for a replica"
    client = Client(master.url(), durable_replicas=replicas, durable_timeout=2.0)
    client.logger.setLevel("WARNING")

    async def once() -> None:
        await client.enqueue_many(Task("durable", "op", {"n": i}) for i in range(batch))

    loop.run_until_complete(once())  # warm up: connections, scripts
    benchmark.pedantic(lambda: loop.run_until_complete(once()), rounds=30 if batch > 1 else 300, iterations=1)
    loop.run_until_complete(client.close())
    RESULTS[("durable" if replicas else "plain", batch)] = benchmark.stats.stats.median


def test_print_ratios() -> None:
    """Durable / plain per case (run after the cases above)."""
    if not RESULTS:
        pytest.skip("run with the benchmark cases")
    print("\nenqueue, median per call")
    for batch in (1, 1000):
        plain, durable = RESULTS.get(("plain", batch)), RESULTS.get(("durable", batch))
        if plain and durable:
            print(
                f"batch {batch:>5}: plain {plain * 1e6:9.1f} µs, WAIT 1 replica {durable * 1e6:9.1f} µs,"
                f" cost x{durable / plain:.2f}"
            )
