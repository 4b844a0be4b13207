"""The task envelope: what a queue stores for one task, encoded with orjson.

An envelope is a JSON object::

    {"jid": "0193…", "queue": "emails", "operation": "send_email",
     "params": {...}, "attempt": 0, "enqueued_at": 1764480000123}

and, only when the task sets them, ``"timeout"`` (seconds the run may take),
``"expires_at"`` (Unix ms after which it is not started), ``"keep"`` (ms
its finished record is kept: the task has a record), ``"unique"`` (its
``unique_key``) and ``"priority"`` (a non-default priority, placed right after ``"jid"`` so the
Lua scripts read it with one anchored match: docs/guides/flow.md), ``"ckey"`` (its
concurrency key, after ``"jid"`` and any ``"priority"``, for the same reason),
``"batch"`` (the id of the batch it is a child or a callback of, after those, for the
same reason: docs/design/batches.md), ``"fair"`` and ``"rkey"`` (its fair-share key and
its rate key, after those, for the same reason: docs/guides/flow.md), ``"parents"`` (the
results of the tasks it depended on, by jid, added as it is released: ``Task(depends_on=...)``), ``"ckpt": 1``
(last: the task has a checkpointed state to resume from, lua/_ckpt.lua) and ``"trace"``
(the W3C ``traceparent`` of the request that
enqueued it, when hooks trace: :mod:`fencekit.hooks`), so a task that sets none of them is encoded and decoded
exactly as before.

``params`` must be plain JSON (dicts with ``str`` keys, lists, tuples, ``str``,
``int``, finite ``float``, ``bool``, ``None``): anything else is refused at
enqueue with :class:`~fencekit.errors.PayloadError` rather than silently
converted, and so is an envelope larger than the configured maximum. Decoding
checks every field and names what is wrong, so a bad task can be kept as a
dead letter with its reason (I7 of docs/design.md).
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, NamedTuple

import orjson

from fencekit._redis.keys import JID_RULE, is_jid
from fencekit.errors import PayloadError

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "Envelope",
    "PlainEnvelope",
    "check_params",
    "decode",
    "encode",
    "is_timeout",
    "peek_jid",
    "run_number",
]

DEFAULT_MAX_PAYLOAD = 1 << 20  # 1 MiB per envelope
MAX_TRACE = 512  # characters of a carried trace context (a traceparent is 55)
_MAX_DEPTH = 64
_MIN_INT, _MAX_INT = -(2**63), 2**64 - 1
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = -5, 5, 0
MAX_CKEY = 200


class Envelope(NamedTuple):
    """A decoded task as stored in Redis (a NamedTuple: decoding builds one per claimed task)."""

    jid: str
    queue: str
    operation: str
    params: dict[str, Any]
    attempt: int
    enqueued_at: int
    timeout: float | None = None
    expires_at: int | None = None
    keep: int | None = None
    unique: str | None = None
    trace: str | None = None
    priority: int = DEFAULT_PRIORITY
    ckey: str | None = None
    batch: str | None = None
    parents: dict[str, Any] | None = None
    ckpt: bool = False
    fair: str | None = None
    rkey: str | None = None

    def encode(self) -> bytes:
        return self.next_attempt(self.attempt)

    def next_attempt(self, attempt: int) -> bytes:
        """The envelope of another attempt of the same task."""
        return encode(
            self.jid,
            self.queue,
            self.operation,
            self.params,
            attempt,
            self.enqueued_at,
            timeout=self.timeout,
            expires_at=self.expires_at,
            keep=self.keep,
            unique=self.unique,
            trace=self.trace,
            priority=self.priority,
            ckey=self.ckey,
            batch=self.batch,
            parents=self.parents,
            ckpt=self.ckpt,
            fair=self.fair,
            rkey=self.rkey,
        )


class PlainEnvelope(Envelope):
    """An envelope without optional fields: what decoding most tasks gives (one type check tells)."""

    __slots__ = ()


def run_number(attempt: int) -> int:
    """The attempt number fencekit shows for a run: 1 for the first run, 2 for the first retry, ...

    The one definition every view uses (log lines, ``JobInfo.attempt`` and so
    the CLI and its JSON, the admin pages, ``JobEvent.attempt`` for hooks and
    OTel). The task's own field ``attempt`` (``Task``, the envelope,
    ``current_job().attempt``) counts the runs that already failed, as the
    seed defines it: the retry delay is ``1s * 1.5 ** attempt``.
    """
    return attempt + 1


def check_params(params: object, label: str = "params") -> None:
    """Refuse anything that is not plain, finite JSON (orjson would convert it).

    The common case -- plain JSON -- is one walk that builds no strings; only a
    refusal walks again to name the offending path.
    """
    if not _plain(params, 0):
        _refuse(params, label, 0)


def _plain(value: object, depth: int) -> bool:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return _MIN_INT <= value <= _MAX_INT  # type: ignore[operator]
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    if depth >= _MAX_DEPTH:
        return False
    # Loops, not all(<generator>): this runs for every task claimed, and the generator costs more.
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]  # noqa: SIM110
            if type(key) is not str or not _plain(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:  # type: ignore[attr-defined]  # noqa: SIM110
            if not _plain(item, depth + 1):
                return False
        return True
    return False


def _refuse(params: object, path: str, depth: int) -> None:
    """Raise the PayloadError naming where ``params`` is not plain JSON (the slow, precise walk)."""
    if depth > _MAX_DEPTH:
        raise PayloadError(f"{path}: nested deeper than {_MAX_DEPTH} levels")
    if params is None or isinstance(params, (str, bool)):
        return
    if isinstance(params, int):
        if not _MIN_INT <= params <= _MAX_INT:
            raise PayloadError(f"{path}: {params} does not fit in 64 bits (pass big numbers as strings)")
        return
    if isinstance(params, float):
        if not math.isfinite(params):
            raise PayloadError(f"{path}: {params!r} is not valid JSON")
        return
    if isinstance(params, dict):
        for key, value in params.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path}: keys must be str, got {type(key).__name__} {key!r}")
            _refuse(value, f"{path}[{key!r}]", depth + 1)
        return
    if isinstance(params, (list, tuple)):
        for index, value in enumerate(params):
            _refuse(value, f"{path}[{index}]", depth + 1)
        return
    raise PayloadError(
        f"{path}: {type(params).__name__} is not JSON; pass str, int, float, bool, None, "
        "lists and dicts (e.g. a datetime as an ISO string)"
    )


def encode(
    jid: str,
    queue: str,
    operation: str,
    params: dict[str, Any],
    attempt: int,
    enqueued_at: int,
    *,
    timeout: float | None = None,
    expires_at: int | None = None,
    keep: int | None = None,
    unique: str | None = None,
    trace: str | None = None,
    priority: int = DEFAULT_PRIORITY,
    ckey: str | None = None,
    batch: str | None = None,
    parents: dict[str, Any] | None = None,
    ckpt: bool = False,
    fair: str | None = None,
    rkey: str | None = None,
) -> bytes:
    """Encode an envelope (:func:`check_params` ran at enqueue, or at decode)."""
    data: dict[str, Any]
    if ckey is not None or batch is not None or fair is not None or rkey is not None:
        # after the jid (and priority): the scripts' anchored matches (lua/_prio.lua, lua/_note.lua)
        head: dict[str, Any] = {"jid": jid}
        if priority != DEFAULT_PRIORITY:
            head["priority"] = priority
        if ckey is not None:
            head["ckey"] = ckey
        if batch is not None:
            head["batch"] = batch
        if fair is not None:
            head["fair"] = fair
        if rkey is not None:
            head["rkey"] = rkey
        data = {
            **head,
            "queue": queue,
            "operation": operation,
            "params": params,
            "attempt": attempt,
            "enqueued_at": enqueued_at,
        }
    elif priority == DEFAULT_PRIORITY:
        data = {
            "jid": jid,
            "queue": queue,
            "operation": operation,
            "params": params,
            "attempt": attempt,
            "enqueued_at": enqueued_at,
        }
    else:  # right after the jid: the scripts' anchored match (lua/_prio.lua)
        data = {
            "jid": jid,
            "priority": priority,
            "queue": queue,
            "operation": operation,
            "params": params,
            "attempt": attempt,
            "enqueued_at": enqueued_at,
        }
    if timeout is not None:
        data["timeout"] = timeout
    if expires_at is not None:
        data["expires_at"] = expires_at
    if keep is not None:
        data["keep"] = keep
    if unique is not None:
        data["unique"] = unique
    if trace is not None:
        data["trace"] = trace
    if parents is not None:
        data["parents"] = parents
    if ckpt:  # last: the scripts find it as the envelope's end (lua/_ckpt.lua)
        data["ckpt"] = 1
    try:
        return orjson.dumps(data)
    except TypeError as exc:
        raise PayloadError(f"task {jid} cannot be encoded: {exc}") from None


def decode(raw: bytes | str) -> Envelope:
    """Decode and check a stored envelope; :class:`PayloadError` says what is wrong."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"payload is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PayloadError(f"payload must be a JSON object, got {type(data).__name__}")
    try:
        jid = data["jid"]
        queue = data["queue"]
        operation = data["operation"]
        params = data["params"]
    except KeyError as exc:
        raise PayloadError(f"payload lacks the field {exc.args[0]!r}") from None
    attempt = data.get("attempt", 0)
    enqueued_at = data.get("enqueued_at", 0)
    if not is_jid(jid):
        raise PayloadError(f"field 'jid' must be {JID_RULE}")
    if not isinstance(queue, str) or not queue:
        raise PayloadError("field 'queue' must be a non-empty string")
    if not isinstance(operation, str) or not operation:
        raise PayloadError("field 'operation' must be a non-empty string")
    if not isinstance(params, dict):
        raise PayloadError(f"field 'params' must be an object, got {type(params).__name__}")
    if type(attempt) is not int or attempt < 0:
        raise PayloadError("field 'attempt' must be a non-negative integer")
    if type(enqueued_at) is not int:
        raise PayloadError("field 'enqueued_at' must be an integer (ms)")
    check_params(params)  # e.g. deeper than we could encode again for a retry
    optional = len(data) - 4 - ("attempt" in data) - ("enqueued_at" in data)
    if not optional:  # the fields every envelope has, no optional one (the common case)
        return PlainEnvelope(jid, queue, operation, params, attempt, enqueued_at)
    keep = data.get("keep")
    if keep is not None and (type(keep) is not int or keep <= 0):
        raise PayloadError("field 'keep' must be a positive integer (ms)")
    if optional == 1 and keep is not None:  # the default Client's task: only its record's retention
        return Envelope(jid, queue, operation, params, attempt, enqueued_at, None, None, keep)
    timeout = data.get("timeout")
    expires_at = data.get("expires_at")
    if timeout is not None and not is_timeout(timeout):
        raise PayloadError("field 'timeout' must be a positive, finite number of seconds")
    if expires_at is not None and type(expires_at) is not int:
        raise PayloadError("field 'expires_at' must be an integer (Unix ms)")
    unique = data.get("unique")
    if unique is not None and not is_jid(unique):
        raise PayloadError(f"field 'unique' must be a unique key: {JID_RULE}")
    trace = data.get("trace")
    if trace is not None and not (isinstance(trace, str) and 0 < len(trace) <= MAX_TRACE):
        raise PayloadError(f"field 'trace' must be a trace context: a string of 1 to {MAX_TRACE} characters")
    priority = data.get("priority", DEFAULT_PRIORITY)
    if not is_priority(priority):
        raise PayloadError(f"field 'priority' must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}")
    ckey = data.get("ckey")
    if ckey is not None and not is_ckey(ckey):
        raise PayloadError(f"field 'ckey' must be a concurrency key: {CKEY_RULE}")
    batch = data.get("batch")
    if batch is not None and not is_jid(batch):
        raise PayloadError(f"field 'batch' must be a batch id: {JID_RULE}")
    parents = data.get("parents")
    if parents is not None and not isinstance(parents, dict):
        raise PayloadError("field 'parents' must be an object of the parents' results by jid")
    ckpt = data.get("ckpt")
    if ckpt is not None and ckpt != 1:
        raise PayloadError("field 'ckpt' must be 1 (the task has a checkpointed state)")
    fair, rkey = data.get("fair"), data.get("rkey")
    if fair is not None and not is_ckey(fair):
        raise PayloadError(f"field 'fair' must be a fair-share key: {CKEY_RULE}")
    if rkey is not None and not is_ckey(rkey):
        raise PayloadError(f"field 'rkey' must be a rate key: {CKEY_RULE}")
    return Envelope(
        jid,
        queue,
        operation,
        params,
        attempt,
        enqueued_at,
        timeout,
        expires_at,
        keep,
        unique,
        trace,
        priority,
        ckey,
        batch,
        parents,
        ckpt == 1,
        fair,
        rkey,
    )


