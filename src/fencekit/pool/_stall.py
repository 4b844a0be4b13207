"""Why a child stalled: what the supervisor reads and says before it kills a child whose loop stopped.

A blocking call inside an ``async def perform`` (``time.sleep``, a sync HTTP
client, a CPU-bound loop) stops the child's event loop; the hang watch
(:mod:`fencekit.pool._watch`) then kills it after ``hang_timeout``. A kill
that names neither the task nor the cause leaves the operator guessing, so
just before the kill the supervisor gathers, each part bounded in time:

- **the tasks the child was running**, from its in-flight hashes
  ``P:{Q}:inflight:<consumer>`` (one pipeline: ``TIME`` and one ``HGETALL``
  per queue). A delivery's token is the Redis clock in µs at its claim (or
  just above it), so ``TIME`` minus the token is how long the task has been
  running, on Redis's clock. At most :data:`MAX_TASKS` are listed.
- **the child's Python stack, every thread**: each child registers
  :func:`faulthandler.register` for :data:`STACK_SIGNAL` at startup, writing
  into a per-slot memfd the supervisor created (inherited by a forked child,
  passed by fd to an exec'd one: :class:`StackFile`). faulthandler dumps from
  its C signal handler, so the dump arrives while the loop is blocked. The
  file's offset is shared with the child (one open file description), so the
  supervisor truncates and rewinds it before signalling, and reads with
  ``pread``.

Either part may not arrive (Redis unreachable, a child stopped or stuck in
the kernel): each waits at most :data:`READ_WAIT`, both at once, and the
report says what is missing -- the kill is never delayed by more than about
half a second. The report is one log record; :func:`stall_threshold` is when
the admin page starts calling a silent child *stalled*, before the kill. A
read given up on is cancelled and left to end by itself, as a task of the
supervisor's :class:`~fencekit._aio.scope.TaskScope` (whose close awaits it).
"""

from __future__ import annotations

import asyncio
import faulthandler
import linecache
import os
import re
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fencekit._aio.scope import TaskScope
from fencekit._redis.keys import KeySpace
from fencekit.consume._settle import in_flight
from fencekit.pool._board import TICK

__all__ = [
    "HINT",
    "MAX_TASKS",
    "READ_WAIT",
    "STACK_SIGNAL",
    "RunningTask",
    "StackFile",
    "diagnose",
    "register_stack_dump",
    "stall_threshold",
]

STACK_SIGNAL = int(signal.SIGRTMIN) + 3
"""The signal that makes a child dump its stack: a real-time one, which neither the pool
(SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD) nor the usual app conventions (SIGUSR1/2) use."""

READ_WAIT = 0.5
"""Seconds the supervisor waits for the tasks from Redis and for the stack dump (both at once)."""

MAX_TASKS = 20
MAX_DUMP = 64 * 1024  # faulthandler writes at most 100 frames per thread, 100 threads
_SETTLED = 0.02  # a dump whose size did not change for this long is complete

HINT = "a blocking call in an async perform? use a sync task (a plain def) or asyncio.to_thread"

_FRAME = re.compile(r'^(\s*)File "(.+)", line (\d+) in (.+)$')
_T = TypeVar("_T")


def stall_threshold(hang_timeout: float, tick: float = TICK) -> float:
    """Seconds of silence after which a serving child is shown *stalled*.

    Four ticks, and at least 2 s: a busy but healthy loop (a GC pause, a
    burst of CPU, two cores shared by many processes) is late by a tick now
    and then, never by four. Capped at half the hang timeout so that a
    stall is visible for a while before the kill, and never under two ticks.
    """
    return max(2 * tick, min(max(2.0, 4 * tick), hang_timeout / 2))


def register_stack_dump(fd: int) -> None:
    """In a child: dump every thread's stack into ``fd`` on :data:`STACK_SIGNAL` (nothing if ``fd`` < 0)."""
    if fd >= 0:
        faulthandler.register(STACK_SIGNAL, file=fd, all_threads=True, chain=False)


