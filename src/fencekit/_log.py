"""Logging: the seed's stdout default, a batching line handler, and the per-job fast path.

Every job logs two INFO lines (started, completed). Through the standard
machinery each costs a ``LogRecord``, a formatter pass with a ``strftime``
and a write with a flush: about 7 µs, twice per job, against about 11 µs
for the whole no-op job. So:

- :class:`LineHandler` (what the pool, its children and the seed's default
  install) formats the time once per second, not per record, and writes the
  lines of one event-loop iteration in one ``write`` (in a thread without a
  running loop it writes at once, as ``StreamHandler`` does).
- :class:`JobLines` writes the per-job lines straight to that handler,
  without a ``LogRecord``, *only* while the line's sole destination is one
  :class:`LineHandler` with no filters; any other configuration (the
  application's own handlers, filters, levels) gets ordinary records.
- :func:`default_logger` keeps the seed's default (INFO lines on stdout when
  the application configured no logging), but steps aside the moment the
  application configures logging later (``basicConfig``, ``dictConfig``):
  from then on its records go to the application's handlers under the
  application's levels (it always propagates; it only had a handler and a
  level of its own while nothing else was configured).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import weakref
from collections.abc import Mapping
from typing import IO, Any

import orjson

__all__ = [
    "FORMAT",
    "TASK_FIELDS",
    "JobLines",
    "JsonFormatter",
    "LineFormatter",
    "LineHandler",
    "default_logger",
    "flush_all",
    "line_handler",
]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
BATCH_LINES = 1024
"""A batch is written early once it holds this many lines."""
RECHECK_S = 1.0
"""How often :class:`JobLines` looks again at where its lines go."""

_get_running_loop = asyncio._get_running_loop  # the C accessor: no exception when there is none
_handlers: weakref.WeakSet[LineHandler] = weakref.WeakSet()  # for flush_all; not kept alive
_job_lines: weakref.WeakSet[JobLines] = weakref.WeakSet()


class LineFormatter(logging.Formatter):
    """A ``Formatter`` whose default time stamp is formatted once per second."""

    def __init__(self, fmt: str = FORMAT) -> None:
        super().__init__(fmt)
        self._second = -1
        self._stamp = ""  # the second's part, as strftime gave it
        self._ms = -1
        self._ms_stamp = ""  # the whole stamp of millisecond _ms

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.stamp(record.created)

    def stamp(self, created: float) -> str:
        """``created`` as ``YYYY-mm-dd HH:MM:SS,mmm`` in local time, like ``Formatter``'s default."""
        ms = int(created * 1000)
        if ms != self._ms:
            second = ms // 1000
            if second != self._second:
                self._stamp = time.strftime(self.default_time_format, self.converter(second))
                self._second = second
            self._ms = ms
            self._ms_stamp = f"{self._stamp},{ms - second * 1000:03d}"
        return self._ms_stamp


TASK_FIELDS = ("jid", "queue", "operation", "attempt", "token", "duration")
"""What a task's log record carries (``extra=``), each a key of its JSON line (``log_format`` json)."""


class JsonFormatter(LineFormatter):
    """One JSON object per line (``--log-format json``): time (UTC, ISO 8601 with ms), level,
    logger, message, the task's :data:`TASK_FIELDS` when the record has them, and ``exc``, the
    traceback, in the same line."""

    def __init__(self) -> None:
        super().__init__()
        self.converter = time.gmtime
        self.default_time_format = "%Y-%m-%dT%H:%M:%S"

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: record.__dict__[k] for k in TASK_FIELDS if record.__dict__.get(k) is not None}
        line = self.line(record.created, record.levelname, record.name, record.getMessage(), fields)
        if record.exc_info or record.stack_info:
            data = orjson.loads(line)
            if record.exc_info:
                data["exc"] = self.formatException(record.exc_info)
            if record.stack_info:
                data["stack"] = self.formatStack(record.stack_info)
            line = orjson.dumps(data).decode()
        return line

    def head(self, created: float, level: str, name: str) -> str:
        """The line's start, up to the message: ``{"time":..,"level":..,"logger":..,``."""
        stamp = self.stamp(created).replace(",", ".")
        return f'{{"time":"{stamp}Z","level":"{level}","logger":{orjson.dumps(name).decode()},'

    def line(self, created: float, level: str, name: str, message: str, fields: Mapping[str, Any]) -> str:
        """The JSON line of one record (the per-job fast path builds the same from a cached head)."""
        return self.head(created, level, name) + _body(message, fields)