CKEY_RULE = f"1 to {MAX_CKEY} printable characters without whitespace, quotes or backslashes"


def is_ckey(value: object) -> bool:
    """True for a usable concurrency key (the claim script reads it with a plain Lua pattern)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_CKEY
        and value.isprintable()
        and not any(c.isspace() or c in '"\\' for c in value)
    )


def is_priority(value: object) -> bool:
    """True for a usable priority: an ``int`` (not a bool) from MIN_PRIORITY to MAX_PRIORITY."""
    return type(value) is int and MIN_PRIORITY <= value <= MAX_PRIORITY


MAX_SECONDS = 1e10
"""Every duration a user gives is below this many seconds (about 317 years): its milliseconds
must stay an exact integer score and a datetime (NaN and infinities are refused with it)."""


def seconds_in(value: object, label: str, *, zero: bool) -> float:
    """The seconds of a number or a ``timedelta``, finite, from 0 (``zero``) or above 0, below
    :data:`MAX_SECONDS`; :class:`PayloadError` names ``label`` and the range otherwise.

    The one rule of every duration at an entrance (``delay``, ``timeout``,
    ``expires``, ``keep_result``, ``unique_for``).
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if type(seconds) in (int, float) and (seconds >= 0 if zero else seconds > 0) and seconds < MAX_SECONDS:  # type: ignore[operator]
        return float(seconds)  # type: ignore[arg-type]
    low = "from 0" if zero else "above 0"
    raise PayloadError(
        f"{label} must be a number of seconds or a timedelta, {low} and below 1e10 (about 317 years), "
        f"got {value!r}"
    )


def is_timeout(value: object) -> bool:
    """True for a usable timeout: a positive ``int`` or ``float`` of seconds below :data:`MAX_SECONDS`."""
    return type(value) in (int, float) and 0 < value < MAX_SECONDS  # type: ignore[operator]


def peek_jid(raw: bytes | str) -> str | None:
    """The jid of a possibly broken envelope, if it holds a valid one (for logs and dead letters)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    jid = data.get("jid") if isinstance(data, dict) else None
    return jid if is_jid(jid) else None
