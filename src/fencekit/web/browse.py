"""Browsing one queue's tasks on the admin page: lists, pages, filters, each read bounded.

``/admin/queue?queue=Q&list=L`` shows one list of queue ``Q`` a page at a
time (:data:`PAGE` rows), ``L`` one of :data:`LISTS`:

- ``pending``: waiting to be claimed, in claim order of the priorities
  (highest first), newest first within one priority;
- ``scheduled``: due later (retries, delays), soonest first -- the order
  they will run in;
- ``running``: in the in-flight hashes of the registered consumers, longest
  running first;
- ``finished`` and ``failed``: the kept records, newest first: the finished
  list (``keep_finished``) holds every task that ended with a record (done,
  dead, cancelled, expired), the failed one those that failed for good
  (``keep_failed``);
- ``dead``: dead letters, newest first.

Without a filter a page is a few range reads whatever the list's length.
Filters -- the operation, a jid prefix, text in the params, the result or the
error -- are applied while reading the list from its start in chunks of
:data:`CHUNK`, at most :data:`SCAN_LIMIT` entries per request: the page says
when it stopped there, so a filter over a huge list answers in bounded time
(and says "narrow the filter") instead of reading everything.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis.asyncio

from fencekit._redis.keys import KeySpace, QueueKeys
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, arun_batch, cmd
from fencekit.consume._settle import delivery_token
from fencekit.errors import PayloadError
from fencekit.jobs import codec, records

__all__ = [
    "BULK_ACTIONS",
    "BULK_LIMIT",
    "CHUNK",
    "LISTS",
    "PAGE",
    "SCAN_LIMIT",
    "Filter",
    "Page",
    "Row",
    "matching",
    "read_page",
]

LISTS = ("pending", "scheduled", "running", "finished", "failed", "dead")
PAGE = 50
CHUNK = 500
SCAN_LIMIT = 10_000
MAX_PAGE = 100_000
PRIORITIES = tuple(range(codec.MAX_PRIORITY, codec.MIN_PRIORITY - 1, -1))  # claim order
DETAIL = 160  # characters of params / result / error shown in a row


@dataclass(frozen=True, slots=True)
class Row:
    """One task of a list, as a row: its time is the list's (enqueued, due, started, finished, died)."""

    jid: str | None
    operation: str | None
    attempt: int  # the run's number from 1 (codec.run_number); 0: unknown
    at: float | None
    detail: str
    token: int | None = None
    consumer: str | None = None
    dead_id: str | None = None
    priority: int = 0
    status: str = ""  # of a record (finished: done, dead, cancelled, expired ...)
    text: str = ""  # what a text filter searches: params, result, error, reason


@dataclass(frozen=True, slots=True)
class Filter:
    """What a page keeps: an operation (exact), a jid prefix, text (case-insensitive) in its row."""

    operation: str = ""
    jid: str = ""
    text: str = ""

    def __bool__(self) -> bool:
        return bool(self.operation or self.jid or self.text)

    def keeps(self, row: Row) -> bool:
        if self.operation and row.operation != self.operation:
            return False
        if self.jid and not (row.jid or "").startswith(self.jid):
            return False
        return not self.text or self.text.casefold() in row.text.casefold()


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: its rows, and what a reader needs to page on."""

    queue: str
    list: str
    number: int
    rows: tuple[Row, ...]
    total: int
    """Entries in the list (before any filter)."""
    more: bool
    """A next page exists (with a filter: another match was seen)."""
    scanned: int
    """Entries read to build the page."""
    cut: bool
    """The filter's scan stopped at :data:`SCAN_LIMIT`: more may match further on."""
    seconds: float
    """How long the read took."""


Reader = Callable[[int, int], Awaitable[list[Row]]]


async def read_page(
    client: redis.asyncio.Redis,
    keys: KeySpace,
    queue: str,
    which: str,
    number: int = 0,
    where: Filter | None = None,
) -> Page:
    """Page ``number`` (from 0) of list ``which`` of ``queue``; raises StoreError, ValueError."""
    if which not in LISTS:
        raise ValueError(f"list must be one of {', '.join(LISTS)}")
    if not 0 <= number <= MAX_PAGE:
        raise ValueError(f"page must be from 0 to {MAX_PAGE}")
    started = time.perf_counter()
    lister = _Lister(client, keys, queue)
    total, reader = await lister.open(which)
    where = where or Filter()
    if not where:
        start = number * PAGE
        rows = await reader(start, min(total, start + PAGE)) if start < total else []
        return Page(queue, which, number, tuple(rows), total, start + PAGE < total, len(rows), False,
                    time.perf_counter() - started)  # fmt: skip
    skip, scanned = number * PAGE, 0
    kept: list[Row] = []
    while scanned < min(total, SCAN_LIMIT) and len(kept) <= PAGE:
        chunk = await reader(scanned, min(total, scanned + CHUNK, SCAN_LIMIT))
        scanned = min(total, scanned + CHUNK, SCAN_LIMIT)
        for row in chunk:
            if where.keeps(row):
                if skip:
                    skip -= 1
                else:
                    kept.append(row)
    cut = scanned >= SCAN_LIMIT and total > SCAN_LIMIT and len(kept) <= PAGE
    return Page(queue, which, number, tuple(kept[:PAGE]), total, len(kept) > PAGE, scanned, cut,
                time.perf_counter() - started)  # fmt: skip


