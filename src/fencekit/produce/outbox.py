"""The transactional outbox, writing side: a task enqueued if and only if your SQL transaction commits.

``enqueue_in(session, task)`` inserts one row into the outbox table inside the
caller's transaction (SQLAlchemy ``Session``, ``Connection``, ``AsyncSession``
or ``AsyncConnection``); nothing reaches Redis until it commits, and a
rollback leaves nothing. The jid is fixed at the insert, so the caller can
store it with its own row. A relay (:mod:`fencekit.services.relay`, run by a
pool, a ``Server`` or ``fencekit relay``) moves committed rows to Redis.

The row holds the task already encoded (validated here, so a bad task fails
the call, not the relay; JSON text, which a plain ``SELECT`` shows), its due
time and record retention, and the queue the relay pushes it to. On
PostgreSQL the insert also sends ``NOTIFY`` on a channel named after the
table, delivered when (and only if) the transaction commits, so a listening
relay moves the row at once. PostgreSQL and
MariaDB/MySQL (both have ``FOR UPDATE SKIP LOCKED``, which lets several relays
share the rows); another dialect is a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs import codec
from fencekit.jobs.task import Task, unix_ms
from fencekit.settings import DEFAULT_OUTBOX_TABLE, ClientOptions, resolve
from fencekit.settings._checks import sql_identifier

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
    from sqlalchemy.orm import Session

__all__ = [
    "DIALECTS",
    "OutboxRow",
    "check_dialect",
    "create_outbox",
    "create_outbox_async",
    "enqueue_in",
    "outbox_columns",
    "outbox_row",
    "outbox_table",
]

DIALECTS = ("postgresql", "mysql", "mariadb")
_tables: dict[str, sa.Table] = {}


class OutboxRow(NamedTuple):
    """One outbox row's values (the id and the insert time are the database's)."""

    queue: str
    jid: str
    due_ms: int
    """Unix ms the task is due (its delay or ``at``), 0 for at once."""
    keep_ms: int
    """Retention of its record in ms, 0 for no record."""
    envelope: str
    """The encoded task (JSON text: readable with a plain ``SELECT``)."""


def check_dialect(name: str) -> str:
    """``name`` if the outbox runs on that dialect, else a ConfigError saying which do."""
    if name not in DIALECTS:
        raise ConfigError(
            f"the outbox needs PostgreSQL or MariaDB/MySQL (FOR UPDATE SKIP LOCKED), not {name!r}"
        )
    return name


def outbox_columns() -> list[sa.Column[Any]]:
    """The outbox table's columns, new objects each call (for a ``Table`` or Alembic's ``create_table``)."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import mysql

    return [
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("jid", sa.String(200), nullable=False),
        sa.Column("due_ms", sa.BigInteger(), nullable=False),
        sa.Column("keep_ms", sa.BigInteger(), nullable=False),
        sa.Column(  # TEXT on PostgreSQL; LONGTEXT on MariaDB/MySQL (a TEXT holds 64 KiB only)
            "envelope",
            sa.Text().with_variant(
                mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
            ),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    ]


def outbox_table(name: str = DEFAULT_OUTBOX_TABLE, metadata: sa.MetaData | None = None) -> sa.Table:
    """The outbox :class:`~sqlalchemy.Table` named ``name`` (one object per name unless
    ``metadata`` is given: pass your own to create it with your other tables)."""
    import sqlalchemy as sa

    try:
        sql_identifier(name)
    except ValueError as exc:
        raise ConfigError(f"the outbox table must {exc}") from None
    if metadata is None and name in _tables:
        return _tables[name]
    table = sa.Table(name, metadata if metadata is not None else sa.MetaData(), *outbox_columns())
    if metadata is None:
        _tables[name] = table
    return table


def create_outbox(engine: Engine | Connection, table: str = DEFAULT_OUTBOX_TABLE) -> sa.Table:
    """Create the outbox table (if it does not exist) with ``engine``; returns it.

    The Alembic form is :func:`fencekit.integrations.sql.alembic.create_outbox_table`, the
    Django one :func:`fencekit.integrations.django.create_outbox_operation`.
    """
    check_dialect(engine.dialect.name)
    created = outbox_table(table)
    created.create(engine, checkfirst=True)
    return created


def outbox_row(
    task: Task,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    keep_result: float | None = None,
    max_payload: int | None = None,
) -> OutboxRow:
    """Validate and encode ``task`` into its row (PayloadError for a bad one; its jid is set).

    ``keep_result`` and ``max_payload`` default to the settings (``FENCEKIT_KEEP_RESULT`` ...),
    as a ``Client``'s do.
    """
    if not isinstance(task, Task):
        raise PayloadError(f"enqueue_in takes a Task, got {type(task).__name__}")
    if task.unique_key is not None or task.depends_on is not None or task.debounce_key is not None:
        raise PayloadError(
            "the outbox takes no unique_key, depends_on or debounce_key task (its jid already makes "
            "it once): "
            f"task {task.queue}/{task.operation}"
        )
    if delay is not None and at is not None:
        raise PayloadError("give delay or at, not both")
    if keep_result is None or max_payload is None:
        settings = resolve(ClientOptions, {}, owner="enqueue_in")
        keep_result = settings["keep_result"] if keep_result is None else keep_result
        max_payload = settings["max_payload"] if max_payload is None else max_payload
    envelope = task.envelope(max_payload, keep_result)
    assert task.jid is not None  # envelope() set it
    due_ms = 0
    if at is not None:
        due_ms = unix_ms(at, "at")
    elif delay is not None:
        due_ms = time.time_ns() // 1_000_000 + round(codec.seconds_in(delay, "delay", zero=True) * 1000)
    return OutboxRow(task.queue, task.jid, due_ms, task.keep_ms(keep_result) or 0, envelope.decode())


def _statements(dialect: str, table: sa.Table, row: OutboxRow) -> list[sa.Executable]:
    """The row's INSERT; on PostgreSQL it also returns ``pg_notify`` (one round trip, not two:
    the database folds a transaction's equal notifications into one, sent at its commit)."""
    import sqlalchemy as sa

    insert = sa.insert(table).values(row._asdict())
    if check_dialect(dialect) == "postgresql":
        insert = insert.returning(sa.func.pg_notify(table.name, ""))
    return [insert]


def _dialect(where: Any) -> str:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    if isinstance(where, (Session, AsyncSession)):
        return str(where.get_bind().dialect.name)
    if isinstance(where, (Connection, AsyncConnection)):
        return str(where.dialect.name)
    raise TypeError(
        "enqueue_in writes through a sqlalchemy Session, Connection, AsyncSession or AsyncConnection "
        f"(its transaction decides), got {type(where).__name__}"
    )


@overload
def enqueue_in(
    where: AsyncSession | AsyncConnection,
    task: Task,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    table: str | None = None,
    keep_result: float | None = None,
    max_payload: int | None = None,
) -> Coroutine[Any, Any, str]: ...
@overload
def enqueue_in(
    where: Session | Connection,
    task: Task,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    table: str | None = None,
    keep_result: float | None = None,
    max_payload: int | None = None,
) -> str: ...
def enqueue_in(
    where: Session | Connection | AsyncSession | AsyncConnection,
    task: Task,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    table: str | None = None,
    keep_result: float | None = None,
    max_payload: int | None = None,
) -> str | Coroutine[Any, Any, str]:
    """Write ``task`` into the outbox inside ``where``'s transaction; returns its jid (awaitable
    for an ``AsyncSession``/``AsyncConnection``).

    The task is enqueued once the transaction commits (a relay moves it to Redis, with its jid
    as the dedupe key); a rollback leaves nothing. ``delay``/``at`` as ``Client.enqueue``'s;
    ``table``, ``keep_result`` and ``max_payload`` default to the settings (``outbox_table``
    ... or ``FENCEKIT_OUTBOX_TABLE`` ...), as a ``Client``'s do; the table must be the relay's.
    """
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if table is None or keep_result is None or max_payload is None:
        settings = resolve(ClientOptions, {}, owner="enqueue_in")  # once: it reads the environment
        table = settings["outbox_table"] if table is None else table
        keep_result = settings["keep_result"] if keep_result is None else keep_result
        max_payload = settings["max_payload"] if max_payload is None else max_payload
    row = outbox_row(task, delay=delay, at=at, keep_result=keep_result, max_payload=max_payload)
    statements = _statements(_dialect(where), outbox_table(table), row)
    jid = task.jid
    assert jid is not None
    if isinstance(where, (AsyncSession, AsyncConnection)):
        return _write_async(where, statements, jid)
    for statement in statements:
        where.execute(statement)
    return jid


async def _write_async(
    where: AsyncSession | AsyncConnection, statements: list[sa.Executable], jid: str
) -> str:
    for statement in statements:
        await where.execute(statement)
    return jid


def create_outbox_async(
    engine: AsyncEngine, table: str = DEFAULT_OUTBOX_TABLE
) -> Coroutine[Any, Any, sa.Table]:
    """:func:`create_outbox` with an ``AsyncEngine``."""

    async def create() -> sa.Table:
        check_dialect(engine.dialect.name)
        created = outbox_table(table)
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: created.create(sync, checkfirst=True))
        return created

    return create()
