"""Task records: what happened to task ``jid``, read back as a :class:`JobInfo`.

A task keeps a record (``P:{Q}:job:<jid>``, a hash) when its producer's or
its worker's ``keep_result`` is above 0 (written at enqueue: state
``pending`` or ``scheduled``) and whenever it fails for good (state
``failed``, with its error and traceback, unless the worker opts out). The
record is not written at claim: while it is unfinished, ``job_info.lua``
looks for it in the in-flight hashes, and the running delivery's token is
when it was claimed (tokens are the Redis clock in µs, or just above it).
The ack that finishes a delivery writes the result and the final state in
the same script, and only while that delivery is current (invariant I3 of
``docs/design.md``): a stale delivery's result never lands.

Records in Redis may have been written by another version or by hand:
:func:`parse` keeps what is well-formed and never raises.
"""

from __future__ import annotations

import enum
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from fencekit.errors import PayloadError
from fencekit.jobs import codec

__all__ = ["MAX_TRACEBACK", "JobError", "JobInfo", "JobStatus", "Progress", "Run", "encode_error", "parse"]

MAX_TRACEBACK = 16 * 1024
"""Characters of a traceback kept in a record (the end of it: where it was raised)."""


class JobStatus(str, enum.Enum):
    """Where a task is in its life."""

    PENDING = "pending"
    SCHEDULED = "scheduled"
    WAITING = "waiting"
    """Held until its parents succeed (``Task(depends_on=...)``)."""
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def finished(self) -> bool:
        """True once nothing will change it any more (short of a revive or a retry of a failure)."""
        return self in _FINISHED


_FINISHED = frozenset(
    {JobStatus.DONE, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED, JobStatus.EXPIRED}
)


@dataclass(frozen=True, slots=True)
class JobError:
    """Why an attempt failed: the exception's type, message and formatted traceback."""

    type: str
    message: str
    traceback: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> JobError:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type(exc).__name__, str(exc), text[-MAX_TRACEBACK:])

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


@dataclass(frozen=True, slots=True)
class Progress:
    """What a running job last reported with ``current_job().progress(...)``."""

    fraction: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a task as its record keeps it: which delivery, where, when, how it ended.

    ``outcome``: done, failed, dead, retried (failed, scheduled again), crashed
    (its consumer died; the reaper returned it), returned (its consumer
    stopped; it runs again under the same number) or interrupted (a stop
    interrupted it at a checkpoint; it resumes under the same number). Times are Unix seconds on
    Redis's clock: ``started_at`` is the claim's (the token's), ``ended_at``
    the settlement's.
    """

    number: int
    token: int
    consumer: str
    started_at: float
    ended_at: float
    outcome: str

    @property
    def duration(self) -> float:
        return max(0.0, self.ended_at - self.started_at)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A task as its record and the in-flight hashes tell it (times: Unix seconds, Redis clock)."""

    jid: str
    queue: str
    operation: str | None
    params: dict[str, Any] | None
    status: JobStatus
    attempt: int
    """The number of its run, from 1: the run under way, the last one, or the one it waits for
    (:func:`~fencekit.jobs.codec.run_number`); 0 when its envelope is gone."""
    result: Any = None
    error: JobError | None = None
    enqueued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    progress: Progress | None = None
    due_at: float | None = None
    token: int | None = None
    """The token of the delivery that finished it, or that runs it now."""
    runs: tuple[Run, ...] = ()
    """Its runs that ended while it had a record, oldest first (the newest 50)."""
    batch: str | None = None
    """The id of the batch it is a child or a callback of (its envelope's ``batch``), else None."""


def encode_error(error: JobError) -> bytes:
    return orjson.dumps({"type": error.type, "message": error.message, "traceback": error.traceback})


def encode_progress(fraction: float, message: str) -> bytes:
    """The JSON a progress report is stored as; a fraction outside 0..1 is a :class:`ValueError`."""
    if type(fraction) not in (int, float) or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"progress fraction must be a number from 0 to 1, got {fraction!r}")
    if not isinstance(message, str):
        raise TypeError(f"progress message must be a str, got {type(message).__name__}")
    return orjson.dumps({"fraction": float(fraction), "message": message[:1000]})


def encode_result(value: object, max_payload: int) -> bytes:
    """A job's return value as stored: plain JSON only, at most ``max_payload`` bytes."""
    try:
        codec.check_params(value, "result")
    except PayloadError as exc:
        raise PayloadError(f"the job's return value is not plain JSON: {exc}") from None
    raw = orjson.dumps(value)
    if len(raw) > max_payload:
        raise PayloadError(f"the job's return value is {len(raw)} bytes encoded, above max_payload")
    return raw


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _ms(value: Any) -> float | None:
    try:
        return int(_text(value)) / 1000
    except (TypeError, ValueError):
        return None


def _json(value: Any) -> Any:
    try:
        return orjson.loads(value)
    except (orjson.JSONDecodeError, TypeError):
        return None