def _body(message: str, fields: Mapping[str, Any]) -> str:
    """``"message":..,<fields>}``: a JSON line's rest after its head."""
    return orjson.dumps({"message": message, **fields}, default=str).decode()[1:]


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A ``StreamHandler`` (stdout by default) that writes each loop iteration's lines at once.

    A line logged inside a running event loop is written at the start of the
    next iteration together with the others of its iteration (or when
    :data:`BATCH_LINES` are waiting); outside a loop it is written at once.
    :func:`flush_all` writes what is waiting (the pool calls it before
    ``os._exit``); ``logging.shutdown`` flushes it at interpreter exit.
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(sys.stdout if stream is None else stream)
        self.setFormatter(LineFormatter())
        self._lines: list[str] = []
        self._scheduled = False
        _handlers.add(self)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        # The per-job lines gathered for this handler (JobLines) happened first: they go first,
        # or a task's WARNING would be written before its own "started" line.
        for gathered in tuple(_job_lines):
            if gathered._pending and gathered._pending_to is self:
                gathered.hand_over()
        self.add(line)

    def add(self, line: str) -> None:
        """Queue one formatted line (without its newline) for writing."""
        loop = _get_running_loop()
        with self.lock:  # type: ignore[union-attr]
            lines = self._lines
            lines.append(line)
            if loop is None or len(lines) >= BATCH_LINES:
                self._write()
            elif not self._scheduled:
                self._scheduled = True
                loop.call_soon(self.flush)

    def add_many(self, lines: list[str]) -> None:
        """Write ``lines`` now, after any waiting ones (a batch :class:`JobLines` gathered)."""
        with self.lock:  # type: ignore[union-attr]
            self._lines.extend(lines)
            self._write()

    def flush(self) -> None:
        """Write the waiting lines in one write, then flush the stream."""
        with self.lock:  # type: ignore[union-attr]
            self._scheduled = False
            self._write()

    def _write(self) -> None:
        lines = self._lines
        try:
            if lines:
                self._lines = []
                self.stream.write("\n".join(lines) + "\n")
            if hasattr(self.stream, "flush"):
                self.stream.flush()
        except Exception:  # a closed or broken stream: logging's rule, never the caller's problem
            self.handleError(logging.makeLogRecord({"msg": f"{len(lines)} log line(s) could not be written"}))


class _StepAside(logging.Filter):
    """On a seed-default logger: once the application configures logging, give the logger back.

    Until then the logger has its own :class:`LineHandler` on stdout and level
    INFO. From the first record after ``basicConfig``/``dictConfig`` (or
    handlers added to an ancestor), the handler, the level and this filter are
    removed, so records propagate to the application's handlers under its
    levels -- that first record included.
    """

    def __init__(self, logger: logging.Logger, handler: LineHandler) -> None:
        super().__init__()
        self.logger = logger
        self.handler = handler

    def superseded(self) -> bool:
        """True (and the logger handed back) once the application configured logging."""
        if not _configured_above(self.logger):
            return False
        self.handler.flush()
        self.logger.removeFilter(self)
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(logging.NOTSET)
        return True

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.superseded():
            return True
        return record.levelno >= self.logger.getEffectiveLevel()


def line_handler(log_format: str = "text") -> LineHandler:
    """A :class:`LineHandler` on stdout writing ``log_format`` lines: text, or json (JsonFormatter)."""
    handler = LineHandler(sys.stdout)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    return handler


def _configured_above(logger: logging.Logger) -> bool:
    """Whether an ancestor of ``logger`` (the root included) has a handler."""
    parent = logger.parent
    while parent is not None:
        if parent.handlers:
            return True
        parent = parent.parent
    return False


def default_logger(name: str) -> logging.Logger:
    """Logger ``name``; while logging is unconfigured, its INFO lines go to stdout."""
    logger = logging.getLogger(name)
    if not logger.handlers and not _configured_above(logger):
        handler = LineHandler(sys.stdout)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.addFilter(_StepAside(logger, handler))
    return logger


def flush_all() -> None:
    """Write every line a :class:`JobLines` or :class:`LineHandler` holds (before ``os._exit``,
    which skips atexit, and before ``fork``)."""
    for lines in list(_job_lines):
        lines.hand_over()
    for handler in list(_handlers):
        handler.flush()


# A forked child would inherit the lines waiting in the parent's handlers and write them again.
os.register_at_fork(before=flush_all)


