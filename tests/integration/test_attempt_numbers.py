"""One attempt number (the first hour, item 4): every view counts runs from 1.

For one task that failed on each of its three runs, the log said "attempt 3 of
3", the admin page 3, ``fencekit job`` 2 and ``fencekit failed`` 0. Now the log,
``JobInfo.attempt`` (and so ``fencekit job``, ``fencekit failed`` and their
JSON), the admin job page and the hooks' ``JobEvent.attempt`` all say 3;
``current_job().attempt`` keeps the seed's meaning (runs that already failed).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
from tests.integration.test_cli import fk, ok_json
from tests.queue_helpers import eventually, new_server, running, stats, worker

from fencekit import Client, FenceKitHooks, JobEvent, JobStatus, Task, current_job
from fencekit.web import AdminSource, WebServer, create_app


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_the_log_the_record_the_cli_the_admin_page_and_the_hooks_say_the_same_attempt(
    redis_url: str, r: Any
) -> None:
    seen: list[int] = []
    failed: list[JobEvent] = []

    async def always(payload: dict[str, Any]) -> None:
        seen.append(current_job().attempt)
        raise RuntimeError("no luck")

    hooks = FenceKitHooks(on_failed=failed.append)
    server = new_server(redis_url, worker("tries", "run", always, retry_count=2), hooks=hooks)
    lines = Lines()
    server.logger.addHandler(lines)
    try:
        async with Client(redis_url) as client, running(server):
            jid = await client.enqueue(Task("tries", "run", {"n": 1}))
            await eventually(lambda: stats(r, "tries").get("failed") == 1, timeout=30, what="the failure")
            info = await client.job(jid)
    finally:
        server.logger.removeHandler(lines)
    assert seen == [0, 1, 2]  # the task's own field: runs that already failed (the seed's)
    started = [
        int(m) for line in lines.lines for m in re.findall(rf"{jid} started: .* attempt (\d) of 3", line)
    ]
    assert started == [1, 2, 3]
    assert any(f"task {jid} failed (attempt 3 of 3)" in line for line in lines.lines), lines.lines

    assert info is not None
    assert (info.status, info.attempt) == (JobStatus.FAILED, 3)
    assert [e.attempt for e in failed] == [3]
    # its runs, as the record keeps them: one line each, numbered as everywhere else
    assert [(run.number, run.outcome) for run in info.runs] == [(1, "retried"), (2, "retried"), (3, "failed")]
    assert {run.consumer for run in info.runs} == {server.consumer_id}
    assert [run.token for run in info.runs] == sorted(run.token for run in info.runs)
    assert all(run.ended_at + 0.001 >= run.started_at for run in info.runs)  # ms against µs
    assert info.runs[-1].token == info.token

    shown = fk(redis_url, "job", jid)
    assert re.search(r"^attempt\s+3\b", shown.stdout, re.M), shown.stdout
    data = ok_json(fk(redis_url, "job", jid, "--json"))
    assert data["attempt"] == 3
    assert [(run["number"], run["outcome"]) for run in data["runs"]] == [
        (1, "retried"),
        (2, "retried"),
        (3, "failed"),
    ]
    listed = ok_json(fk(redis_url, "failed", "tries", "--json"))
    assert [(f["jid"], f["attempt"]) for f in listed["failed"]] == [(jid, 3)]
    table = fk(redis_url, "failed", "tries")
    row = next(line for line in table.stdout.splitlines() if jid in line)
    assert row.split()[2] == "3", table.stdout

    source = AdminSource.from_url(redis_url)
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url) as http:
            page = (await http.get("/admin/job", params={"jid": jid})).text
    finally:
        await web.stop()
        await source.aclose()
    assert re.search(r"<td data-field=attempt>3\b", page), page
    assert re.findall(r'<tr data-run="(\d)">', page) == ["1", "2", "3"]
    waited = re.search(r"<td data-field=waited>([^<]*)</td>", page)
    assert waited is not None, page  # two retry delays (1 s, 1.5 s) before run 3 started
    assert waited.group(1).endswith(" from its enqueue to the start of run 3"), waited.group(1)
