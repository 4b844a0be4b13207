"""The hooks page's example (docs/guides/hooks.md) runs as written."""

from __future__ import annotations

from typing import Any

import pytest
from tests.docs_blocks import block_with, with_url
from tests.queue_helpers import eventually, running

from fencekit import Task


async def test_the_hooks_example_tells_failures_busy_locks_and_traces(
    redis_url: str, capsys: pytest.CaptureFixture[str]
):
    from datetime import timedelta

    from fencekit import Client, LockNotAcquired, Server

    namespace: dict[str, Any] = {}
    exec(with_url(block_with("class BuildReport"), redis_url), namespace)
    lock, metrics, failed = namespace["lock"], namespace["metrics"], namespace["failed"]
    handle = lock.acquire("report-7", ttl=timedelta(seconds=5))
    with pytest.raises(LockNotAcquired):
        lock.acquire("report-7", ttl=timedelta(seconds=5))
    assert capsys.readouterr().out == "report-7\n"  # on_lock_acquire_failed=print
    lock.release(handle)

    class Broken:
        queue = "reports"
        operation = "broken"
        retry = False

        @classmethod
        async def perform(cls, payload: dict) -> None:
            raise RuntimeError("no data")

    server = Server(redis_url=redis_url, web_port=None, hooks=metrics)
    server.add_workers(*namespace["app"].workers, Broken)
    client = namespace["client"]
    async with running(server):
        ok = await client.enqueue(Task("reports", "build", {"id": 7}))
        bad = await client.enqueue(Task("reports", "broken", {}))
        await eventually(lambda: failed, what="the failure told")
    await client.close()
    assert [e.jid for e in failed] == [bad]
    assert isinstance(failed[0].error, RuntimeError)
    assert ok != bad
    assert namespace["app"].hooks.trace_enqueue is not None  # otel_hooks
    assert isinstance(client, Client)
