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

from collections.abc import Coroutine, Mapping
from typing import Any, overload

from fencekit.integrations._fencing import TokenLike
from fencekit.integrations.sql._run import AsyncTarget, SyncTarget, is_async, run_async, run_sync
from fencekit.integrations.sql.update import Where, plan_update


@overload
def fenced_delete(
    session: SyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    where: Where,
    tombstone: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> bool: ...


@overload
def fenced_delete(
    session: AsyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    where: Where,
    tombstone: Mapping[str, Any],
    fence_column: str = ...,
    raise_on_stale: bool = ...,
) -> Coroutine[Any, Any, bool]: ...


def fenced_delete(
    session: SyncTarget | AsyncTarget,
    table_or_model: object,
    token: TokenLike,
    *,
    where: Where,
    tombstone: Mapping[str, Any],
    fence_column: str = "fence_token",
    raise_on_stale: bool = False,
) -> bool | Coroutine[Any, Any, bool]:
    """Mark the rows matching ``where`` deleted by writing ``tombstone``, fenced like an update.

    Same arguments, results and errors as :func:`fenced_update`, with
    ``tombstone`` (the columns that mark the row deleted) in place of
    ``values``. The row stays, with the token in its fence column, so no older
    delivery can update or re-insert it.
    """
    async_target = is_async(session)
    steps = plan_update(
        table_or_model, token, where, tombstone, fence_column, raise_on_stale, role="tombstone"
    )
    if async_target:
        return run_async(session, steps)  # type: ignore[arg-type]
    return run_sync(session, steps)  # type: ignore[arg-type]
