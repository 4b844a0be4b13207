"""Telling :class:`~fencekit.hooks.FenceKitHooks` what became of each delivery.

A consumer with hooks owns one :class:`Observer`. The performer reports
each stage as it happens (started; then the outcome it decided: succeeded,
failed, retried); the consumer reports what Redis made of that outcome when
the reply of its turn arrives: accepted, so the outcome's callback runs, or
refused, so ``on_fenced_out`` runs instead. Between the two the event waits
here, keyed by ``(queue, token)``. Without hooks nothing here exists: the
consumer and performer hold ``None`` and test it once per job.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fencekit.errors import PayloadError
from fencekit.hooks import FenceKitHooks, JobEvent
from fencekit.jobs import codec

if TYPE_CHECKING:
    from fencekit.jobs.codec import Envelope

__all__ = ["Observer", "event_of", "event_of_raw"]

Key = tuple[str, int]


class Observer:
    """The job events of one consumer on their way to its hooks (see the module docstring)."""

    __slots__ = ("_open", "_outcome", "claimed_ns", "hooks")

    def __init__(self, hooks: FenceKitHooks) -> None:
        self.hooks = hooks
        self.claimed_ns = 0
        """When the consumer sent the claim whose reply it is absorbing (wall ns)."""
        self._open: dict[Key, JobEvent] = {}  # started, outcome not decided yet
        # decided, waiting for Redis: (outcome, the started event, finished_ns, error, delay)
        self._outcome: dict[Key, tuple[str, JobEvent, int, BaseException | None, float | None]] = {}

    def started(self, queue: str, token: int, envelope: Envelope) -> None:
        """The job of delivery ``token`` starts now (called in the job's own task)."""
        now = time.time_ns()
        event = event_of(queue, token, envelope, self.claimed_ns or now, now, now)
        self._open[(queue, token)] = event
        if self.hooks.on_started is not None:
            self.hooks.call("on_started", event)

    def decided(
        self,
        queue: str,
        token: int,
        outcome: str,
        error: BaseException | None = None,
        delay: float | None = None,
        envelope: Envelope | None = None,
        jid: str | None = None,
    ) -> None:
        """The performer settled on ``outcome`` (succeeded, failed, retried); Redis has not answered yet."""
        key = (queue, token)
        event = self._open.pop(key, None)
        if event is None:  # never started: a dead letter, or a timeout raced the start
            event = (
                event_of(queue, token, envelope)
                if envelope is not None
                else JobEvent(queue, "", jid, 0, token)
            )
        self._outcome[key] = (outcome, event, time.time_ns(), error, delay)

    def ended_here(self, queue: str, token: int, outcome: str) -> None:
        """The job ended without a settle of this consumer (cancelled, returned at a stop): tell now."""
        event = self._open.pop((queue, token), None)
        if event is not None:
            now = time.time_ns()
            self._tell(outcome, event, now, now, None, None)

    def landed(self, queue: str, token: int) -> None:
        """Redis accepted the outcome decided for ``(queue, token)``: its callback runs."""
        decided = self._outcome.pop((queue, token), None)
        if decided is not None:
            outcome, event, finished, error, delay = decided
            self._tell(outcome, event, finished, time.time_ns(), error, delay)

    def forget(self, queue: str, token: int) -> None:
        """Its settle failed with an error (logged by the consumer): the delivery stays for the reaper."""
        self._outcome.pop((queue, token), None)

    def refused(self, queue: str, token: int) -> None:
        """Redis refused it: the delivery was reaped or returned while it ran."""
        decided = self._outcome.pop((queue, token), None)
        if decided is not None:
            _, event, finished, error, _ = decided
            self._tell("fenced_out", event, finished, time.time_ns(), error, None)
            return
        running = self._open.pop((queue, token), None)
        if running is not None:
            self._tell("fenced_out", running, None, time.time_ns(), None, None)

    def _tell(
        self,
        outcome: str,
        e: JobEvent,
        finished: int | None,
        at: int,
        error: BaseException | None,
        delay: float | None,
    ) -> None:
        name = "on_" + outcome
        if getattr(self.hooks, name) is not None:
            event = JobEvent(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], finished, at, error, delay)
            self.hooks.call(name, event)


def event_of(
    queue: str,
    token: int | None,
    envelope: Envelope,
    claimed_ns: int | None = None,
    started_ns: int | None = None,
    at_ns: int = 0,
    error: BaseException | None = None,
) -> JobEvent:
    """The event of ``envelope``'s delivery ``token`` of ``queue``."""
    return JobEvent(
        queue,
        envelope.operation,
        envelope.jid,
        codec.run_number(envelope.attempt),
        token,
        envelope.trace,
        claimed_ns,
        started_ns,
        None,
        at_ns,
        error,
    )


def event_of_raw(
    queue: str, token: int | None, raw: bytes | str, error: BaseException | None = None
) -> JobEvent:
    """The event of a stored envelope that no consumer of this process ran (the reaper's)."""
    try:
        envelope = codec.decode(raw)
    except PayloadError:
        return JobEvent(queue, "", codec.peek_jid(raw), 0, token, at_ns=time.time_ns(), error=error)
    return event_of(queue, token, envelope, at_ns=time.time_ns(), error=error)
