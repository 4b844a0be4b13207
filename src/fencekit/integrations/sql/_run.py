"""One fenced write's logic, run on a sync or an asyncio SQLAlchemy target.

Each write is a generator of *steps*: it yields a statement and is sent the
:class:`~sqlalchemy.engine.CursorResult`; its return value is the outcome.
:func:`run_sync` drives it on a ``Session``/``Connection``, :func:`run_async`
on an ``AsyncSession``/``AsyncConnection``, so the decision logic (what 0 rows
mean, when to read again) is written once for both.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, TypeAlias, TypeVar, cast

from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

T = TypeVar("T")

SyncTarget: TypeAlias = Session | Connection
AsyncTarget: TypeAlias = AsyncSession | AsyncConnection
Steps: TypeAlias = Generator[Executable, "CursorResult[Any]", T]


def dialect_name(target: SyncTarget | AsyncTarget) -> str:
    """The dialect name of the database ``target`` talks to (``postgresql``, ``mysql``…)."""
    if isinstance(target, (Session, AsyncSession)):
        return str(target.get_bind().dialect.name)
    return str(target.dialect.name)


def is_async(target: object) -> bool:
    """Whether ``target`` is an asyncio target; a TypeError for anything that is no target."""
    if isinstance(target, (AsyncSession, AsyncConnection)):
        return True
    if isinstance(target, (Session, Connection)):
        return False
    raise TypeError(
        "session must be a sqlalchemy Session, Connection, AsyncSession or AsyncConnection, "
        f"got {type(target).__name__}"
    )


def run_sync(target: SyncTarget, steps: Steps[T]) -> T:
    """Drive ``steps`` on a sync Session or Connection."""
    try:
        statement = next(steps)
        while True:
            result = cast("CursorResult[Any]", target.execute(statement))
            statement = steps.send(result)
    except StopIteration as done:
        return cast(T, done.value)


async def _drive_async(target: AsyncTarget, steps: Steps[T]) -> T:
    try:
        statement = next(steps)
        while True:
            result = cast("CursorResult[Any]", await target.execute(statement))
            statement = steps.send(result)
    except StopIteration as done:
        return cast(T, done.value)


def run_async(target: AsyncTarget, steps: Steps[T]) -> Coroutine[Any, Any, T]:
    """A coroutine driving ``steps`` on an AsyncSession or AsyncConnection."""
    return _drive_async(target, steps)
