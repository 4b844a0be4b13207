"""``fenced_update``: one UPDATE that applies only while the row's fence token is not newer.

The hazard it closes (docs/guides/database.md tells it at length)::

    worker A  takes job J (token 100) ........ paused (GC, SIGSTOP, partition) .......... resumes, UPDATE
    fencekit                     lease expires, J redelivered to B (token 200)
    worker B                         takes J, UPDATE row SET ..., fence_token = 200, COMMIT

A's late UPDATE carries token 100. ``fence_token IS NULL OR fence_token <= 100``
is false for the row B wrote, so it changes 0 rows: A's stale values never
land. The check and the write are one statement, so no other writer can come
between them (the database's row lock orders concurrent UPDATEs of one row, and
each re-evaluates the condition on the row it finally sees).

Equal tokens pass: one delivery may write a row many times. A NULL fence (a
row no fenced write has touched yet, e.g. one that existed before the column
was added) accepts any token.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Any, TypeAlias, overload

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlalchemy.sql.elements import ColumnElement

from fencekit.errors import FencedOutError
from fencekit.integrations._fencing import TokenLike, describe, token_value
from fencekit.integrations.sql import _target
from fencekit.integrations.sql._run import AsyncTarget, Steps, SyncTarget, is_async, run_async, run_sync

Where: TypeAlias = ColumnElement[bool] | Mapping[str, Any]
"""A SQL boolean expression, or a mapping of column name -> value (ANDed equalities)."""


def stale_error(table: sa.Table, fence_name: str, token: TokenLike, newest: object) -> FencedOutError:
    """The FencedOutError of a write refused because the row holds the newer ``newest``."""
    return FencedOutError(
        f"fenced out: {describe(token)} is older than {fence_name}={newest} of the row in {table.fullname!r}"
    )


def _update_steps(
    statement: sa.Update,
    check: sa.Select[Any] | None,
    table: sa.Table,
    fence_name: str,
    token: TokenLike,
) -> Steps[bool]:
    result: CursorResult[Any] = yield statement
    if result.rowcount > 0:
        return True
    if check is None:
        return False
    # 0 rows, and the caller wants stale told apart from missing: one read, off the hot path.
    newest = (yield check).scalar()
    if newest is not None and int(newest) > token_value(token):
        raise stale_error(table, fence_name, token, newest)
    return False  # no such row (or it appeared after our UPDATE): missing is not stale


def plan_update(
    table_or_model: object,
    token: TokenLike,
    where: object,
    values: object,
    fence_column: str,
    raise_on_stale: bool,
    *,
    role: str = "values",
) -> Steps[bool]:
    """Validate everything now (also for async callers) and return the write's steps."""
    value = token_value(token)
    table = _target.resolve_table(table_or_model)
    fence = _target.fence(table, fence_column)
    checked = _target.checked_values(table, values, fence.name, role)
    condition = _target.where_clause(table, where)
    statement = (
        sa.update(table)
        .where(condition, _target.accepts(fence, value))
        .values({**{table.c[name]: v for name, v in checked.items()}, fence: value})
    )
    check = sa.select(sa.func.max(fence)).where(condition) if raise_on_stale else None
    return _update_steps(statement, check, table, fence.name, token)


@overload
def fenced_update(
    session: SyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    where: Where,
    values: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> bool: ...


@overload
def fenced_update(
    session: AsyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    where: Where,
    values: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> Coroutine[Any, Any, bool]: ...


def fenced_update(
    session: SyncTarget | AsyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    where: Where,
    values: Mapping[str, Any],
    fence_column: str = "fence_token",
    raise_on_stale: bool = False,
) -> bool | Coroutine[Any, Any, bool]:
    """``UPDATE t SET <values>, fence = :token WHERE <where> AND (fence IS NULL OR fence <= :token)``.

    One statement; returns whether it changed at least one row. ``session`` is a
    ``Session`` or ``Connection`` (returns ``bool``) or an ``AsyncSession`` or
    ``AsyncConnection`` (returns an awaitable: ``applied = await fenced_update(...)``).
    ``table_or_model`` is a ``Table`` or a mapped class; column names are the
    table's column names. ``where`` is a SQL boolean or a mapping of column ->
    value (equalities). ``token`` is a :class:`~fencekit.FenceToken`
    (``current_job().token``, a lock's token) or a positive int.

    A row whose fence is newer than ``token`` is left alone: ``False``, or
    :class:`~fencekit.errors.FencedOutError` with ``raise_on_stale=True``. A
    missing row is ``False`` in both modes (with ``raise_on_stale`` a second read,
    only when 0 rows changed, tells it apart from a stale one). The caller's
    transaction is used as it is: commit it to make the write durable. Objects
    already loaded in an ORM session are not refreshed (expire them if needed).
    """
    async_target = is_async(session)
    steps = plan_update(table_or_model, token, where, values, fence_column, raise_on_stale)
    if async_target:
        return run_async(session, steps)  # type: ignore[arg-type]
    return run_sync(session, steps)  # type: ignore[arg-type]
