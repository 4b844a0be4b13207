"""Helpers of the fault tests (failover, outages, soak): a pool process with its web
server, a steady producer, a /ready prober, and the accounting of runs.

Runs are recorded by the worker in two places: an append-only file per process
(``runs-<pid>.log``, one jid per line -- it survives the failovers whose lost
writes we are counting) and an ``INCR runs:<jid>`` in Redis.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fencekit import Client, StoreError, Task
from fencekit.jobs._ids import uuid7
from fencekit.testing import free_port, wait_until

POOL_APP = textwrap.dedent(
    """
    import asyncio, os
    from fencekit import current_job
    from fencekit._redis.clients import async_client

    URL = os.environ["TEST_REDIS_URL"]
    RUNS = os.environ["TEST_RUNS_DIR"]
    _r = None
    _f = None

    def r():
        global _r
        if _r is None:
            _r = async_client(URL)
        return _r

    def record(jid):
        global _f
        if _f is None or _f[0] != os.getpid():
            _f = (os.getpid(), open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a", buffering=1))
        _f[1].write(jid + "\\n")

    class Work:
        queue = "work"
        operation = "do"
        retry_count = 20

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            await asyncio.sleep(payload.get("sleep", 0.002))
            record(job.jid)
            if payload.get("incr", True):
                try:
                    await r().incr("runs:" + job.jid)
                except Exception:
                    pass  # the file is the record of runs; the INCR is best effort

    class Flaky:
        queue = "work"
        operation = "flaky"
        retry_count = 3

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            if job.attempt < payload.get("fail_times", 1):
                raise RuntimeError(f"flaky failure on attempt {job.attempt}")
            record(job.jid)
            await r().incr("runs:" + job.jid)

    class Hold:
        queue = "hold"
        operation = "hold"
        retry = False

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            await asyncio.sleep(payload["seconds"])
            record(job.jid)

    WORKERS = [Work, Flaky, Hold]
    """
)


def write_app(directory: Path) -> Path:
    (directory / "faultapp.py").write_text(POOL_APP)
    runs = directory / "runs"
    runs.mkdir(exist_ok=True)
    return runs


def runs_from_files(runs_dir: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for path in runs_dir.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            if line:
                counts[line] += 1
    return counts


class PoolRunner:
    """``python -m fencekit.pool faultapp:WORKERS`` (or ``app``) with its web server on a free port."""

    def __init__(
        self, app_dir: Path, url: str, *args: str, check_url: str | None = None, app: str = "faultapp:WORKERS"
    ) -> None:
        self.web_port = free_port()
        self.log = app_dir / f"pool-{time.monotonic_ns()}.log"
        self._out = self.log.open("wb")
        env = {
            **os.environ,
            "PYTHONPATH": f"{app_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "PYTHONUNBUFFERED": "1",
            "TEST_REDIS_URL": check_url or url,
            "TEST_RUNS_DIR": str(app_dir / "runs"),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fencekit.pool", app, "--redis-url", url,
             "--web-port", str(self.web_port), *args],
            cwd=app_dir, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_until(
            lambda: "pool ready" in self.output() or self.proc.poll() is not None, timeout, what="pool ready"
        )
        assert self.proc.poll() is None, self.output()[-3000:]

    def ready_status(self) -> int:
        return http_status(f"http://127.0.0.1:{self.web_port}/ready")

    def stop(self, timeout: float = 30.0) -> int:
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGCONT)
                self.proc.send_signal(signal.SIGTERM)
                try:
                    return self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
                    raise
            return self.proc.returncode
        finally:
            self._out.close()


def http_status(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def http_body(url: str, timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bytes(response.read()).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return bytes(exc.read()).decode(errors="replace")


class ReadyProbe(threading.Thread):
    """Polls ``/ready`` every ``interval`` seconds and records (monotonic time, status)."""

    def __init__(self, url: str, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.monotonic(), http_status(self.url, timeout=1.0)))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)

    def statuses_between(self, start: float, end: float) -> list[int]:
        return [s for t, s in self.samples if start <= t <= end]


@dataclass
class ProducerReport:
    accepted: list[str] = field(default_factory=list)  # enqueue returned: acknowledged
    accepted_at: dict[str, float] = field(default_factory=dict)  # jid -> monotonic time of the reply
    refused: list[str] = field(default_factory=list)  # StoreError: may or may not have landed
    errors: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, message)
    other: list[str] = field(default_factory=list)  # non-StoreError exceptions (bugs)
    tasks: dict[str, Task] = field(default_factory=dict)  # jid -> the task as made


class Producer(threading.Thread):
    """Enqueues ``Task(queue, op, params)`` every ``interval`` s from its own loop until stopped."""

    def __init__(
        self,
        url: str,
        *,
        interval: float = 0.01,
        queue: str = "work",
        operation: str = "do",
        params: dict[str, Any] | None = None,
        client_kwargs: dict[str, Any] | None = None,
        mix: Any = None,
    ) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = interval
        self.queue = queue
        self.operation = operation
        self.params = params or {}
        self.client_kwargs = client_kwargs or {}
        self.mix = mix  # optional callable(n) -> Task
        self.report = ProducerReport()
        self._stop_event = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        import logging

        client = Client(self.url, **self.client_kwargs)
        client.logger.setLevel(logging.WARNING)
        n = 0
        try:
            while not self._stop_event.is_set():
                task = (
                    self.mix(n)
                    if self.mix is not None
                    else Task(self.queue, self.operation, dict(self.params))
                )
                n += 1
                if task.jid is None:
                    task.jid = uuid7()
                self.report.tasks[task.jid] = task
                try:
                    await asyncio.wait_for(client.enqueue(task), 5)
                except StoreError as exc:
                    self.report.refused.append(task.jid)
                    self.report.errors.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                    await asyncio.sleep(0.05)
                except Exception as exc:
                    self.report.other.append(f"{type(exc).__name__}: {exc}")
                    self.report.refused.append(task.jid)
                    await asyncio.sleep(0.05)
                else:
                    self.report.accepted.append(task.jid)
                    self.report.accepted_at[task.jid] = time.monotonic()
                await asyncio.sleep(self.interval)
        finally:
            await close_client(client)

    def stop(self) -> ProducerReport:
        self._stop_event.set()
        self.join(15)
        return self.report


async def close_client(client: Client) -> None:
    """``client.close()``, plus the sentinel connections it leaves open (see
    test_failover.py::test_closing_a_sentinel_client_closes_its_sentinel_connections)."""
    await client.close()
    manager = getattr(getattr(client.redis, "connection_pool", None), "sentinel_manager", None)
    for conn in getattr(manager, "sentinels", ()):
        await conn.aclose()


def most_in_window(times: list[float], window: float) -> int:
    """The most acknowledgements the producer got within any ``window`` seconds."""
    times = sorted(times)
    return max((bisect.bisect_right(times, t + window) - i for i, t in enumerate(times)), default=0)


def jids_of(raws: list[Any]) -> set[str]:
    """The jids of the envelopes among ``raws`` (anything that does not decode is skipped)."""
    jids: set[str] = set()
    for raw in raws:
        try:
            jids.add(orjson.loads(raw)["jid"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return jids


def log_lines(text: str, *needles: str) -> list[str]:
    return [line for line in text.splitlines() if all(n in line for n in needles)]
