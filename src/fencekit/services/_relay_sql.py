"""The relay's database side: take committed outbox rows, delete them, listen for new ones.

Synchronous SQLAlchemy on the relay's own thread (one at a time: a batch's
connection is used by one thread only), driven by
:class:`fencekit.services.relay.Relay`. A batch is one transaction:

1. :meth:`OutboxSql.take` -- ``SELECT ... ORDER BY id LIMIT n FOR UPDATE SKIP
   LOCKED``: the oldest committed rows no other relay holds (rows of
   uncommitted transactions are invisible; several relays share the rows);
2. the relay pushes them to Redis;
3. :meth:`OutboxSql.delete` -- ``DELETE`` them and ``COMMIT``; or
   :meth:`OutboxSql.abandon` -- ``ROLLBACK``, the rows stay for the next batch.

A relay that dies between 2 and 3 leaves its rows (its connection closes, the
locks go) to be pushed again: the push dedupes them by jid
(``outbox_push.lua``).

Every database failure becomes :class:`OutboxUnavailable`, which the relay's
loop backs off on and logs once, as the other loops do for Redis.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from fencekit.errors import ConfigError, OutboxUnavailable
from fencekit.produce.outbox import check_dialect, outbox_table

__all__ = ["BACKLOG_COUNT_CAP", "OutboxSql", "OutboxUnavailable", "Taken"]

T = TypeVar("T")

BACKLOG_COUNT_CAP = 100_000
"""The backlog is counted up to this many rows (a count over a huge table would scan it)."""


class Taken(NamedTuple):
    """One outbox row a batch holds."""

    id: int
    queue: str
    jid: str
    due_ms: int
    keep_ms: int
    envelope: str


def _guarded(what: str, action: Callable[[], T]) -> T:
    try:
        return action()
    except SQLAlchemyError as exc:
        raise OutboxUnavailable(f"outbox database: {what} failed: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class OutboxSql:
    """The outbox table of database ``url`` (see the module docstring)."""

    def __init__(self, url: str, table: str) -> None:
        try:
            self.engine = sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=0)
        except (SQLAlchemyError, ImportError) as exc:
            raise ConfigError(f"outbox_url: {_first_line(exc)}") from None
        dialect = self.engine.dialect
        if dialect.is_async:
            raise ConfigError(
                f"outbox_url names the asyncio driver {dialect.driver!r}: the relay needs a sync one "
                "(postgresql+psycopg://, mysql+pymysql://)"
            )
        self.dialect = check_dialect(dialect.name)
        self.table = outbox_table(table)
        self._batch: sa.Connection | None = None
        self._listener: Any = None  # the driver's own connection, LISTENing (PostgreSQL)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The database URL with its password hidden."""
        return self.engine.url.render_as_string(hide_password=True)

    def take(self, limit: int) -> list[Taken]:
        """Begin a batch: the oldest ``limit`` committed rows no other relay holds, locked."""
        with self._lock:
            if self._batch is not None:
                raise RuntimeError("the previous batch was neither deleted nor abandoned")
            t = self.table
            query = (
                sa.select(t.c.id, t.c.queue, t.c.jid, t.c.due_ms, t.c.keep_ms, t.c.envelope)
                .order_by(t.c.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )

            def take() -> list[Taken]:
                conn = self.engine.connect()
                try:
                    conn.begin()
                    rows = [Taken(*row) for row in conn.execute(query)]
                except BaseException:
                    conn.close()
                    raise
                if rows:
                    self._batch = conn
                else:
                    conn.rollback()
                    conn.close()
                return rows

            return _guarded("reading the outbox", take)

    def delete(self, ids: Sequence[int]) -> None:
        """End the batch: delete its rows and commit (OutboxUnavailable: the outcome is unknown,
        the rows may stay and be pushed again, deduped)."""
        with self._lock:
            conn, self._batch = self._batch, None
            if conn is None:
                raise RuntimeError("no batch to delete")
            t = self.table

            def delete() -> None:
                try:
                    conn.execute(sa.delete(t).where(t.c.id.in_(list(ids))))
                    conn.commit()
                finally:
                    conn.close()

            _guarded("deleting relayed rows", delete)

    def abandon(self) -> None:
        """End the batch without deleting: its rows stay, unlocked, for the next batch."""
        with self._lock:
            conn, self._batch = self._batch, None
        if conn is not None:
            try:
                conn.rollback()
                conn.close()
            except SQLAlchemyError:
                conn.invalidate()

    def backlog(self) -> tuple[int, float]:
        """(rows waiting, capped at :data:`BACKLOG_COUNT_CAP`; seconds the oldest has waited, on the
        database's clock, 0 when none)."""
        t = self.table
        capped = sa.select(t.c.id).limit(BACKLOG_COUNT_CAP).subquery()
        oldest = sa.select(t.c.created_at).order_by(t.c.id).limit(1).scalar_subquery()
        count = sa.select(sa.func.count()).select_from(capped).scalar_subquery()
        query = sa.select(count, oldest, sa.func.now())

        def read() -> tuple[int, float]:
            with self.engine.connect() as conn:
                count, first, now = conn.execute(query).one()
            if first is None:
                return int(count), 0.0
            if first.tzinfo is None and now.tzinfo is not None:  # MariaDB's DATETIME has no zone
                now = now.replace(tzinfo=None)
            return int(count), max(0.0, (now - first).total_seconds())

        return _guarded("counting the outbox", read)

    # -- PostgreSQL's LISTEN/NOTIFY -----------------------------------------------------

    @property
    def can_listen(self) -> bool:
        """PostgreSQL through psycopg2, or psycopg 3.2+ (``notifies(timeout=)``); else the relay polls."""
        if self.dialect != "postgresql":
            return False
        if self.engine.dialect.driver == "psycopg":
            import psycopg

            return tuple(int(p) for p in psycopg.__version__.split(".")[:2]) >= (3, 2)
        return self.engine.dialect.driver == "psycopg2"

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a NOTIFY on the table's channel (sent by ``enqueue_in`` at
        commit); True if one came. Listens first if not yet (a lost connection listens again)."""

        def wait() -> bool:
            if self._listener is None:
                raw = self.engine.raw_connection()
                raw.driver_connection.autocommit = True  # type: ignore[union-attr]
                cursor = raw.cursor()
                cursor.execute(f'LISTEN "{self.table.name}"')
                cursor.close()
                self._listener = raw
            try:
                return self._notified(self._listener.driver_connection, timeout)
            except BaseException:
                self._drop_listener()
                raise

        try:
            return _guarded("listening", wait)
        except Exception as exc:
            if isinstance(exc, OutboxUnavailable):
                raise
            raise OutboxUnavailable(f"outbox database: listening failed: {_first_line(exc)}") from exc

    def _notified(self, conn: Any, timeout: float) -> bool:
        if self.engine.dialect.driver == "psycopg":
            came = any(True for _ in conn.notifies(timeout=timeout, stop_after=1))
            if came:
                for _ in conn.notifies(timeout=0.0):  # the others of a burst: one batch takes them all
                    pass
            return came
        if not select.select([conn], [], [], timeout)[0]:  # psycopg2
            return False
        conn.poll()
        came = bool(conn.notifies)
        conn.notifies.clear()
        return came

    def _drop_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.invalidate()
            except Exception:  # it is being thrown away
                pass

    def close(self) -> None:
        """Abandon a batch in hand, stop listening, close the connections."""
        self.abandon()
        self._drop_listener()
        self.engine.dispose()
