"""``current_job().iterate``: walk a sequence or a cursor-based source, checkpointing where it is.

The walk's position is kept in the task's checkpointed state under the key
``"iterate"`` (``{"cursor": ..., "skip": ..., "done": ...}``; the rest of a dict
state is the job's own), so the next delivery -- after a crash, a retry, a
drain -- resumes after the last item checkpointed. A sequence's cursor is the
index of the next item; a cursor-based source is a function ``fetch(cursor)``
returning ``(items, next_cursor)`` (``next_cursor`` None: the last page), whose
position is the page's cursor and how many of its items are done (``skip``).
It checkpoints every ``every`` items or ``seconds`` seconds (the worker's
``checkpoint_every`` and ``checkpoint_seconds``), and at once while the process
stops -- where ``checkpoint`` raises :class:`~fencekit.errors.Interrupted`. Progress
(done of total, for a sequence) rides the same checkpoint call.

:class:`Walk` is the rule; :func:`walk` and :func:`walk_sync` drive it for
``async for`` and for a sync task's ``for``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencekit.consume.job import Job

__all__ = ["Walk", "walk", "walk_sync"]

Source = Sequence[Any] | Callable[[Any], Any]


class Walk:
    """Where one iteration is, and when it checkpoints next."""

    def __init__(self, state: Any, cursor: Any, every: int, seconds: float, total: int | None) -> None:
        saved = state.get("iterate") if isinstance(state, dict) else None
        saved = saved if isinstance(saved, dict) else {}
        self.cursor: Any = saved.get("cursor", cursor)
        self.skip: int = int(saved.get("skip", 0))
        self.done: int = int(saved.get("done", 0))
        self.every, self.seconds, self.total = every, seconds, total
        self._since = 0
        self._last = time.monotonic()

    def finished_one(self, stopping: bool) -> bool:
        """The caller finished one item: True if a checkpoint is due now."""
        self.done += 1
        self._since += 1
        return stopping or self._since >= self.every or time.monotonic() - self._last >= self.seconds

    def state(self, job_state: Any) -> Any:
        """The state to checkpoint: the job's own (a dict's other keys kept) with this position."""
        self._since, self._last = 0, time.monotonic()
        position = {"cursor": self.cursor, "skip": self.skip, "done": self.done}
        rest = job_state if isinstance(job_state, dict) else {}
        return {**rest, "iterate": position}

    def progress(self) -> tuple[float, str] | None:
        if not self.total:
            return None
        return (min(1.0, self.done / self.total), f"{self.done} of {self.total}")


def _plan(source: Source, state: Walk, stopping: Callable[[], bool]) -> Generator[tuple[str, Any], Any, None]:
    """The walk as instructions, for either driver: ``("fetch", cursor)`` (sent back the page:
    ``(items, next_cursor)``), ``("item", item)`` (sent back nothing once the caller is done with
    it), ``("store", None)`` (checkpoint ``state`` now)."""
    if not callable(source):
        for index in range(int(state.cursor or 0), len(source)):
            yield "item", source[index]
            state.cursor = index + 1
            if index + 1 < len(source) and state.finished_one(stopping()):
                yield "store", None
        return
    page_cursor, skip = state.cursor, state.skip
    while True:
        items, next_cursor = yield "fetch", page_cursor
        items = list(items)
        for k in range(skip, len(items)):
            yield "item", items[k]
            last = k + 1 == len(items)
            state.cursor, state.skip = (next_cursor, 0) if last else (page_cursor, k + 1)
            if (not last or next_cursor is not None) and state.finished_one(stopping()):
                yield "store", None
        if next_cursor is None:
            return
        page_cursor, skip = next_cursor, 0


def _start(job: Job, source: Source, cursor: Any, every: int, seconds: float) -> Walk:
    if callable(source):
        return Walk(job.state, cursor, every, seconds, None)
    return Walk(job.state, cursor if cursor is not None else 0, every, seconds, len(source))


async def walk(job: Job, source: Source, cursor: Any, every: int, seconds: float) -> AsyncIterator[Any]:
    """``async for item in job.iterate(source)`` (see the module docstring)."""
    state = _start(job, source, cursor, every, seconds)
    plan = _plan(source, state, lambda: job.stopping)
    answer: Any = None
    while True:
        try:
            what, value = plan.send(answer)
        except StopIteration:
            return
        answer = None
        if what == "item":
            yield value
        elif what == "fetch":
            assert callable(source)
            fetched = source(value)
            answer = await fetched if inspect.isawaitable(fetched) else fetched
        else:
            await job._store(state.state(job.state), state.progress())


def walk_sync(job: Job, source: Source, cursor: Any, every: int, seconds: float) -> Iterator[Any]:
    """``for item in job.iterate_sync(source)`` in a sync task (its checkpoints block)."""
    state = _start(job, source, cursor, every, seconds)
    plan = _plan(source, state, lambda: job.stopping)
    answer: Any = None
    while True:
        try:
            what, value = plan.send(answer)
        except StopIteration:
            return
        answer = None
        if what == "item":
            yield value
        elif what == "fetch":
            assert callable(source)
            answer = source(value)
        else:
            job._store_sync(state.state(job.state), state.progress())
