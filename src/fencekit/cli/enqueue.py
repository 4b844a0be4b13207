"""``fencekit enqueue``: one task from the command line, or many from a JSON-lines file.

``fencekit enqueue QUEUE OPERATION --params JSON`` prints the jid (the
holder's jid when ``--unique-key`` is held, and a note saying so).

``fencekit enqueue --file tasks.jsonl`` reads one JSON object per line --
``queue``, ``operation`` and optionally ``params``, ``jid``, ``delay``,
``timeout``, ``expires``, ``keep_result``, ``unique_key``, ``unique_for``
(the fields of :class:`~fencekit.Task`, seconds for durations) -- and sends
them ``--batch`` at a time through ``Client.enqueue_many`` (one round trip
per batch and delay). Blank lines are ignored.

**A bad line is skipped, not fatal**: each line is checked on its own (JSON,
the fields, the task's own validation) before its batch is sent, so one bad
line never holds back the good ones; it is reported on stderr as
``FILE:LINE: why``, the summary counts it, and the exit code is 1 when any
line was skipped (0 when all were enqueued). Rerunning the whole file after
fixing a line would enqueue the good lines twice, unless they carry a
``jid`` with a ``unique_key``: fix the bad lines into a file of their own.
``--file -`` reads stdin; from a pipe a batch is sent once it is full (or
at the end), so a live producer that wants each line sent at once passes
``--batch 1``. If Redis fails mid-run, the summary says how many tasks were enqueued before
(the batch in flight may or may not have been accepted) and the exit code is 4.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from fencekit.cli.base import Context, Exit, UsageError, Verb
from fencekit.errors import FenceKitError, StoreError
from fencekit.jobs.codec import seconds_in
from fencekit.jobs.task import Task

__all__ = ["VERBS", "task_of"]

DEFAULT_BATCH = 500
_SHOWN_ERRORS = 20  # bad lines printed one by one on stderr; the JSON summary lists up to 1,000
_LISTED_ERRORS = 1000
_FIELDS = frozenset(
    (
        "queue",
        "operation",
        "params",
        "jid",
        "delay",
        "timeout",
        "expires",
        "keep_result",
        "unique_key",
        "unique_for",
        "priority",
    )
)


def _seconds(data: dict[str, Any], name: str) -> float | None:
    """A duration of the line: the enqueue rule (:func:`~fencekit.jobs.codec.seconds_in`) for
    ``delay``; the others are a number here and checked by ``Task.envelope`` like any task's."""
    value = data.get(name)
    if value is None:
        return None
    if name == "delay":
        return seconds_in(value, name, zero=True)
    if type(value) not in (int, float):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    return float(value)


def task_of(data: Any, *, max_payload: int, keep_result: float) -> tuple[Task, float]:
    """The task of one line's object and its delay; ValueError (a PayloadError too) says why not."""
    if not isinstance(data, dict):
        raise ValueError(f"a line must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(_FIELDS))})"
        )
    for name in ("queue", "operation"):
        if not isinstance(data.get(name), str):
            raise ValueError(f"{name} must be a string, got {data.get(name)!r}")
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"params must be a JSON object, got {type(params).__name__}")
    delay = _seconds(data, "delay") or 0.0
    task = Task(
        data["queue"],
        data["operation"],
        params,
        jid=data.get("jid"),
        timeout=_seconds(data, "timeout"),
        expires=_seconds(data, "expires"),
        keep_result=_seconds(data, "keep_result"),
        unique_key=data.get("unique_key"),
        unique_for=_seconds(data, "unique_for"),
        priority=data.get("priority", 0),
    )
    task.envelope(max_payload, keep_result)  # every check enqueue makes; fills in the jid
    return task, delay


@dataclass
class _Run:
    """What a file run did so far."""

    lines: int = 0
    enqueued: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)

    def summary(self, path: str) -> dict[str, Any]:
        return {
            "file": path,
            "lines": self.lines,
            "enqueued": self.enqueued,
            "bad": len(self.bad),
            "bad_lines": [{"line": n, "error": e} for n, e in self.bad[:_LISTED_ERRORS]],
        }


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", nargs="?", help="the task's queue (not with --file)")
    parser.add_argument("operation", metavar="OPERATION", nargs="?", help="its operation (not with --file)")
    parser.add_argument(
        "--params", default="{}", metavar="JSON", help="its params, a JSON object (default: {})"
    )
    parser.add_argument("--delay", type=float, metavar="S", help="start it after S seconds")
    parser.add_argument("--jid", help="its jid (default: a new UUIDv7)")
    parser.add_argument(
        "--unique-key", metavar="K", help="dedupe: while a task holds K, print that task's jid"
    )
    parser.add_argument("--timeout", type=float, metavar="S", help="its timeout, overriding the worker's")
    parser.add_argument(
        "--expires", type=float, metavar="S", help="drop it unrun if not started within S seconds"
    )
    parser.add_argument(
        "--priority", type=int, metavar="P", help="its priority, -5..5 (default 0; higher first)"
    )
    parser.add_argument("--file", metavar="PATH", help="enqueue every line of a JSON-lines file ('-': stdin)")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                        help=f"tasks per round trip with --file (default: {DEFAULT_BATCH})")  # fmt: skip