def _sole_destination(logger: logging.Logger, level: int) -> LineHandler | None:
    """The one LineHandler a record of ``level`` from ``logger`` would reach, if that is all it reaches."""
    if not logger.isEnabledFor(level):
        return None
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        for f in current.filters:
            if not isinstance(f, _StepAside) or f.superseded():
                return None
        found.extend(h for h in current.handlers if level >= h.level)
        if not current.propagate:
            break
        current = current.parent
    if len(found) != 1:
        return None
    (handler,) = found
    if not isinstance(handler, LineHandler) or handler.filters:
        return None
    if isinstance(handler.formatter, JsonFormatter):
        return handler
    if not isinstance(handler.formatter, LineFormatter) or handler.formatter._fmt != FORMAT:
        return None
    return handler


class JobLines:
    """The consumer's per-job INFO lines, as cheap as the logging configuration allows.

    :attr:`on` says whether INFO lines are wanted (the logger's level and
    ``logging.disable``), as of the last :meth:`refresh` -- the consumer
    refreshes once per turn, so a job pays an attribute read, not a level
    check; :meth:`wanted` refreshes and answers. :meth:`info` logs one line.
    While the only destination is a :class:`LineHandler` with our format,
    the line is formatted here and handed to it (no ``LogRecord``);
    otherwise it is an ordinary ``logger.info``. Where lines go is looked at
    again every :data:`RECHECK_S` seconds, so a handler the application adds
    later gets the lines from then on.
    """

    __slots__ = (
        "__weakref__",
        "_checked",
        "_guard",
        "_handler",
        "_head",
        "_head_ms",
        "_pending",
        "_pending_to",
        "_prefix",
        "logger",
        "on",
        "structured",
    )

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._prefix = f" INFO {logger.name}: "
        self._handler: LineHandler | None = None
        self._guard = next((f for f in logger.filters if isinstance(f, _StepAside)), None)
        self._checked = -RECHECK_S
        self._pending: list[str] = []  # this loop iteration's lines, handed over at the next
        self._pending_to: LineHandler | None = None
        self._head_ms = -1  # the millisecond of _head, a JSON line's start
        self._head = ""
        self.on = False
        self.structured = True  # whether info() uses its fields: not for our own text lines
        self.refresh()
        _job_lines.add(self)

    def refresh(self) -> None:
        """Read the logger's level again (and, every :data:`RECHECK_S`, where its lines go)."""
        self.on = self.logger.isEnabledFor(logging.INFO)
        now = time.time()
        if self.on and not 0.0 <= now - self._checked < RECHECK_S:
            self._checked = now
            self.hand_over()
            self._handler = handler = _sole_destination(self.logger, logging.INFO)
            self.structured = handler is None or isinstance(handler.formatter, JsonFormatter)

    def wanted(self) -> bool:
        """:meth:`refresh`, then :attr:`on`."""
        self.refresh()
        return self.on

    def info(self, msg: str, *args: Any, fields: dict[str, Any] | None = None) -> None:
        """Log ``msg % args`` at INFO (the caller looked at :attr:`on` first).

        ``fields`` (given when :attr:`structured`: the task's :data:`TASK_FIELDS`) go into the
        JSON line or the record. The dict is the caller's to give away: a JSON line sets its
        ``"message"`` key, which :func:`~fencekit.consume._outcomes.task_fields` puts first so
        the message comes right after the logger (a dict keeps a key's place when it is set).
        """
        handler = self._handler
        if handler is not None and self._guard is not None and _configured_above(self.logger):
            self._checked = -RECHECK_S  # the application configured logging just now
            self.refresh()
            handler = self._handler
        if handler is None:
            if fields is not None:
                fields.pop("message", None)  # a record's own attribute
            self.logger.info(msg, *args, stacklevel=2, extra=fields)
            return
        formatter = handler.formatter
        now = time.time()
        if isinstance(formatter, JsonFormatter):
            ms = int(now * 1000)
            if ms != self._head_ms:
                self._head_ms, self._head = ms, formatter.head(now, "INFO", self.logger.name)
            if fields is None:
                fields = {}
            fields["message"] = msg % args
            line = self._head + orjson.dumps(fields, default=str).decode()[1:]
        else:
            line = f"{formatter.stamp(now)}{self._prefix}{msg % args}"  # type: ignore[union-attr]
        pending = self._pending
        if not pending:
            loop = _get_running_loop()
            if loop is None:
                handler.add(line)
                return
            self._pending_to = handler
            loop.call_soon(self.hand_over)
        pending.append(line)
        if len(pending) >= BATCH_LINES:
            self.hand_over()

    def hand_over(self) -> None:
        """Give the lines gathered in this loop iteration to the handler (one write)."""
        pending = self._pending
        if pending and self._pending_to is not None:
            self._pending = []
            self._pending_to.add_many(pending)
