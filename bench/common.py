# ruff: noqa: E501
"""Helpers shared by the end-to-end runner: processes, Redis polling, RSS, percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def env_with_root() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("FENCEKIT_REDIS_URL", None)
    return env


def spawn(argv: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (so it can be stopped with its children)."""
    out = open(log, "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=kwargs.pop("env", env_with_root()),
        **kwargs,
    )
    proc._bench_log = out  # type: ignore[attr-defined]
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> int | None:
    """SIGTERM, wait ``grace`` s, then SIGKILL the process group of ``proc``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stray grandchildren of this run only
    log = getattr(proc, "_bench_log", None)
    if log is not None:
        log.close()
    return proc.returncode


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of one process so far (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


#: Sums the ``processed`` field of the stats hashes named in the list KEYS[1] (one call
#: per poll whatever the number of queues; the key names are read by the script, which a
#: standalone Redis allows).
SUM_PROCESSED = """
local total = 0
for _, key in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  total = total + (tonumber(redis.call('HGET', key, 'processed')) or 0)
end
return total
"""
POLL_KEYS = "bench:poll:keys"


async def wait_processed(
    r: Any, keys: list[str], n: int, timeout: float, interval: float = 0.002, proc: Any = None
) -> tuple[float | None, float | None, int]:
    """Poll the ``processed`` field of the stats hashes until their sum reaches ``n``.

    Returns (time the first ack was seen, time the last was seen, count). One key: one
    ``HGET`` per poll. Several: one script call that sums them (the list of names is
    stored once in ``bench:poll:keys``), every ``interval`` s but at least 10 µs per key
    apart, so polling 1000 queues costs Redis about as little as polling 100 (and the
    harness one reply per poll, not one per queue).
    """
    deadline = time.perf_counter() + timeout
    first = None
    count = 0
    summed = None
    if len(keys) > 1:
        await r.delete(POLL_KEYS)
        await r.rpush(POLL_KEYS, *keys)
        summed = r.register_script(SUM_PROCESSED)
        interval = max(interval, 10e-6 * len(keys))
    while True:
        raw = [await (r.hget(keys[0], "processed") if summed is None else summed(keys=[POLL_KEYS]))]
        now = time.perf_counter()
        count = sum(int(x or 0) for x in raw)
        if count and first is None:
            first = now
        if count >= n:
            return first, now, count
        if now > deadline:
            return first, None, count
        if proc is not None and proc.poll() is not None:
            return first, None, count
        await asyncio.sleep(interval)


def machine_line() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        redis_v = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True
        ).stdout.split()[2]
    except (OSError, IndexError):
        redis_v = "?"
    load = os.getloadavg()
    return (
        f"nproc {os.cpu_count()}, CPU {model}, Python {sys.version.split()[0]}, Redis {redis_v.removeprefix('v=')}, "
        f"load average at start {load[0]:.2f}"
    )


def ratio_table(
    figures: Mapping[str, Sequence[Sequence[float]]], columns: list[str], base: str = "plain"
) -> None:
    """Print a Markdown table of each case's medians (rows of ``figures``: one tuple a round, a value
    a column), each beside its ratio to the ``base`` case's median."""
    bases = [statistics.median(f[i] for f in figures[base]) for i in range(len(columns))]
    print("| case | " + " | ".join(f"{c} | x {base}" for c in columns) + " |")
    print("|---|" + "---|---|" * len(columns))
    for label, values in figures.items():
        cells = []
        for i in range(len(columns)):
            median = statistics.median(v[i] for v in values)
            cells.append(f"{median:.2f} | \N{MULTIPLICATION SIGN}{median / bases[i]:.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
