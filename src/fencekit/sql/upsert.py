"""``fenced_upsert``: insert-or-update by a business key, one statement, fenced.

PostgreSQL::

    INSERT INTO t (<key>, <values>, fence_token) VALUES (...)
    ON CONFLICT (<key>) DO UPDATE SET <values> = excluded.<values>, fence_token = excluded.fence_token
    WHERE t.fence_token IS NULL OR t.fence_token <= excluded.fence_token
    RETURNING (xmax = 0)

No row returned is ``stale``; ``xmax = 0`` tells a fresh insert from an update.

MySQL / MariaDB::

    INSERT INTO t (...) VALUES (...) ON DUPLICATE KEY UPDATE
      col = CASE WHEN t.fence_token IS NULL OR t.fence_token <= VALUES(fence_token)
                 THEN VALUES(col) ELSE col END, ...,
      fence_token = CASE ... END                      -- assigned LAST

MySQL evaluates the assignments left to right and a later one sees the
columns an earlier one set, so the fence column must come last or the value
columns would compare against the new fence. ``ON DUPLICATE KEY`` fires on
*any* unique key of the table, so ``key`` should be its only one besides an
auto-increment id. The affected-row count is 2 for an update; SQLAlchemy's
MySQL drivers set ``CLIENT_FOUND_ROWS``, under which an insert and a row left
unchanged both count 1, so on that path one locking read of the stored fence
in the same transaction tells ``stale`` (a larger fence) from ``inserted``.
An equal-token upsert that changes no value reads as ``inserted`` there.

Other dialects get a :class:`~fencekit.errors.ConfigError`: an upsert is not
portable SQL (``fenced_update`` is).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, cast, overload

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from fencekit._fencing import TokenLike, UpsertOutcome, describe, token_value
from fencekit.errors import ConfigError, FencedOutError
from fencekit.sql import _target

_POSTGRES = {"postgresql"}
_MYSQL = {"mysql", "mariadb"}


class _Plan:
    def __init__(
        self,
        executor: _target.Executor,
        table_or_model: Any,
        token: TokenLike,
        key: Mapping[str, Any],
        values: Mapping[str, Any],
        fence_column: str,
    ) -> None:
        table = _target.resolve_table(table_or_model)
        fence = _target.fence(table, fence_column)
        self.token = token
        self.value = token_value(token)
        self.table = table
        self.fence_column = fence_column
        keys = _target.check_values(table, key, fence_column, "key")
        payload = _target.check_values(table, values, fence_column, "values")
        both = sorted(set(keys) & set(payload))
        if both:
            raise ConfigError(f"values must not name the key columns: {', '.join(map(repr, both))}")
        row = {**keys, **payload, fence_column: self.value}
        self.dialect = _target.dialect_name(executor, table)
        self.probe = (
            sa.select(fence)
            .where(sa.and_(*(table.c[name] == value for name, value in keys.items())))
            .with_for_update()
        )
        if self.dialect in _POSTGRES:
            pg = postgresql.insert(table).values(row)
            self.statement: sa.Executable = pg.on_conflict_do_update(
                index_elements=[table.c[name] for name in keys],
                set_={name: pg.excluded[name] for name in [*payload, fence_column]},
                where=_target.accepts(fence, pg.excluded[fence_column]),
            ).returning(sa.literal_column("(xmax = 0)").label("inserted"))
        elif self.dialect in _MYSQL:
            my = mysql.insert(table).values(row)
            ok = _target.accepts(fence, my.inserted[fence_column])
            assignments = [
                (name, sa.case((ok, my.inserted[name]), else_=table.c[name]))
                for name in [*payload, fence_column]  # the fence LAST: later ones see earlier ones
            ]
            self.statement = my.on_duplicate_key_update(assignments)
        else:
            raise ConfigError(
                f"fenced_upsert supports PostgreSQL and MySQL/MariaDB, not {self.dialect!r} "
                "(fenced_update works on every dialect)"
            )

    def outcome_postgres(self, row: sa.Row[Any] | None) -> UpsertOutcome | None:
        if row is None:
            return UpsertOutcome.STALE
        return UpsertOutcome.INSERTED if row[0] else UpsertOutcome.UPDATED

    def outcome_mysql(self, stored: Any) -> UpsertOutcome:
        if stored is not None and int(stored) > self.value:
            return UpsertOutcome.STALE
        return UpsertOutcome.INSERTED

    def finish(self, outcome: UpsertOutcome, raise_on_stale: bool) -> UpsertOutcome:
        if outcome is UpsertOutcome.STALE and raise_on_stale:
            raise FencedOutError(
                f"{describe(self.token)} is older than the fence stored in {self.table.name!r}."
                f"{self.fence_column}: the upsert was refused"
            )
        return outcome


def _run_sync(executor: Session | sa.Connection, plan: _Plan, raise_on_stale: bool) -> UpsertOutcome:
    result = cast("sa.CursorResult[Any]", executor.execute(plan.statement))
    if plan.dialect in _POSTGRES:
        outcome = plan.outcome_postgres(result.first())
    elif result.rowcount == 2:
        outcome = UpsertOutcome.UPDATED
    else:
        outcome = plan.outcome_mysql(executor.execute(plan.probe).scalar())
    assert outcome is not None
    return plan.finish(outcome, raise_on_stale)


async def _run_async(
    executor: AsyncSession | AsyncConnection, plan: _Plan, raise_on_stale: bool
) -> UpsertOutcome:
    result = cast("sa.CursorResult[Any]", await executor.execute(plan.statement))
    if plan.dialect in _POSTGRES:
        outcome = plan.outcome_postgres(result.first())
    elif result.rowcount == 2:
        outcome = UpsertOutcome.UPDATED
    else:
        outcome = plan.outcome_mysql((await executor.execute(plan.probe)).scalar())
    assert outcome is not None
    return plan.finish(outcome, raise_on_stale)


@overload
def fenced_upsert(
    session: Session | sa.Connection,
    table_or_model: Any,
    token: TokenLike,
    *,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> UpsertOutcome: ...


@overload
def fenced_upsert(
    session: AsyncSession | AsyncConnection,
    table_or_model: Any,
    token: TokenLike,
    *,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> Awaitable[UpsertOutcome]: ...


def fenced_upsert(
    session: _target.Executor,
    table_or_model: Any,
    token: TokenLike,
    *,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    fence_column: str = "fence_token",
    raise_on_stale: bool = False,
) -> UpsertOutcome | Awaitable[UpsertOutcome]:
    """Insert the row of business key ``key``, or update it while its fence lets ``token`` through.

    ``key`` maps the columns of a unique constraint (or the primary key) to
    their values; ``values`` the other columns to write (not empty, not the
    key, not the fence). Returns :class:`UpsertOutcome` ``inserted``,
    ``updated`` or ``stale`` (a newer token holds the row; nothing changed --
    or :class:`~fencekit.errors.FencedOutError` with ``raise_on_stale``). Sync
    or async like :func:`fenced_update`; runs in the caller's transaction.

    A row removed with ``DELETE`` forgets its fence, and a stale upsert would
    then insert it again: remove fenced rows with :func:`fenced_delete`, which
    keeps a tombstone.
    """
    plan = _Plan(session, table_or_model, token, key, values, fence_column)
    if _target.is_async(session):
        return _run_async(session, plan, raise_on_stale)  # type: ignore[arg-type]
    return _run_sync(session, plan, raise_on_stale)  # type: ignore[arg-type]