class StackFile:
    """A slot's memfd into which its child's faulthandler writes (see the module docstring).

    One per slot for the supervisor's life; every incarnation of the slot
    writes into the same file.
    """

    def __init__(self, slot: int) -> None:
        self.fd = os.memfd_create(f"fencekit-stack-{slot}", 0)  # inheritable: a forked child keeps it

    async def dump(self, send: Callable[[int], None], timeout: float = READ_WAIT) -> str | None:
        """Ask the child for its stack (``send`` delivers the signal) and return it; None if none came."""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)  # the offset is the child's too
        send(STACK_SIGNAL)
        deadline = time.monotonic() + timeout
        last = -1
        while True:
            size = os.fstat(self.fd).st_size
            if (size and size == last) or time.monotonic() >= deadline:
                break
            last = size
            await asyncio.sleep(_SETTLED)
        if not size:
            return None
        return os.pread(self.fd, min(size, MAX_DUMP), 0).decode("utf-8", errors="replace")

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True, slots=True)
class RunningTask:
    """One delivery in a stalled child's in-flight hash."""

    queue: str
    jid: str | None
    operation: str | None
    attempt: int  # 0 for the first run
    running: float  # seconds since its claim, on Redis's clock

    def describe(self) -> str:
        return (
            f"{self.queue}/{self.operation or '?'} jid {self.jid or '?'} attempt {self.attempt + 1}, "
            f"running for {self.running:.1f}s"
        )


async def read_running(
    redis: Any, keys: KeySpace, queues: Sequence[str], consumer_id: str
) -> list[RunningTask]:
    """The deliveries in ``consumer_id``'s in-flight hashes, longest-running first (one pipeline)."""
    pipe = redis.pipeline(transaction=False)
    pipe.time()
    for queue in queues:
        pipe.hgetall(keys.queue(queue).inflight(consumer_id))
    now, *hashes = await pipe.execute()
    now_us = int(now[0]) * 1_000_000 + int(now[1])
    tasks = []
    for queue, entries in zip(queues, hashes):
        for d in in_flight(entries):
            tasks.append(
                RunningTask(queue, d.jid, d.operation, d.attempt, max(0.0, (now_us - d.token) / 1e6))
            )
    tasks.sort(key=lambda t: t.running, reverse=True)
    return tasks


async def diagnose(
    redis: Any,
    keys: KeySpace,
    queues: Sequence[str],
    consumer_id: str,
    stack: StackFile | None,
    send: Callable[[int], None],
    scope: TaskScope,
) -> str:
    """The report's lines after the first: the tasks, the stack, the hint (at most ~:data:`READ_WAIT` s).

    The reads are tasks of ``scope`` (the supervisor's).
    """
    reading = _bounded(read_running(redis, keys, queues, consumer_id), READ_WAIT, scope)
    dumping = _bounded(stack.dump(send), READ_WAIT + 0.1, scope) if stack is not None else _nothing()
    (tasks, task_error), (dump, dump_error) = await asyncio.gather(reading, dumping)
    lines = [_tasks_part(tasks, task_error)]
    lines.append(_stack_part(dump, dump_error))
    lines.append(HINT)
    return "\n".join(lines)


def _tasks_part(tasks: list[RunningTask] | None, error: str | None) -> str:
    if tasks is None:
        return f"the tasks it was running could not be read from Redis: {error}"
    if not tasks:
        return "it was running no task (its in-flight hashes are empty)"
    shown = [f"  {t.describe()}" for t in tasks[:MAX_TASKS]]
    if len(tasks) > MAX_TASKS:
        shown.append(f"  and {len(tasks) - MAX_TASKS} more")
    head = f"it was running {len(tasks)} task{'s' if len(tasks) != 1 else ''} (durations on Redis's clock):"
    return "\n".join([head, *shown])


def _stack_part(dump: str | None, error: str | None) -> str:
    if dump is None:
        why = error or f"no dump arrived within {READ_WAIT}s"
        return f"its stack could not be read: {why}"
    return "its stack (faulthandler, every thread):\n" + annotate(dump.rstrip("\n"))


def annotate(dump: str) -> str:
    """``dump`` indented, each ``File ..., line N in f`` followed by that source line when it can be read."""
    out = []
    for line in dump.splitlines():
        out.append("  " + line)
        found = _FRAME.match(line)
        if found:
            source = linecache.getline(found.group(2), int(found.group(3))).strip()
            if source:
                out.append(f"  {found.group(1)}    {source}")
    return "\n".join(out)


async def _nothing() -> tuple[None, str]:
    return None, "this child has no stack file"


async def _bounded(
    coro: Coroutine[Any, Any, _T], timeout: float, scope: TaskScope
) -> tuple[_T | None, str | None]:
    """``(result, None)``, or ``(None, why)`` after an error or ``timeout`` s -- without waiting for the
    abandoned read to finish cancelling (a client blocked on a stopped Redis may take a while): it
    stays a task of ``scope``, whose close awaits it."""
    task = scope.start(coro, name="fencekit-stall-read", awaited=True)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        task.add_done_callback(_swallow)
        return None, f"no answer within {timeout:.1f}s"
    exc = task.exception()
    if exc is not None:
        return None, f"{type(exc).__name__}: {exc}"
    return task.result(), None


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
