"""``fenced_delete``: remove a row while keeping its fence, as a tombstone.

A real ``DELETE`` forgets the row's fence: a stale delivery's upsert that
arrives afterwards finds no row, inserts it and brings back what a newer
delivery removed. So a fenced delete is a fenced *update* that sets the
caller's tombstone columns (``{"deleted_at": now}``, ``{"deleted": True}``)
and the token, leaving the row -- and its fence -- in place. Readers filter
tombstones out; a later, newer upsert that means to revive the row clears
the tombstone in its ``values`` (``{"deleted_at": None, ...}``). Purging old
tombstones is safe once no delivery older than them can still arrive (after
the longest job timeout plus retries).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from fencekit._fencing import TokenLike
from fencekit.sql import _target
from fencekit.sql import update as _update


@overload
def fenced_delete(
    session: Session | sa.Connection,
    table_or_model: Any,
    token: TokenLike,
    *,
    where: Any,
    tombstone: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> bool: ...


@overload
def fenced_delete(
    session: AsyncSession | AsyncConnection,
    table_or_model: Any,
    token: TokenLike,
    *,
    where: Any,
    tombstone: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> Awaitable[bool]: ...


def fenced_delete(
    session: _target.Executor,
    table_or_model: Any,
    token: TokenLike,
    *,
    where: Any,
    tombstone: Mapping[str, Any],
    fence_column: str = "fence_token",
    raise_on_stale: bool = False,
) -> bool | Awaitable[bool]:
    """Mark the rows matching ``where`` deleted by writing ``tombstone``, fenced like an update.

    Same arguments, results and errors as :func:`fenced_update`, with
    ``tombstone`` (the columns that mark the row deleted) in place of
    ``values``. The row stays, with the token in its fence column, so no older
    delivery can update or re-insert it.
    """
    plan = _update._Plan(table_or_model, token, where, tombstone, fence_column, role="tombstone")
    if _target.is_async(session):
        return _update._run_async(session, plan, raise_on_stale)  # type: ignore[arg-type]
    return _update._run_sync(session, plan, raise_on_stale)  # type: ignore[arg-type]
