"""What the SQL and Django fenced writes share, importing neither SQLAlchemy nor Django.

A destination row remembers, in its fence column, the largest token that wrote
it. A write presents a token and is applied only while the stored one is NULL
(never fenced) or not larger. The rules here -- which tokens are accepted, how
the outcome of an upsert is named -- are checked once for both back ends.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

from fencekit.errors import ConfigError
from fencekit.primitives.tokens import FenceToken

BIGINT_MAX = 2**63 - 1
"""The largest value of the signed 64-bit fence column."""

TokenLike: TypeAlias = FenceToken | int
"""A :class:`~fencekit.FenceToken` (a job's ``current_job().token``, a lock's token) or a plain int."""


def token_value(token: object) -> int:
    """The int a fenced write stores; a bool, a non-int or a value below 1 is refused."""
    if isinstance(token, FenceToken):
        return token.value
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be a fencekit.FenceToken or a positive int, got {type(token).__name__}")
    if token < 1:
        raise ConfigError(f"token must be >= 1, got {token}")
    if token > BIGINT_MAX:
        raise ConfigError(f"token {token} does not fit in a BIGINT fence column (max {BIGINT_MAX})")
    return token


def describe(token: object) -> str:
    """``token 123 for 'resource'`` (or ``token 123``), for error messages."""
    if isinstance(token, FenceToken):
        return f"token {token.value} for {token.resource!r}"
    return f"token {token}"


class UpsertOutcome(str, enum.Enum):
    """What a fenced upsert did: ``inserted`` a new row, ``updated`` the row, or nothing (``stale``)."""

    INSERTED = "inserted"
    UPDATED = "updated"
    STALE = "stale"

    @property
    def applied(self) -> bool:
        """True when the write landed (inserted or updated)."""
        return self is not UpsertOutcome.STALE
