"""``--log-format json`` on a real pool: every line it writes is one JSON object with time, level,
logger and message; a task's lines carry its jid, queue, operation, attempt and token (and the
duration when it completed); a failure's traceback is in ``exc`` on the same line. A bad value
is a usage error."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.fault_helpers import PoolRunner
from tests.queue_helpers import eventually

from fencekit import Client, Task

APP = textwrap.dedent(
    """
    class Work:
        queue = "logs"
        operation = "work"
        retry = False

        @classmethod
        async def perform(cls, payload):
            if payload.get("fail"):
                raise ValueError("bad game")
            return "ok"

    WORKERS = [Work]
    """
)


async def test_a_json_pool_writes_one_object_per_line_with_the_task_s_fields(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "faultapp.py").write_text(APP)
    (tmp_path / "runs").mkdir()
    pool = PoolRunner(tmp_path, redis_url, "--procs", "1", "--log-format", "json")
    try:
        pool.wait_ready()
        async with Client(redis_url=redis_url) as client:
            good = await client.enqueue(Task("logs", "work", {}))
            bad = await client.enqueue(Task("logs", "work", {"fail": True}))
            assert await client.result(good, timeout=20) == "ok"
            await eventually(lambda: "failed permanently" in pool.output(), what="the failure logged")
    finally:
        assert pool.stop() == 0
    lines = [json.loads(line) for line in pool.output().splitlines() if line]  # each one parses
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert all(line["time"].endswith("Z") and "T" in line["time"] for line in lines)
    assert any(line["message"] == "pool ready" or line["message"].startswith("pool ready") for line in lines)
    by_jid = {}
    for line in lines:
        if "jid" in line:
            by_jid.setdefault(line["jid"], []).append(line)
    started, completed = by_jid[good]
    assert started["message"].startswith(f"task {good} started")
    assert (started["queue"], started["operation"], started["attempt"]) == ("logs", "work", 1)
    assert isinstance(started["token"], int)
    assert completed["token"] == started["token"]
    assert completed["duration"] >= 0
    failure = next(line for line in by_jid[bad] if "failed permanently" in line["message"])
    assert failure["level"] == "ERROR"
    assert "ValueError: bad game" in failure["exc"]
    assert "Traceback" in failure["exc"]


def test_an_unknown_log_format_is_a_usage_error(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "faultapp.py").write_text(APP)
    pool = PoolRunner(tmp_path, redis_url, "--log-format", "xml")
    assert pool.proc.wait(30) == 2
    pool.stop()
    assert "log_format" in pool.output() or "--log-format" in pool.output()