def _error(value: Any) -> JobError | None:
    data = _json(value) if value else None
    if not isinstance(data, dict):
        return None
    return JobError(str(data.get("type", "")), str(data.get("message", "")), str(data.get("traceback", "")))


def _progress(value: Any) -> Progress | None:
    data = _json(value) if value else None
    if not isinstance(data, dict) or type(data.get("fraction")) not in (int, float):
        return None
    return Progress(float(data["fraction"]), str(data.get("message", "")))


def _token(value: Any) -> int | None:
    text = _text(value) if value is not None else ""
    return int(text) if text.isdigit() else None


_SAME_NUMBER_NEXT = ("returned", "interrupted")  # the run after one of these has the same number


def _runs(value: Any, attempt: int, done: list[str] | None) -> tuple[Run, ...]:
    """The ``runs`` lines of a record (``_record.lua``), then ``done`` (the run that completed it,
    from the record's own fields: ``ack_claim.lua`` writes no line, it is the hot path), numbered
    back from ``attempt``: the number of the run under way, the last one, or the one it waits for."""
    entries = []
    for line in (_text(value) if value else "").splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
            entries.append(parts)
    if done is not None:
        entries.append(done)
    if not entries:
        return ()
    ended_for_good = entries[-1][2] in ("done", "failed", "dead", *_SAME_NUMBER_NEXT)
    number = attempt if ended_for_good else attempt - 1
    runs: list[Run] = []
    for i in range(len(entries) - 1, -1, -1):
        token, ended, outcome, consumer = entries[i]
        runs.append(Run(number, int(token), consumer, int(token) / 1_000_000, int(ended) / 1000, outcome))
        if i > 0 and entries[i - 1][2] not in _SAME_NUMBER_NEXT:
            number -= 1
    return tuple(reversed(runs))


def _done_run(fields: dict[str, Any], status: JobStatus, token: int | None) -> list[str] | None:
    """The completing run of a done record, as a runs line's parts (None: not done, or no ``by``)."""
    finished, by = fields.get("finished"), fields.get("by")
    if status is not JobStatus.DONE or not token or finished is None or by is None:
        return None
    return [str(token), _text(finished), "done", _text(by)]


def record_envelope(fields: Mapping[str, Any]) -> Any:
    """The envelope a record holds, None if none: its fields ``env``, ``env1``, ... joined.

    Scripts split it at 64 bytes so that Redis keeps the record as a compact
    listpack (``lua/_env.lua``); a record written before holds it whole in ``env``.
    """
    head = fields.get("env")
    if head is None:
        return None
    parts = [head]
    while (part := fields.get(f"env{len(parts)}")) is not None:
        parts.append(part)
    return head if len(parts) == 1 else head[:0].join(parts)


def parse(jid: str, queue: str, reply: Sequence[Any], now_ms: float | None = None) -> JobInfo | None:
    """The :class:`JobInfo` of a ``job_info.lua`` reply, None when the task has no record."""
    flat, running_token, running_env = reply
    if not flat:
        return None
    fields = {_text(k): v for k, v in zip(flat[::2], flat[1::2])}
    raw_env = running_env if running_env else record_envelope(fields)
    envelope: codec.Envelope | None = None
    if raw_env:
        try:
            envelope = codec.decode(raw_env)
        except PayloadError:
            envelope = None
    try:
        status = JobStatus(_text(fields.get("state", "")))
    except ValueError:
        status = JobStatus.PENDING
    token = _token(fields.get("token"))
    started = None
    run_token = _token(running_token)
    if run_token:
        status, token = JobStatus.RUNNING, run_token
    due = _ms(fields.get("due"))
    now = (time.time() * 1000 if now_ms is None else now_ms) / 1000
    if status is JobStatus.SCHEDULED and due is not None and due <= now:
        status = JobStatus.PENDING  # due: the scheduler moved it, or is about to
    if token and status in (JobStatus.RUNNING, *_FINISHED) and token > 10**15:
        started = token / 1_000_000  # a token is its claim's Redis time in µs (or just above it)
    result = _json(fields["result"]) if fields.get("result") else None
    return JobInfo(
        jid=jid,
        queue=queue,
        operation=envelope.operation if envelope else None,
        params=envelope.params if envelope else None,
        status=status,
        attempt=codec.run_number(envelope.attempt) if envelope else 0,
        result=result,
        error=_error(fields.get("error")),
        enqueued_at=_ms(fields.get("enqueued")),
        started_at=started if status is not JobStatus.EXPIRED else None,
        finished_at=_ms(fields.get("finished")) if status.finished else None,
        progress=_progress(fields.get("progress")),
        due_at=due if status is JobStatus.SCHEDULED else None,
        token=token,
        runs=_runs(
            fields.get("runs"),
            codec.run_number(envelope.attempt) if envelope else 0,
            _done_run(fields, status, token),
        ),
        batch=envelope.batch if envelope else None,
    )
