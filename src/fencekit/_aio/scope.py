"""Task scopes: every background task has an owner that cancels it and waits for it to end.

What: a :class:`TaskScope` is Trio's nursery idea for asyncio, small enough
to sit under every long-running part and to work on Python 3.10 (which has
no ``asyncio.TaskGroup``). The object that starts a task -- a Server, a
consumer, a link, a listener -- owns a scope and starts every loop,
listener and helper task through it (:meth:`TaskScope.start`). Stopping the
owner closes its scope (:meth:`TaskScope.aclose`, or leaving ``async
with``): every task still in it is cancelled, and awaited.

Why: a bare ``asyncio.create_task`` has no owner. Nothing is sure to cancel
it, nothing waits for it to end, and what it raises is seen only if someone
happens to await it. Shutdown hangs were fixed one at a time that way; the
last: a consumer's cancel listener was cancelled while its cluster sharded
pub/sub read was in ``asyncio.wait_for``, which on Python < 3.12 swallows a
cancellation that meets an arriving item, so the listener went on and the
stopping Server waited for it forever. The hazard a scope closes is that
one: **a cancel that is lost**. Its close does not cancel once and then wait
without end; it cancels every task still running, waits at most
``recancel`` seconds, cancels the ones still running again, and so on; a
task still running ``close_wait`` seconds after the close began is named in
one ERROR record (with the line it is stuck at) and left behind -- no later
close, of its scope or of an enclosing one, waits for it again -- so a close
always ends. A cancel that reaches :meth:`TaskScope.aclose` itself while it
closes (the owner's own task cancelled, again) does not cut the close short
either: the close goes on to its end and the cancellation is raised after.

The rules:

- **A failed task is logged, not silent.** A task that ends with an
  exception (other than its cancellation) is logged at once with its
  traceback, naming the task and the scope. It does **not** cancel its
  siblings, unlike a Trio nursery or a ``TaskGroup``: every long-running
  part here is built so that its neighbours survive it -- a job that fails
  leaves the other jobs running, the heartbeat goes on when the history
  sampler has a bug, a consumer's wake-up loop is not its cancel listener --
  and that was the behaviour of every call site before scopes (a loop that
  ended is noticed by its owner: ``Services.loops_alive``, the systemd
  watchdog). A call site that wants siblings to end with a failure awaits
  its tasks together (``asyncio.gather``) and closes the scope when that
  raises, as the cluster waker's per-slot waits do.
- **A task whose outcome its starter reads** (``start(..., awaited=True)``:
  the starter awaits it, or reads ``task.result()``) is not logged by the
  scope; the starter reports it, as it did before. Were the starter never
  to read it, asyncio's own "exception was never retrieved" still reports it.
- **A scope outlives its closes**: a close ends the tasks it has and the
  scope takes new ones after (an owner that stops and starts again keeps
  one scope). A task started *while* a close runs is cancelled at once.
- **Scopes nest**: :meth:`TaskScope.child` makes a scope of its own inside
  this one (a consumer's, inside its Server's). The child's owner closes
  it, in its own order, when the task that owns it ends; a close of the
  parent first cancels its own tasks (letting their owners close their
  child scopes), and from its second round on cancels the tasks of every
  child scope too, and waits for them all.
- The hot path: :meth:`TaskScope.start` costs a dict insert and one done
  callback beside ``loop.create_task`` (a consumer starts one task per job
  through it). A starter that wants a callback of its own when the task
  ends passes it as ``then``: it is called from the scope's one callback
  (a second done callback would cost a second ``call_soon`` per task); one
  that has the running loop at hand passes it as ``loop``.

A task never cancels or waits for itself: closing a scope from one of its
own tasks cancels and waits for the others.
"""

from __future__ import annotations

import asyncio
import logging
import types
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["CLOSE_WAIT", "RECANCEL", "TaskScope"]

CLOSE_WAIT = 5.0
"""Seconds a close waits for its tasks to end before it names the ones left and returns."""
RECANCEL = 2.0
"""Seconds a close waits between two cancellations of a task that is still running.

A task that caught its cancellation to clean up (close a connection, say) gets
this long before it is cancelled again; one that swallowed it is cancelled
again instead of being waited for forever. Half a second interrupted closes
on a loaded machine (CI saw the unclosed sockets); two leave a stop within the
supervisor's ``grace + 5 s``."""

_T = TypeVar("_T")
_SLACK = 0.001  # the loop may wake a timer this much early

_log = logging.getLogger("fencekit.tasks")


