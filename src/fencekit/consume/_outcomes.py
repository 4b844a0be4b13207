"""What a performed task's outcome becomes: the outbox entry of an ack, a retry, a failure, a drop.

:class:`Outcomes` is a base class of :class:`~fencekit.consume._perform.Performer`
(which owns the state declared below and runs the task); it lives apart so the
performer keeps one job -- running a task and watching its deadline -- while the
rules of each outcome sit together: a kept result that does not encode fails the
task, a failed attempt is retried after its policy's delay or fails for good
(logged with its traceback), an expired task is dropped unrun, and bad input is
a dead letter with its reason (I7). Each builds its script call with
:mod:`fencekit.consume._settle` and puts it in the outbox; nothing here talks to Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fencekit._log import JobLines
from fencekit._redis.keys import KeySpace
from fencekit._redis.scripts import RecordedAck, StagedWrite
from fencekit.consume import _settle as settle
from fencekit.consume._observe import Observer
from fencekit.consume._outbox import Outbox
from fencekit.consume._settle import Delivery, Retention
from fencekit.errors import PayloadError
from fencekit.jobs import codec, records
from fencekit.jobs.worker import WorkerSpec

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fencekit.consume._perform import ConsumerStats

__all__ = ["Outcomes"]


class Outcomes:
    """Turning outcomes into outbox entries (the performer's state, declared for mypy)."""

    keys: KeySpace
    retention: Retention
    consumer_id: str
    inflight: Mapping[str, str]
    outbox: Outbox
    stats: ConsumerStats
    logger: logging.Logger
    wake: Callable[[], None]
    max_payload: int
    observer: Observer | None
    lines: JobLines

    def delivery(self, queue: str, token: int, raw: bytes = b"") -> Delivery:
        return Delivery(queue, self.inflight[queue], token, raw)

    def _ack_recorded(
        self,
        queue: str,
        token: int,
        raw: bytes,
        envelope: codec.Envelope,
        spec: WorkerSpec,
        result: object,
        keep_ms: int,
        checkpointed: bool = False,
        writes: list[StagedWrite] | None = None,
    ) -> None:
        """An ack whose result lands in the task's record (created now if the producer kept none);
        a task that ``checkpointed`` keeps its state as long as the record; its staged ``writes``
        land with the ack (a result that cannot be encoded fails the task: they are dropped)."""
        try:
            value = records.encode_result(result, self.max_payload)
        except PayloadError as exc:
            self.stats.failed += 1
            self.logger.error("task %s failed: %s", envelope.jid, exc)
            if self.observer is not None:
                self.observer.decided(queue, token, "failed", exc)
            call = settle.fail(
                self.keys,
                self.delivery(queue, token),
                jid=envelope.jid,
                retention=self.retention,
                error=records.JobError("PayloadError", str(exc)),
                keep=spec.keep_failed,
            )
            self.outbox.settle(queue, token, call, envelope.jid)
            return
        ack = RecordedAck(
            self.keys.queue(queue).job(envelope.jid),
            token,
            envelope.jid,
            value,
            keep_ms,
            b"" if envelope.keep else raw,
            self.keys.queue(queue).unique(envelope.unique) if envelope.unique else "",
            ("!" if checkpointed else "") + (envelope.batch or ""),
        )
        self.outbox.ack(queue, token, envelope.jid, ack, writes)

    def _interrupted(self, queue: str, token: int, envelope: codec.Envelope) -> None:
        """A stop interrupted it at a checkpoint: back to the head of its queue with the same
        attempt, to resume from its state (its record's runs say "interrupted")."""
        self.logger.info("task %s interrupted by the stop at a checkpoint: back to %s", envelope.jid, queue)
        if self.observer is not None:
            self.observer.decided(queue, token, "interrupted")
        delivery = self.delivery(queue, token)
        call = settle.requeue(
            self.keys,
            delivery,
            envelope.encode(),
            jid=envelope.jid,
            counter="",
            retention=self.retention,
            run="interrupted",
        )
        self.outbox.settle(queue, token, call, envelope.jid)
        self.wake()

    def _swallowed(self, jid: str) -> None:
        self.logger.warning(
            "task %s caught fencekit.Interrupted and went on: its process's stop waited for it "
            "(let Interrupted propagate: the task resumes from its checkpoint, no attempt lost)",
            jid,
        )

    def _expired(self, queue: str, token: int, envelope: codec.Envelope) -> None:
        self.stats.expired += 1
        if self.lines.on:
            self.lines.info(
                "task %s (%s/%s) expired before it started: dropped", envelope.jid, queue, envelope.operation
            )
        call = settle.drop(
            self.keys,
            self.delivery(queue, token),
            "expired",
            jid=envelope.jid,
            recorded=envelope.keep is not None,
            retention=self.retention,
        )
        self.outbox.settle(queue, token, call, envelope.jid)
        self.wake()

    def _failed(
        self,
        queue: str,
        token: int,
        envelope: codec.Envelope,
        spec: WorkerSpec,
        exc: Exception | None,
        timeout: float | None = None,
        *,
        final: bool = False,
        fenced: str | None = None,
    ) -> None:
        """A failed attempt (``exc`` raised, or ``timeout`` expired): retry it, or fail for good
        (``final``: an error no retry can pass, e.g. :class:`~fencekit.errors.CrossSlotWrite`).

        ``fenced``: the job's own delivery was fenced out (why). Its settle is sent as
        any other and Redis refuses it (the delivery is not current), which the
        refusal's line says; nothing logs "retrying": the current delivery decides.
        """
        policy = spec.policy
        following = None if final else policy.next_attempt(envelope.attempt)
        delivery = self.delivery(queue, token)
        attempt = f"attempt {codec.run_number(envelope.attempt)} of {policy.runs()}"
        if exc is not None:
            error = records.JobError.of(exc)
        else:
            error = records.JobError("TimeoutError", f"timed out after {timeout:g}s")
        if timeout is not None:
            what = (
                f"task {envelope.jid} ({queue}/{envelope.operation}) timed out after {timeout:g}s ({attempt})"
            )
        else:
            what = f"task {envelope.jid} failed ({attempt})"
        if self.observer is not None:
            self.observer.decided(
                queue,
                token,
                "failed" if following is None else "retried",
                exc if exc is not None else TimeoutError(error.message),
                None if following is None else policy.delay(envelope.attempt),
                envelope,
            )
        if following is None:
            call = settle.fail(
                self.keys,
                delivery,
                jid=envelope.jid,
                retention=self.retention,
                error=error,
                keep=spec.keep_failed,
            )
        else:
            delay = policy.delay(envelope.attempt)
            call = settle.retry(self.keys, delivery, envelope, following, delay, error)
        if fenced is not None:  # the settle's refusal is logged (consume._refusals): one line, not two
            self.logger.debug(
                "task %s (%s/%s, %s) %s: nothing to retry here, its current delivery decides",
                envelope.jid,
                queue,
                envelope.operation,
                attempt,
                fenced,
            )
        elif following is None:
            self.stats.failed += 1
            extra = task_fields(envelope, queue, token, record=True)
            if exc is not None:
                self.logger.error(
                    "%s, failed permanently: %s", what, _first_line(exc), exc_info=exc, extra=extra
                )
            else:
                self.logger.error("%s, failed permanently", what, extra=extra)
        else:
            self.stats.retried += 1
            extra = task_fields(envelope, queue, token, record=True)
            if exc is not None:
                self.logger.warning("%s, retrying in %.1fs: %s", what, delay, _first_line(exc), extra=extra)
            else:
                self.logger.warning("%s, retrying in %.1fs", what, delay, extra=extra)
        self.outbox.settle(queue, token, call, envelope.jid)
        self.wake()

    def _dead(self, queue: str, token: int, jid: str | None, reason: str) -> None:
        if self.observer is not None:
            self.observer.decided(queue, token, "failed", PayloadError(reason), jid=jid)
        call = settle.fail(
            self.keys,
            self.delivery(queue, token),
            jid=jid,
            reason=reason,
            consumer=self.consumer_id,
            retention=self.retention,
        )
        self.outbox.settle(queue, token, call, jid)
        self.wake()


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (a retry's log line; the final failure logs the traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def task_fields(
    envelope: codec.Envelope, queue: str, token: int, duration: float | None = None, *, record: bool = False
) -> dict[str, Any]:
    """The task's fields of a structured log line (``log_format`` json, or the application's handlers).

    For :meth:`JobLines.info` the first key, ``"message"``, holds the message's place in a JSON
    line; ``record=True`` leaves it out, for a record's ``extra=`` (where it is the record's own).
    """
    fields: dict[str, Any] = {} if record else {"message": ""}
    fields["jid"] = envelope.jid
    fields["queue"] = queue
    fields["operation"] = envelope.operation
    fields["attempt"] = codec.run_number(envelope.attempt)
    fields["token"] = token
    if duration is not None:
        fields["duration"] = duration
    return fields
