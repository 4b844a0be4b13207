"""Huge and non-finite numbers: refused at the entrance, naming the field and its range.

The campaign's scenario (rerun it with these tests): ``Client.enqueue(task,
delay=1e308)`` raised ``OverflowError``, ``delay=inf`` too and ``delay=nan``
``ValueError``; a JSON-lines file for ``fencekit enqueue --file`` with one
``"delay": 1e308`` line passed the per-line check and then killed the run with
a traceback, no summary, and the lines after it were never enqueued.

The rule: every duration a user gives (``delay``, ``timeout``, ``expires``,
``keep_result``, ``unique_for``) is a number of seconds or a ``timedelta``,
finite, in ``[0, 1e10)`` (``(0, 1e10)`` where zero means nothing), checked once
(``fencekit.jobs.task.seconds_in``) with a ``PayloadError`` (``ConfigError`` for
the enqueue call's own ``delay``) that names the field and the range;
``priority`` is an int from -5 to 5; a worker's ``every`` and ``rate_limit``
are checked at registration. Nothing is half-enqueued.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import worker

from fencekit import App, Client, SyncClient, Task
from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs.worker import inspect_worker

BAD_SECONDS = [1e308, math.inf, -math.inf, math.nan, -1, True, "5", timedelta(days=10**8)]


@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
async def test_a_delay_out_of_range_is_a_config_error_naming_it(redis_url: str, value: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        with pytest.raises(ConfigError, match=r"delay must be .*seconds"):
            await client.enqueue(Task("n", "op", {}), delay=value)
        assert await client.queue("n").length() == 0
    with SyncClient(redis_url=redis_url) as sync, pytest.raises(ConfigError, match=r"delay must be"):
        sync.enqueue(Task("n", "op", {}), delay=value)


@pytest.mark.parametrize("field", ["timeout", "expires", "keep_result", "unique_for"])
@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
async def test_a_task_duration_out_of_range_is_a_payload_error_naming_it(
    redis_url: str, field: str, value: Any
) -> None:
    if field == "keep_result" and value == -math.inf:
        value = -1e308
    extra: dict[str, Any] = {"unique_key": "u"} if field == "unique_for" else {}
    task = Task("n", "op", {}, **{field: value}, **extra)
    async with Client(redis_url=redis_url) as client:
        with pytest.raises(PayloadError, match=rf"{field} must be"):
            await client.enqueue(task)
        assert await client.queue("n").length() == 0


@pytest.mark.parametrize("value", [1e308, math.nan, 10**30, True, 2.5, 6])
async def test_a_priority_out_of_range_is_a_payload_error(redis_url: str, value: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        with pytest.raises(PayloadError, match="priority must be an int from -5 to 5"):
            await client.enqueue(Task("n", "op", {}, priority=value))


def test_the_largest_durations_in_range_are_accepted() -> None:
    task = Task(
        "n", "op", {}, timeout=9.9e9, expires=9.9e9, keep_result=9.9e9, unique_key="u", unique_for=9.9e9
    )
    assert task.envelope(2**20, 60.0)


@pytest.mark.parametrize("value", [1e308, math.inf, math.nan, -1, 0, True])
def test_a_worker_every_or_timeout_out_of_range_is_refused_at_registration(value: Any) -> None:
    app = App()
    with pytest.raises(ConfigError, match="option 'every' must be"):

        @app.task(queue="n", every=value)
        async def ticked() -> None: ...

    with pytest.raises(ConfigError, match="timeout"):
        inspect_worker(worker("n", "op", lambda payload: None, timeout=value))


@pytest.mark.parametrize("rate", ["1e308/s", "inf/s", "nan/s", "9" * 400 + "/s", "0/s"])
def test_a_rate_out_of_range_is_refused_at_registration(rate: str) -> None:
    with pytest.raises(ConfigError, match="rate_limit"):
        inspect_worker(worker("n", "op", lambda payload: None, rate_limit=rate))


def _fk(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencekit", *args, "--redis-url", url],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "-1"])
def test_the_cli_refuses_a_delay_out_of_range_with_exit_2(redis_url: str, value: str) -> None:
    done = _fk(redis_url, "enqueue", "n", "op", f"--delay={value}")
    assert done.returncode == 2, done.stderr
    assert "delay must be" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_file_line_with_a_huge_number_is_reported_and_skipped_and_the_rest_enqueued(
    redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = [
        {"queue": "nf", "operation": "op", "jid": "first"},
        {"queue": "nf", "operation": "op", "delay": 1e308},
        {"queue": "nf", "operation": "op", "timeout": 1e308},
        {"queue": "nf", "operation": "op", "keep_result": 1e300},
        {"queue": "nf", "operation": "op", "priority": 1e308},
        {"queue": "nf", "operation": "op", "jid": "last"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"queue": "nf", "delay": NaN}\n')
    done = _fk(redis_url, "enqueue", "--file", str(path), "--json")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert (data["lines"], data["enqueued"], data["bad"]) == (7, 2, 5)
    assert [b["line"] for b in data["bad_lines"]] == [2, 3, 4, 5, 7]
    for bad, field in zip(data["bad_lines"], ["delay", "timeout", "keep_result", "priority"]):
        assert f"{field} must be" in bad["error"], bad
    with SyncClient(redis_url=redis_url) as sync:
        assert sync.queue("nf").length() == 2
        assert sync.job("first", queue="nf") is not None
        assert sync.job("last", queue="nf") is not None


@pytest.mark.parametrize("value", [1e308, math.inf, math.nan])
def test_a_float_setting_out_of_range_is_refused_by_name(redis_url: str, value: float) -> None:
    from fencekit import Server

    with pytest.raises(ConfigError, match=r"grace must be a number between -1e10 and 1e10"):
        Server(redis_url=redis_url, grace=value)
    with pytest.raises(ConfigError, match=r"concurrency must be an int between"):
        Server(redis_url=redis_url, concurrency=10**30)


def test_a_pool_option_out_of_range_exits_2_naming_it(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fencekit.pool", "tests.periodic_app:app", "--redis-url", redis_url,
         "--grace", "1e308"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "grace must be a number between -1e10 and 1e10" in done.stderr
    assert "Traceback" not in done.stderr