class _Lister:
    """The count and the range reader of each list of one queue."""

    def __init__(self, client: redis.asyncio.Redis, keys: KeySpace, queue: str) -> None:
        self.client = client
        self.keys = keys
        self.queue = queue
        self.qk: QueueKeys = keys.queue(queue)

    async def _batch(self, ops: Sequence[Any]) -> list[Any]:
        return list(await arun_batch(self.client, Batch(list(ops))))

    async def open(self, which: str) -> tuple[int, Reader]:
        opener = cast("Callable[[], Awaitable[tuple[int, Reader]]]", getattr(self, "_" + which))
        return await opener()

    # pending: one list per priority, read in claim order ----------------------------------
    async def _pending(self) -> tuple[int, Reader]:
        lists = [self.qk.pending if p == 0 else f"{self.qk.pending}:{p}" for p in PRIORITIES]
        lengths = [int(n) for n in await self._batch([cmd("llen", key) for key in lists])]

        async def read(start: int, stop: int) -> list[Row]:
            ops, spans, offset = [], [], 0
            for key, priority, length in zip(lists, PRIORITIES, lengths):
                lo, hi = max(start, offset), min(stop, offset + length)
                if lo < hi:
                    ops.append(cmd("lrange", key, lo - offset, hi - offset - 1))
                    spans.append(priority)
                offset += length
            rows: list[Row] = []
            for priority, entries in zip(spans, await self._batch(ops) if ops else []):
                rows.extend(_envelope_row(raw, None, priority) for raw in entries)
            return rows

        return sum(lengths), read

    # scheduled: the ZSET by due time ------------------------------------------------------------
    async def _scheduled(self) -> tuple[int, Reader]:
        (total,) = await self._batch([cmd("zcard", self.qk.scheduled)])

        async def read(start: int, stop: int) -> list[Row]:
            (entries,) = await self._batch(
                [cmd("zrange", self.qk.scheduled, start, stop - 1, withscores=True)]
            )
            return [_envelope_row(raw, float(score) / 1000, None) for raw, score in entries]

        return int(total), read

    # running: every registered consumer's in-flight hash of this queue -------------------------
    async def _running(self) -> tuple[int, Reader]:
        (ids,) = await self._batch([cmd("hkeys", self.keys.consumers)])
        consumers = sorted(as_text(i) for i in ids)
        hashes = (
            await self._batch([cmd("hgetall", self.qk.inflight(c)) for c in consumers]) if consumers else []
        )
        rows: list[Row] = []
        for consumer, entries in zip(consumers, hashes):
            for field, raw in entries.items():
                token = delivery_token(field)
                if token is not None:
                    row = _envelope_row(raw, token / 1_000_000, None)
                    rows.append(_with(row, token=token, consumer=consumer))
        rows.sort(key=lambda r: r.token or 0)  # the oldest claim first: the longest running

        async def read(start: int, stop: int) -> list[Row]:
            return rows[start:stop]

        return len(rows), read

    # finished and failed: lists of record keys, newest first ------------------------------------
    async def _finished(self) -> tuple[int, Reader]:
        return await self._records(self.qk.finished)

    async def _failed(self) -> tuple[int, Reader]:
        return await self._records(self.qk.failed)

    async def _records(self, key: str) -> tuple[int, Reader]:
        (total,) = await self._batch([cmd("llen", key)])
        prefix = len(self.qk.job(""))

        async def read(start: int, stop: int) -> list[Row]:
            (names,) = await self._batch([cmd("lrange", key, start, stop - 1)])
            names = [as_text(n) for n in names]
            hashes = await self._batch([cmd("hgetall", n) for n in names]) if names else []
            rows = []
            for name, values in zip(names, hashes):
                flat = [x for pair in values.items() for x in pair]
                info = records.parse(name[prefix:], self.queue, (flat, 0, ""))
                if info is not None:
                    rows.append(_record_row(info))
            return rows

        return int(total), read

    # dead letters: the index ZSET, newest first ----------------------------------------------------
    async def _dead(self) -> tuple[int, Reader]:
        (total,) = await self._batch([cmd("zcard", self.qk.dead_index)])

        async def read(start: int, stop: int) -> list[Row]:
            (ids,) = await self._batch([cmd("zrevrange", self.qk.dead_index, start, stop - 1)])
            ids = [as_text(i) for i in ids]
            if not ids:
                return []
            (values,) = await self._batch(
                [cmd("hmget", self.qk.dead, [x for i in ids for x in (i, f"{i}:why")])]
            )
            rows = []
            for n, dead_id in enumerate(ids):
                raw, why = values[2 * n], values[2 * n + 1]
                if raw is not None:
                    rows.append(_dead_row(dead_id, raw, why))
            return rows

        return int(total), read


