"""``fenced_upsert``: insert-or-update by a business key, one statement, fenced.

PostgreSQL::

    INSERT INTO t (<key>, <values>, fence_token) VALUES (...)
    ON CONFLICT (<key>) DO UPDATE SET <values> = excluded.<values>, fence_token = excluded.fence_token
    WHERE t.fence_token IS NULL OR t.fence_token <= excluded.fence_token
    RETURNING (xmax = 0)

No row returned is ``stale``; ``xmax = 0`` tells a fresh insert from an update.

MySQL / MariaDB::

    INSERT INTO t (...) VALUES (...) ON DUPLICATE KEY UPDATE
      col = IF(t.fence_token IS NULL OR t.fence_token <= VALUES(fence_token), VALUES(col), col), ...,
      fence_token = IF(..., VALUES(fence_token), fence_token)   -- assigned LAST

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

from collections.abc import Coroutine, Mapping
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from fencekit.errors import ConfigError, FencedOutError
from fencekit.integrations._fencing import TokenLike, UpsertOutcome, describe, token_value
from fencekit.integrations.sql import _target
from fencekit.integrations.sql._run import (
    AsyncTarget,
    Steps,
    SyncTarget,
    dialect_name,
    is_async,
    run_async,
    run_sync,
)

_POSTGRES = {"postgresql"}
_MYSQL = {"mysql", "mariadb"}


def _outcome_steps(
    statement: sa.Executable,
    probe: sa.Select[Any],
    postgres: bool,
    table: sa.Table,
    fence_name: str,
    token: TokenLike,
    raise_on_stale: bool,
) -> Steps[UpsertOutcome]:
    result = yield statement
    if postgres:
        row = result.first()
        if row is None:  # DO UPDATE ... WHERE refused the row: a newer token holds it
            outcome = UpsertOutcome.STALE
        else:
            outcome = UpsertOutcome.INSERTED if row[0] else UpsertOutcome.UPDATED
    elif result.rowcount == 2:  # MySQL: 2 = an existing row was changed
        outcome = UpsertOutcome.UPDATED
    else:  # 1 = inserted or left unchanged (CLIENT_FOUND_ROWS): read the fence to tell
        stored = (yield probe).scalar()
        if stored is not None and int(stored) > token_value(token):
            outcome = UpsertOutcome.STALE
        else:
            outcome = UpsertOutcome.INSERTED
    if outcome is UpsertOutcome.STALE and raise_on_stale:
        raise FencedOutError(
            f"fenced out: {describe(token)} is older than the {fence_name} stored in "
            f"{table.fullname!r}: the upsert was refused"
        )
    return outcome


def plan_upsert(
    session: SyncTarget | AsyncTarget,
    table_or_model: object,
    token: TokenLike,
    key: object,
    values: object,
    fence_column: str,
    raise_on_stale: bool,
) -> Steps[UpsertOutcome]:
    """Validate everything now (also for async callers) and return the upsert's steps."""
    value = token_value(token)
    table = _target.resolve_table(table_or_model)
    fence = _target.fence(table, fence_column)
    keys = _target.checked_values(table, key, fence.name, "key")
    payload = _target.checked_values(table, values, fence.name, "values")
    both = sorted(set(keys) & set(payload))
    if both:
        raise ConfigError(f"values must not name the key columns: {', '.join(map(repr, both))}")
    row = {**keys, **payload, fence.name: value}
    dialect = dialect_name(session)
    probe = (
        sa.select(fence).where(sa.and_(*(table.c[name] == v for name, v in keys.items()))).with_for_update()
    )
    statement: sa.Executable
    if dialect in _POSTGRES:
        pg = postgresql.insert(table).values(row)
        statement = pg.on_conflict_do_update(
            index_elements=[table.c[name] for name in keys],
            set_={name: pg.excluded[name] for name in [*payload, fence.name]},
            where=_target.accepts(fence, pg.excluded[fence.name]),
        ).returning(sa.literal_column("(xmax = 0)").label("inserted"))
    elif dialect in _MYSQL:
        my = mysql.insert(table).values(row)
        ok = _target.accepts(fence, my.inserted[fence.name])
        assignments = [
            (name, sa.func.IF(ok, my.inserted[name], table.c[name]))
            for name in [*payload, fence.name]  # the fence LAST: later assignments see earlier ones
        ]
        statement = my.on_duplicate_key_update(assignments)
    else:
        raise ConfigError(
            f"fenced_upsert supports PostgreSQL and MySQL/MariaDB, not {dialect!r} "
            "(fenced_update works on every dialect)"
        )
    return _outcome_steps(statement, probe, dialect in _POSTGRES, table, fence.name, token, raise_on_stale)


@overload
def fenced_upsert(
    session: SyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> UpsertOutcome: ...


@overload
def fenced_upsert(
    session: AsyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> Coroutine[Any, Any, UpsertOutcome]: ...


def fenced_upsert(
    session: SyncTarget | AsyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    fence_column: str = "fence_token",
    raise_on_stale: bool = False,
) -> UpsertOutcome | Coroutine[Any, Any, UpsertOutcome]:
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
    async_target = is_async(session)
    steps = plan_upsert(session, table_or_model, token, key, values, fence_column, raise_on_stale)
    if async_target:
        return run_async(session, steps)  # type: ignore[arg-type]
    return run_sync(session, steps)  # type: ignore[arg-type]
