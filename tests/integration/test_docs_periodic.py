"""The periodic page's example (docs/guides/periodic.md) runs as written."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.docs_blocks import block_with
from tests.queue_helpers import running


async def test_the_periodic_example_registers_both_schedules(redis_url: str):
    """The page's schedules validate, and a Server serving them lists both with their next runs."""
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
