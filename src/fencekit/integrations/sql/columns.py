"""The fence column: a nullable BIGINT holding the largest token that wrote the row.

Tokens are the Redis clock in microseconds (about 1.8e15), beyond a 32-bit
INTEGER, well inside BIGINT. NULL means "never fenced": the first fenced write
is accepted, so the column can be added to a table that already has rows.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import MappedColumn, mapped_column

FENCE_TYPE = sa.BigInteger
"""The SQL type of a fence column."""


def fence_column(name: str = "fence_token", **kwargs: Any) -> sa.Column[int]:
    """A Core ``Column(name, BigInteger, nullable=True)`` for ``Table(...)`` definitions."""
    kwargs.setdefault("nullable", True)
    return sa.Column(name, FENCE_TYPE(), **kwargs)


def fence_mapped_column(**kwargs: Any) -> MappedColumn[Any]:
    """``mapped_column(BigInteger, nullable=True)`` for declarative models::

    fence_token: Mapped[int | None] = fence_mapped_column()
    """
    kwargs.setdefault("nullable", True)
    return mapped_column(FENCE_TYPE(), **kwargs)