class TaskScope:
    """The owner of a set of tasks: starts them, reports their failures, cancels and awaits them.

    ``name`` says whose tasks they are in the log records (``"server"``,
    ``"consumer <id>"``); ``logger`` is where failures and tasks left
    behind are logged. See the module docstring for the rules.
    """

    __slots__ = (
        "__weakref__",
        "_abandoned",
        "_children",
        "_closing",
        "_done_awaited",
        "_done_logged",
        "_tasks",
        "close_wait",
        "logger",
        "name",
        "parent",
        "recancel",
    )

    def __init__(
        self,
        name: str,
        *,
        logger: logging.Logger | None = None,
        parent: TaskScope | None = None,
        close_wait: float = CLOSE_WAIT,
        recancel: float = RECANCEL,
    ) -> None:
        self.name = name
        self.logger: logging.Logger = logger or (parent.logger if parent is not None else _log)
        self.parent = parent
        self.close_wait = close_wait
        self.recancel = recancel
        self._tasks: dict[asyncio.Task[Any], Callable[[asyncio.Task[Any]], object] | None] = {}
        """Its tasks not ended yet (until their done callback has run), each with its ``then``."""
        self._children: weakref.WeakSet[TaskScope] | None = None  # made by the first child
        self._abandoned: set[asyncio.Task[Any]] | None = None  # left behind by a close, not awaited again
        self._closing = 0  # closes under way (a close may be asked for by two owners at once)
        # bound once: add_done_callback then costs no bound-method allocation per task
        self._done_logged = self._forget_or_report
        self._done_awaited = self._forget
        if parent is not None:
            if parent._children is None:
                parent._children = weakref.WeakSet()
            parent._children.add(self)

    def __repr__(self) -> str:
        return f"<TaskScope {self.path} running={len(self._tasks)}>"

    @property
    def path(self) -> str:
        """The names of the enclosing scopes and this one, outermost first."""
        return self.name if self.parent is None else f"{self.parent.path} / {self.name}"

    @property
    def running(self) -> int:
        """How many of its tasks have not ended (child scopes' not counted)."""
        return sum(1 for task in self._tasks if not task.done())

    @property
    def closing(self) -> bool:
        return self._closing > 0

    def tasks(self, *, nested: bool = True) -> list[asyncio.Task[Any]]:
        """Its tasks that have not ended (with ``nested``, its child scopes' too), for diagnostics."""
        return [task for _, task in self._live(nested=nested)]

    def child(self, name: str, *, logger: logging.Logger | None = None) -> TaskScope:
        """A scope nested in this one (its own owner closes it; a close of this one reaches it too)."""
        return TaskScope(
            name,
            logger=logger if logger is not None else self.logger,
            parent=self,
            close_wait=self.close_wait,
            recancel=self.recancel,
        )

    def start(
        self,
        coro: Coroutine[Any, Any, _T],
        *,
        name: str | None = None,
        awaited: bool = False,
        then: Callable[[asyncio.Task[Any]], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> asyncio.Task[_T]:
        """Run ``coro`` as a task of this scope (in a copy of the current context, as ``create_task``).

        ``awaited``: the caller awaits the task (or reads its result) and
        reports its failure itself; the scope still cancels and awaits it.
        ``then``: called with the task when it has ended (after the scope
        reported a failure), as a done callback would be. ``loop``: the
        running loop, when the caller has it at hand (``get_running_loop()``
        costs more than the rest of this method: the per-job path passes it).
        """
        task = (loop or asyncio.get_running_loop()).create_task(coro, name=name)
        self._tasks[task] = then
        task.add_done_callback(self._done_awaited if awaited else self._done_logged)
        if self._closing:
            task.cancel()
        return task

    def _forget(self, task: asyncio.Task[Any]) -> None:
        then = self._tasks.pop(task, None)
        if self._abandoned is not None:
            self._abandoned.discard(task)
        if then is not None:
            then(task)

    def _forget_or_report(self, task: asyncio.Task[Any]) -> None:
        then = self._tasks.pop(task, None)
        if self._abandoned is not None:
            self._abandoned.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._report(task)
        if then is not None:
            then(task)

    def _report(self, task: asyncio.Task[Any]) -> None:
        exc = task.exception()
        if exc is not None:
            self.logger.error(
                "%s: task %s failed: %s: %s",
                self.path,
                describe(task),
                type(exc).__name__,
                exc,
                exc_info=(type(exc), exc, exc.__traceback__),
            )

    # -- ending -------------------------------------------------------------

    def _live(self, *, nested: bool) -> list[tuple[TaskScope, asyncio.Task[Any]]]:
        """The tasks not ended yet (with their scope): this scope's, and with ``nested`` its children's."""
        me = asyncio.current_task()
        gone = self._abandoned or ()
        found = [
            (self, task) for task in self._tasks if not task.done() and task is not me and task not in gone
        ]
        if nested and self._children is not None:
            for child in list(self._children):
                found.extend(child._live(nested=True))
        return found

    async def aclose(self) -> bool:
        """Cancel every task of the scope (and of its child scopes) and wait until all have ended.

        A task still running ``recancel`` seconds after its cancellation is
        cancelled again, until ``close_wait`` seconds have passed: the tasks
        still running then are named in one ERROR record and left behind.
        Returns True when every task ended. A cancellation of the caller
        while it closes is raised once the close is done.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.close_wait
        cancelled: asyncio.CancelledError | None = None
        asked: dict[asyncio.Task[Any], float] = {}  # task -> when it was last cancelled
        asks: dict[asyncio.Task[Any], int] = {}
        nested = False
        self._closing += 1
        try:
            while True:
                live = self._live(nested=nested)
                if not live and not nested:  # none of its own left: its child scopes' tasks at once
                    nested = True
                    live = self._live(nested=True)
                if not live:
                    return True
                now = loop.time()
                if now >= deadline:
                    self._left_behind(live, asks)
                    return False
                wake = deadline
                for _, task in live:
                    last = asked.get(task)
                    if last is None or now - last >= self.recancel - _SLACK:
                        task.cancel()
                        asked[task] = last = now
                        asks[task] = asks.get(task, 0) + 1
                    wake = min(wake, last + self.recancel)
                try:
                    await asyncio.wait([task for _, task in live], timeout=max(0.0, wake - now))
                except asyncio.CancelledError as exc:  # the owner is cancelled too: finish the close first
                    cancelled = exc
                nested = True  # from the second round on, the child scopes' tasks too
        finally:
            self._closing -= 1
            if cancelled is not None:
                raise cancelled

    async def wait_for(self, coro: Coroutine[Any, Any, _T], timeout: float, *, name: str | None = None) -> _T:
        """``coro``'s result, run as a task of this scope and waited for at most ``timeout`` seconds.

        Past ``timeout`` the task is cancelled and :class:`asyncio.TimeoutError`
        raised at once: unlike ``asyncio.wait_for`` this does not wait for the
        cancelled task to end (a call blocked on a server that stopped may take
        long to), and it cannot lose the caller's own cancellation; the task
        stays in the scope, whose close awaits it. A cancelled caller cancels
        the task too.
        """
        task = self.start(coro, name=name, awaited=True)
        try:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout))
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            task.add_done_callback(_retrieved)  # its end is nobody's business now
            raise asyncio.TimeoutError(f"{describe(task)}: no result within {timeout:g}s")
        return task.result()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until every task of the scope has ended, without cancelling any (those started
        meanwhile included); False if some still run after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            live = [task for _, task in self._live(nested=False)]
            if not live:
                return True
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(live, timeout=left)

    def _left_behind(
        self, live: list[tuple[TaskScope, asyncio.Task[Any]]], asks: dict[asyncio.Task[Any], int]
    ) -> None:
        for scope, task in live:  # named once: no close (of this scope or an outer one) waits for it again
            if scope._abandoned is None:
                scope._abandoned = set()
            scope._abandoned.add(task)
        lines = [
            f"  {describe(task)} of {scope.path}: cancelled {asks.get(task, 0)} time(s), "
            f"still running at {where(task)}"
            for scope, task in live
        ]
        self.logger.error(
            "%s: %d task(s) did not end within %.1fs of their cancellation; they are left behind "
            "(a task that swallows its cancellation?):\n%s",
            self.path,
            len(live),
            self.close_wait,
            "\n".join(lines),
        )

    async def __aenter__(self) -> TaskScope:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        """Leaving the block closes the scope (cancels its tasks: they are the block's helpers)."""
        await self.aclose()


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def describe(task: asyncio.Task[Any]) -> str:
    """``name (coroutine)`` of ``task``, for log records."""
    coro = task.get_coro()
    what = getattr(coro, "__qualname__", None) or type(coro).__name__
    return f"{task.get_name()} ({what})"


def where(task: asyncio.Task[Any], depth: int = 4) -> str:
    """Where ``task`` waits now: the innermost ``depth`` frames of its await chain, outermost first
    (``file:line in function``, joined by ``" > "``)."""
    frames = []
    awaiting: Any = task.get_coro()
    for _ in range(100):  # a chain of coroutines, generators and async generators
        frame = getattr(awaiting, "cr_frame", None) or getattr(awaiting, "gi_frame", None)
        frame = frame or getattr(awaiting, "ag_frame", None)
        if frame is None:
            break
        frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaiting = (
            getattr(awaiting, "cr_await", None)
            or getattr(awaiting, "gi_yieldfrom", None)
            or getattr(awaiting, "ag_await", None)
        )
        if awaiting is None:
            break
    return " > ".join(frames[-depth:]) if frames else "(no frame)"
