"""Observability hooks: callbacks fencekit calls around its primitives and its jobs.

:class:`FenceKitHooks` keeps the eight callbacks of fencekit 0.6.1's class of
the same name (same names, same arguments), so hooks written for it work
here, and adds the job queue's: a task enqueued, started, succeeded,
failed, retried, fenced out, cancelled, returned to its queue at a stop, or
reaped from a dead consumer. Give one to a primitive
(``DistributedLock(redis, hooks=...)``), a :class:`~fencekit.Client`, a
:class:`~fencekit.Server` or an :class:`~fencekit.App` (every pool child
and the supervisor's reaper use the App's)::

    hooks = FenceKitHooks(
        on_failed=lambda e: metrics.incr("jobs.failed", tags=[e.queue]),
        on_lock_acquire_failed=lambda resource: log.info("busy: %s", resource),
    )
    app = fencekit.App([AnalyseGame], hooks=hooks)

A callback is a plain function called on the event loop (or in the caller's
thread for the synchronous primitives): keep it short and hand slow work to
a queue of your own. One that raises never breaks the caller: the error is
logged (``fencekit.hooks``, once per callback and then every 1,000th time)
and the work goes on. A job's outcome callbacks run once Redis accepted
the outcome (an ack that landed, a retry that was scheduled); an outcome
Redis refuses is ``on_fenced_out`` instead. ``fencekit.integrations.otel.otel_hooks()``
builds a set that records OpenTelemetry spans, ``otel_metrics()`` one that records
metrics; :meth:`FenceKitHooks.combine` makes one set of several.

Nothing is called, and the hot path pays one ``is None`` test per job, when
no hooks are given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # hooks sit below the primitives that call them
    from fencekit.primitives.tokens import BeginOutcome

__all__ = ["FenceKitHooks", "JobEvent", "check_hooks", "key_label"]

_log = logging.getLogger("fencekit.hooks")
_REPEAT = 1000  # after the first, every this-many-th error of one callback is logged


class JobEvent(NamedTuple):
    """What one job callback is told: which task, which delivery, when, and how it ended.

    Times are wall-clock nanoseconds (``time.time_ns()``) or ``None`` where
    the stage did not happen (an enqueue has no ``token``; a dead letter that
    never started has no ``started_ns``). ``trace`` is the W3C
    ``traceparent`` the task carries (set at enqueue by
    :attr:`FenceKitHooks.trace_enqueue`), ``error`` the exception of a
    failed or retried attempt, of a refused enqueue, or of a timeout
    (``TimeoutError``); ``delay`` the seconds until a retry runs. ``attempt``
    is the run's number from 1, as the log lines and the admin page count
    (:func:`~fencekit.jobs.codec.run_number`; 0 where no envelope was read).
    """

    queue: str
    operation: str
    jid: str | None
    attempt: int = 0
    token: int | None = None
    trace: str | None = None
    claimed_ns: int | None = None
    started_ns: int | None = None
    finished_ns: int | None = None
    at_ns: int = 0
    error: BaseException | None = None
    delay: float | None = None


Callback = Callable[..., None] | None


@dataclass
class FenceKitHooks:
    """Optional callbacks around fencekit's primitives and jobs (see the module docstring).

    The primitives' eight (fencekit 0.6.1's):

    - ``on_idempotency_begin(key, won)``: ``IdempotencyGuard.try_begin`` answered;
    - ``on_idempotency_outcome(key, outcome)``: ``try_begin_or_reclaim`` answered (a :class:`BeginOutcome`);
    - ``on_idempotency_done(key, stored_result)``: ``mark_done`` landed;
    - ``on_lock_acquired(resource, token)`` / ``on_lock_acquire_failed(resource)`` /
      ``on_lock_released(resource)``: ``DistributedLock``;
    - ``on_fence_rejected(resource, token)`` / ``on_fence_advanced(resource, token)``:
      ``FenceGate`` refused a stale token / accepted one (``check_and_advance``, ``set_if_fresh``).

    The job queue's, each given a :class:`JobEvent`: ``on_enqueued`` (the
    producer's enqueue was answered; ``event.error`` when it failed),
    ``on_started`` (in the job's own task, just before ``perform``; a
    context variable set here is seen by ``perform``), ``on_succeeded``,
    ``on_failed`` (for good: retries spent, a timeout, a dead letter),
    ``on_retried``, ``on_fenced_out`` (Redis refused the outcome: the
    delivery was reaped or returned while it ran), ``on_cancelled`` (a
    client's ``cancel()`` stopped it), ``on_returned`` (the consumer
    stopped while it ran: back to its queue unchanged), ``on_interrupted`` (a stop
    interrupted it at a checkpoint: back to its queue, no attempt counted, to
    resume from its state) and ``on_reaped``
    (the reaper took it from a dead consumer). ``trace_enqueue(queue,
    operation, jid)`` is called as a task is encoded and may return a W3C
    ``traceparent`` to carry in the envelope (``None``: carry none).
    """

    on_idempotency_begin: Callable[[str, bool], None] | None = None
    on_idempotency_outcome: Callable[[str, BeginOutcome], None] | None = None
    on_idempotency_done: Callable[[str, bool], None] | None = None
    on_lock_acquired: Callable[[str, int], None] | None = None
    on_lock_acquire_failed: Callable[[str], None] | None = None
    on_lock_released: Callable[[str], None] | None = None
    on_fence_rejected: Callable[[str, int], None] | None = None
    on_fence_advanced: Callable[[str, int], None] | None = None
    on_enqueued: Callable[[JobEvent], None] | None = None
    on_started: Callable[[JobEvent], None] | None = None
    on_succeeded: Callable[[JobEvent], None] | None = None
    on_failed: Callable[[JobEvent], None] | None = None
    on_retried: Callable[[JobEvent], None] | None = None
    on_fenced_out: Callable[[JobEvent], None] | None = None
    on_cancelled: Callable[[JobEvent], None] | None = None
    on_returned: Callable[[JobEvent], None] | None = None
    on_interrupted: Callable[[JobEvent], None] | None = None
    on_reaped: Callable[[JobEvent], None] | None = None
    trace_enqueue: Callable[[str, str, str], str | None] | None = None
    _errors: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def combine(cls, *hooks: FenceKitHooks | None) -> FenceKitHooks:
        """One set calling each of ``hooks`` in turn (``None`` entries are skipped).

        ``FenceKitHooks.combine(otel_hooks(), otel_metrics())`` traces and
        counts. A callback one set leaves unset costs nothing; one that raises is
        logged by its own set and the next set is still called. ``trace_enqueue``
        asks every set and carries the first ``traceparent`` given.
        """
        parts = [h for h in hooks if h is not None]
        names = [f.name for f in fields(FenceKitHooks) if f.init and f.name != "trace_enqueue"]
        merged: dict[str, Any] = {name: _fan_out(name, parts) for name in names}
        tracers = [h for h in parts if h.trace_enqueue is not None]
        if tracers:

            def trace_enqueue(queue: str, operation: str, jid: str) -> str | None:
                traces = [h.trace_of(queue, operation, jid) for h in tracers]
                return next((t for t in traces if t is not None), None)

            merged["trace_enqueue"] = trace_enqueue
        return FenceKitHooks(**merged)

    # the primitives' (0.6.1's method names) --------------------------------------
    def idempotency_begin(self, key: str, won: bool) -> None:
        self.call("on_idempotency_begin", key, won)

    def idempotency_outcome(self, key: str, outcome: BeginOutcome) -> None:
        self.call("on_idempotency_outcome", key, outcome)

    def idempotency_done(self, key: str, stored_result: bool) -> None:
        self.call("on_idempotency_done", key, stored_result)

    def lock_acquired(self, resource: str, token: int) -> None:
        self.call("on_lock_acquired", resource, token)

    def lock_acquire_failed(self, resource: str) -> None:
        self.call("on_lock_acquire_failed", resource)

    def lock_released(self, resource: str) -> None:
        self.call("on_lock_released", resource)

    def fence_rejected(self, resource: str, token: int) -> None:
        self.call("on_fence_rejected", resource, token)

    def fence_advanced(self, resource: str, token: int) -> None:
        self.call("on_fence_advanced", resource, token)

    # the queue's --------------------------------------------------------------
    def job(self, what: str, event: JobEvent) -> None:
        """Call ``on_<what>`` with ``event`` (``what``: enqueued, started, succeeded, ...)."""
        self.call("on_" + what, event)

    def trace_of(self, queue: str, operation: str, jid: str) -> str | None:
        """The ``traceparent`` to carry for a task encoded now (``trace_enqueue``), or None."""
        callback = self.trace_enqueue
        if callback is None:
            return None
        try:
            trace = callback(queue, operation, jid)
        except Exception as exc:
            self._failed("trace_enqueue", exc)
            return None
        return trace if isinstance(trace, str) and 0 < len(trace) <= 512 else None

    def call(self, name: str, *args: Any) -> None:
        """Call the callback ``name`` (if set) with ``args``; an exception is logged, never raised."""
        callback: Callback = getattr(self, name)
        if callback is None:
            return
        try:
            callback(*args)
        except Exception as exc:
            self._failed(name, exc)

    def _failed(self, name: str, exc: Exception) -> None:
        count = self._errors.get(name, 0) + 1
        self._errors[name] = count
        if count == 1 or count % _REPEAT == 0:
            _log.warning(
                "hook %s raised (%d time(s) so far; the work went on): %s: %s",
                name,
                count,
                type(exc).__name__,
                exc,
                exc_info=count == 1,
            )


def _fan_out(name: str, parts: list[FenceKitHooks]) -> Callback:
    """The callback ``name`` of ``parts`` combined: None when none sets it, a set's own when one does."""
    setting = [h for h in parts if getattr(h, name) is not None]
    if not setting:
        return None
    if len(setting) == 1:
        only: Callback = getattr(setting[0], name)
        return only

    def each(*args: Any) -> None:
        for h in setting:
            h.call(name, *args)

    return each


def check_hooks(hooks: object) -> FenceKitHooks | None:
    """``hooks`` if it is a :class:`FenceKitHooks` or None, else TypeError (a misplaced argument)."""
    if hooks is None or isinstance(hooks, FenceKitHooks):
        return hooks
    raise TypeError(f"hooks must be a fencekit.FenceKitHooks, got {type(hooks).__name__}")


def key_label(key: str, *, suffix_len: int = 12) -> str:
    """A short label of ``key`` for telemetry (its last ``suffix_len`` characters), as in 0.6.1."""
    if len(key) <= suffix_len:
        return key
    return f"...{key[-suffix_len:]}"
