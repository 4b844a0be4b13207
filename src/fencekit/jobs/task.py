"""``Task``: what a producer asks to run, and its validation at enqueue."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from fencekit._redis.keys import jid_error, validate_queue
from fencekit.errors import PayloadError
from fencekit.jobs import codec
from fencekit.jobs._ids import uuid7


@dataclass(slots=True)
class Task:
    """A task to enqueue: which queue, which operation, with which params.

    ``jid`` is generated (a time-sortable UUIDv7) when left ``None``;
    ``attempt`` counts the runs that already failed, and is normally left 0.
    ``timeout`` (seconds or a timedelta) overrides the worker's ``timeout`` for
    this task; ``expires`` (seconds or a timedelta from the enqueue, or an
    aware datetime) is when the task, if it has not started, is dropped as
    expired instead of run. ``keep_result`` (seconds; None: the client's
    ``keep_result`` setting; 0: no record) is how long its record outlives it.
    ``unique_key`` dedupes: while a task with that key of the same queue lives
    (pending, scheduled, running, or finished with its record kept), enqueue
    returns that task's jid instead of a new one; ``unique_for`` (seconds)
    bounds how long the key dedupes at most. ``priority`` (an int from -5 to 5,
    default 0) orders claiming within the queue: higher first, FIFO within one
    priority (docs/guides/flow.md). ``concurrency_key`` counts the task against that
    key's ``max_concurrency`` of its worker (a task function's ``build`` sets
    it from the worker's ``concurrency_key`` function). ``depends_on`` (jids of
    tasks that keep a record) holds the task, status ``waiting``, until every
    parent succeeded; a parent that fails for good or is cancelled cancels it
    unless ``on_parent_failure="run"`` (docs/guides/batches.md). ``debounce_key`` with
    ``debounce`` (seconds): enqueues of one key within that window replace the task still
    waiting (its params become the last call's, its jid stays), and it runs once the window
    passes without a new enqueue, or ``debounce_max`` after the first (docs/guides/flow.md).
    ``fair_key`` shares the queue fairly between keys (tenants): claims take the keys with
    work in turn, FIFO within a key. ``rate_key`` gives the task's operation a bucket of its
    ``rate_limit`` per key (docs/guides/flow.md). Task functions set both from the worker's
    ``fair_key`` and ``rate_key`` functions.
    """

    queue: str
    operation: str
    params: dict[str, Any] = field(default_factory=dict)
    jid: str | None = None
    attempt: int = 0
    timeout: float | timedelta | None = None
    expires: float | timedelta | datetime | None = None
    keep_result: float | timedelta | None = None
    unique_key: str | None = None
    unique_for: float | timedelta | None = None
    priority: int = codec.DEFAULT_PRIORITY
    concurrency_key: str | None = None
    depends_on: Sequence[str] | None = None
    on_parent_failure: str = "cancel"
    debounce_key: str | None = None
    debounce: float | timedelta | None = None
    debounce_max: float | timedelta | None = None
    fair_key: str | None = None
    rate_key: str | None = None

    def envelope(
        self,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        keep_result: float = 0.0,
        trace: str | None = None,
        batch: str | None = None,
    ) -> bytes:
        """Validate the task, fill in ``jid``, and return its encoded envelope.

        ``keep_result`` is the retention (seconds) when the task sets none;
        ``trace`` a trace context to carry (:attr:`~fencekit.hooks.FenceKitHooks.trace_enqueue`);
        ``batch`` the id of the batch it is a child or callback of (``client.batch``).
        """
        validate_queue(self.queue)
        if not isinstance(self.operation, str) or not self.operation:
            raise PayloadError(f"operation must be a non-empty str, got {self.operation!r}")
        if not isinstance(self.params, dict):
            raise PayloadError(f"params must be a dict, got {type(self.params).__name__}")
        if type(self.attempt) is not int or self.attempt < 0:
            raise PayloadError(f"attempt must be a non-negative int, got {self.attempt!r}")
        if self.jid is None:
            self.jid = uuid7()
        elif (problem := jid_error(self.jid)) is not None:
            raise PayloadError(problem)
        codec.check_params(self.params)
        if self.priority != codec.DEFAULT_PRIORITY and not codec.is_priority(self.priority):
            raise PayloadError(
                f"priority must be an int from {codec.MIN_PRIORITY} to {codec.MAX_PRIORITY}, "
                f"got {self.priority!r}"
            )
        for label, key in (
            ("concurrency_key", self.concurrency_key),
            ("fair_key", self.fair_key),
            ("rate_key", self.rate_key),
        ):
            if key is not None and not codec.is_ckey(key):
                raise PayloadError(f"{label} must be {codec.CKEY_RULE}, got {key!r}")
        if self.unique_key is not None:
            _check_unique(self.unique_key)
            self.unique_ms()
        if self.depends_on is not None:
            self.parents()
        if self.debounce_key is not None or self.debounce is not None or self.debounce_max is not None:
            self.debounce_ms()
        now_ms = time.time_ns() // 1_000_000
        raw = codec.encode(
            self.jid,
            self.queue,
            self.operation,
            self.params,
            self.attempt,
            now_ms,
            timeout=_timeout(self.timeout),
            expires_at=_expires_at(self.expires, now_ms),
            keep=self.keep_ms(keep_result),
            unique=self.unique_key,
            trace=trace,
            priority=self.priority,
            ckey=self.concurrency_key,
            batch=batch,
            fair=self.fair_key,
            rkey=self.rate_key,
        )
        if len(raw) > max_payload:
            raise PayloadError(
                f"task {self.jid} is {len(raw)} bytes encoded, above max_payload={max_payload}"
            )
        return raw

    def parents(self) -> list[str]:
        """The checked ``depends_on`` jids (PayloadError for a bad one, a repeat or a cycle)."""
        if self.on_parent_failure not in ("cancel", "run"):
            raise PayloadError(f'on_parent_failure must be "cancel" or "run", got {self.on_parent_failure!r}')
        if self.depends_on is None:
            return []
        if isinstance(self.depends_on, str) or not isinstance(self.depends_on, Sequence):
            raise PayloadError(f"depends_on must be a list of jids, got {self.depends_on!r}")
        parents = list(self.depends_on)
        for jid in parents:
            if (problem := jid_error(jid, "depends_on")) is not None:
                raise PayloadError(problem)
        if len(set(parents)) != len(parents):
            raise PayloadError(f"depends_on names a parent twice: {parents}")
        if self.jid is not None and self.jid in parents:
            raise PayloadError(f"task {self.jid} depends on itself (a cycle)")
        return parents

    def debounce_ms(self) -> tuple[int, int]:
        """(window, longest wait or 0) in ms of a debounced task; PayloadError for a bad combination."""
        if self.debounce_key is None or self.debounce is None:
            raise PayloadError("a debounced task needs both debounce_key and debounce (seconds)")
        if (problem := jid_error(self.debounce_key, "debounce_key")) is not None:
            raise PayloadError(problem)
        if self.unique_key is not None or self.depends_on is not None:
            raise PayloadError("a debounced task takes no unique_key or depends_on (its key already dedupes)")
        window = max(1, round(codec.seconds_in(self.debounce, "debounce", zero=False) * 1000))
        most = 0
        if self.debounce_max is not None:
            most = max(1, round(codec.seconds_in(self.debounce_max, "debounce_max", zero=False) * 1000))
            if most < window:
                raise PayloadError(f"debounce_max ({most} ms) must be at least the window ({window} ms)")
        return window, most

    def unique_ms(self) -> int:
        """How long ``unique_key`` dedupes at most, in ms (0: while its task lives)."""
        if self.unique_for is None:
            return 0
        seconds = codec.seconds_in(self.unique_for, "unique_for", zero=False)
        return max(1, round(seconds * 1000))

    def keep_ms(self, default: float) -> int | None:
        """The retention of this task's record in ms (its own, else ``default`` s), None for no record."""
        value = self.keep_result if self.keep_result is not None else default
        seconds = codec.seconds_in(value, "keep_result", zero=True)
        if self.unique_key is not None:  # its record is what holds the key: gone as it finishes
            return max(1, round(seconds * 1000))
        return round(seconds * 1000) or None

    @classmethod
    def from_envelope(cls, envelope: codec.Envelope) -> Task:
        expires = (
            datetime.fromtimestamp(envelope.expires_at / 1000, timezone.utc)
            if envelope.expires_at is not None
            else None
        )
        return cls(
            envelope.queue,
            envelope.operation,
            envelope.params,
            envelope.jid,
            envelope.attempt,
            envelope.timeout,
            expires,
            envelope.keep / 1000 if envelope.keep is not None else 0,
            envelope.unique,
            priority=envelope.priority,
            concurrency_key=envelope.ckey,
            fair_key=envelope.fair,
            rate_key=envelope.rkey,
        )


def unix_ms(when: datetime, label: str) -> int:
    """Unix ms of an aware datetime (a naive one is refused: whose clock would it be?)."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise PayloadError(f"{label} must be a timezone-aware datetime, got the naive {when!r}")
    return round(when.timestamp() * 1000)


def _check_unique(key: object) -> None:
    if (problem := jid_error(key, "unique_key")) is not None:
        raise PayloadError(problem)


def _timeout(value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    return codec.seconds_in(value, "timeout", zero=False)


def _expires_at(value: float | timedelta | datetime | None, now_ms: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return unix_ms(value, "expires")
    return now_ms + round(codec.seconds_in(value, "expires", zero=False) * 1000)