def _with(row: Row, **changes: Any) -> Row:
    fields = {name: getattr(row, name) for name in Row.__slots__}
    return Row(**(fields | changes))


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL else text[: DETAIL - 1] + "…"


def _envelope_row(raw: bytes | str, at: float | None, priority: int | None) -> Row:
    """A row of an envelope (pending, scheduled, running); one that does not decode shows its bytes."""
    try:
        env = codec.decode(raw)
    except PayloadError as exc:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        return Row(codec.peek_jid(raw), None, 0, at, _clip(f"(not a task: {exc}) {text}"), text=text)
    params = orjson.dumps(env.params).decode()
    when = at if at is not None else env.enqueued_at / 1000 if env.enqueued_at else None
    return Row(env.jid, env.operation, codec.run_number(env.attempt), when, _clip(params),
               priority=priority if priority is not None else env.priority, text=params)  # fmt: skip


def _record_row(info: records.JobInfo) -> Row:
    if info.error is not None:
        shown = f"{info.error.type}: {info.error.message}"
        text = f"{shown}\n{info.error.traceback}"
    else:
        shown = text = orjson.dumps(info.result).decode() if info.result is not None else ""
    params = orjson.dumps(info.params).decode() if info.params is not None else ""
    return Row(info.jid, info.operation, info.attempt, info.finished_at, _clip(shown), token=info.token,
               status=info.status.value, text=f"{params}\n{text}")  # fmt: skip


def _dead_row(dead_id: str, raw: bytes | str, why: bytes | str | None) -> Row:
    try:
        meta = orjson.loads(why) if why else {}
    except orjson.JSONDecodeError:
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    reason = str(meta.get("reason", ""))
    row = _envelope_row(raw, float(meta.get("at", 0)) / 1000 or None, None)
    jid = row.jid or (meta.get("jid") if isinstance(meta.get("jid"), str) else None)
    return _with(row, jid=jid, dead_id=dead_id, detail=_clip(reason), text=f"{reason}\n{row.text}")


BULK_LIMIT = 1_000
"""Tasks one bulk action acts on at most (submit again for more)."""

BULK_ACTIONS: dict[str, tuple[str, ...]] = {
    "pending": ("cancel",),
    "scheduled": ("run-now", "cancel"),
    "running": ("cancel",),
    "finished": ("delete",),
    "failed": ("retry", "delete"),
    "dead": ("retry", "delete"),
}
"""What a bulk action may do to each list: cancel (a waiting task leaves its list), run now, retry,
delete (a kept record, or a dead letter, is forgotten)."""


async def matching(
    client: redis.asyncio.Redis, keys: KeySpace, queue: str, which: str, where: Filter
) -> tuple[list[Row], bool]:
    """The rows of list ``which`` that ``where`` keeps, from its start: at most :data:`BULK_LIMIT`,
    reading at most :data:`SCAN_LIMIT` entries; and whether more may match (cut short)."""
    if which not in LISTS:
        raise ValueError(f"list must be one of {', '.join(LISTS)}")
    total, reader = await _Lister(client, keys, queue).open(which)
    kept: list[Row] = []
    scanned, end = 0, min(total, SCAN_LIMIT)
    while scanned < end and len(kept) < BULK_LIMIT:
        for row in await reader(scanned, min(end, scanned + CHUNK)):
            if where.keeps(row) and len(kept) < BULK_LIMIT:
                kept.append(row)
        scanned = min(end, scanned + CHUNK)
    return kept, len(kept) >= BULK_LIMIT or (scanned < total and len(kept) < BULK_LIMIT)