async def _enqueue(ctx: Context, args: argparse.Namespace) -> int:
    if args.file is not None:
        if args.queue is not None:
            raise UsageError("give QUEUE OPERATION or --file, not both")
        if args.batch < 1:
            raise UsageError(f"--batch must be at least 1, got {args.batch}")
        return await _from_file(ctx, args.file, args.batch)
    if args.queue is None or args.operation is None:
        raise UsageError("QUEUE and OPERATION are required (or --file PATH)")
    try:
        params = orjson.loads(args.params)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"--params is not valid JSON: {exc}") from None
    data = {
        "queue": args.queue, "operation": args.operation, "params": params, "jid": args.jid,
        "delay": args.delay, "timeout": args.timeout, "expires": args.expires, "unique_key": args.unique_key,
        "priority": args.priority,
    }  # fmt: skip
    settings = ctx.settings
    try:
        task, delay = task_of(
            {k: v for k, v in data.items() if v is not None},
            max_payload=settings["max_payload"],
            keep_result=settings["keep_result"],
        )
    except ValueError as exc:
        raise UsageError(str(exc).replace("params must", "--params must")) from None
    if task.unique_key is not None:
        jid, created = await ctx.client.enqueue_unique(task, delay=delay)
    else:
        jid, created = await ctx.client.enqueue(task, delay=delay), True
    if ctx.out.as_json:
        ctx.out.json({"jid": jid, "queue": task.queue, "operation": task.operation, "created": created})
    else:
        ctx.out.line(jid)
        if not created:
            ctx.out.note(f"not enqueued: unique key {task.unique_key!r} is held by task {jid}")
    return Exit.OK


def _open(path: str) -> tuple[IO[bytes] | None, int | None]:
    """The file and its number of lines (the bar's total); ``(None, None)`` for stdin from a pipe.

    A regular file (also as stdin) is read synchronously: the command runs
    nothing else on its event loop. A pipe or a terminal is read through the
    loop (:func:`_stream_lines`), so Ctrl-C stops a run waiting for input.
    """
    if path == "-":
        if not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
            return None, None
        return sys.stdin.buffer, None
    with open(path, "rb") as f:
        total = sum(1 for _ in f)
    return open(path, "rb"), total  # closed by the caller


async def _lines(stream: IO[bytes] | None, limit: int) -> AsyncIterator[tuple[int, bytes]]:
    """``(line number, line)`` of every line that is not blank."""
    if stream is None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=limit)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        number = 0
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # longer than any task can be
                raise UsageError(f"line {number + 1} is longer than {limit} bytes") from None
            if not line:
                return
            number += 1
            if line.strip():
                yield number, line
    with stream:
        for number, line in enumerate(stream, 1):
            if line.strip():
                yield number, line


async def _from_file(ctx: Context, path: str, batch: int) -> int:
    out = ctx.out
    try:
        stream, total = _open(path)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    run = _Run()
    name = "<stdin>" if path == "-" else path
    max_payload, keep = ctx.settings["max_payload"], ctx.settings["keep_result"]
    pending: list[tuple[Task, float]] = []

    async def send() -> None:
        by_delay: dict[float, list[Task]] = {}
        for task, delay in pending:
            by_delay.setdefault(delay, []).append(task)
        for delay, tasks in by_delay.items():
            run.enqueued += len(await ctx.client.enqueue_many(tasks, delay=delay or None))
        pending.clear()

    try:
        with out.bar(f"enqueueing {name}", total) as bar:
            async for number, line in _lines(stream, 2 * max_payload + 1024):
                run.lines = number
                try:
                    pending.append(task_of(orjson.loads(line), max_payload=max_payload, keep_result=keep))
                except orjson.JSONDecodeError as exc:
                    _bad(ctx, run, name, number, f"not valid JSON: {exc}")
                except (ValueError, FenceKitError) as exc:
                    _bad(ctx, run, name, number, str(exc))
                if len(pending) >= batch:
                    await send()
                    bar.update(number, f"{run.enqueued} enqueued, {len(run.bad)} bad")
            if pending:
                await send()
            bar.update(run.lines, f"{run.enqueued} enqueued, {len(run.bad)} bad")
    except (StoreError, asyncio.CancelledError):
        out.error(f"stopped at line {run.lines} of {name}: {run.enqueued} task(s) enqueued before")
        raise
    if len(run.bad) > _SHOWN_ERRORS:
        out.note(f"{name}: ... and {len(run.bad) - _SHOWN_ERRORS} more bad line(s)")
    if out.as_json:
        out.json(run.summary(name))
    else:
        skipped = f"; {len(run.bad)} bad line(s) skipped" if run.bad else ""
        out.line(f"enqueued {run.enqueued} task(s) from {name}{skipped}")
    return Exit.NOT_DONE if run.bad else Exit.OK


def _bad(ctx: Context, run: _Run, name: str, number: int, why: str) -> None:
    run.bad.append((number, why))
    if len(run.bad) <= _SHOWN_ERRORS:
        ctx.out.note(f"{name}:{number}: {why}")


VERBS = (
    Verb(
        "enqueue",
        "Enqueue one task (prints its jid), or every line of a JSON-lines file (--file).",
        _arguments,
        _enqueue,
        settings=("keep_result", "max_payload", "durable_replicas", "durable_timeout"),
        epilog="With --file a bad line is reported (FILE:LINE) and skipped; the exit code is then 1.",
    ),
)
