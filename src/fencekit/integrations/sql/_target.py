"""What a fenced write names: its table, its fence column, its row filter and its values.

Every name is checked against the table before a statement is built, so a typo
fails with the name in the message instead of as a driver error (or, for a
``where`` mapping, instead of silently matching nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from fencekit.errors import ConfigError


def resolve_table(table_or_model: object) -> sa.Table:
    """The :class:`~sqlalchemy.Table` of a Table or of a mapped ORM class."""
    if isinstance(table_or_model, sa.Table):
        return table_or_model
    if isinstance(table_or_model, type):
        mapper: object = sa.inspect(table_or_model, raiseerr=False)
        local = getattr(mapper, "local_table", None)
        if isinstance(local, sa.Table):
            return local
    raise TypeError(
        f"table_or_model must be a sqlalchemy Table or a mapped ORM class, got {table_or_model!r}"
    )


def column(table: sa.Table, name: object, role: str) -> sa.Column[Any]:
    """Column ``name`` of ``table``; ``role`` says where the name came from, for the error."""
    if not isinstance(name, str):
        raise TypeError(f"{role} names columns by str, got {name!r}")
    try:
        return table.c[name]
    except KeyError:
        raise ConfigError(f"{role}: table {table.fullname!r} has no column {name!r}") from None


def fence(table: sa.Table, name: str) -> sa.Column[Any]:
    """The fence column of ``table`` (a clear error when the table has none)."""
    return column(table, name, "fence_column")


def accepts(fence: sa.Column[Any], token: object) -> ColumnElement[bool]:
    """``fence IS NULL OR fence <= token``: the row lets a write carrying ``token`` through.

    ``token`` is an int or a SQL expression (``excluded.fence_token`` of an upsert).
    """
    return sa.or_(fence.is_(None), fence <= token)


def where_clause(table: sa.Table, where: object) -> ColumnElement[bool]:
    """``where`` as a SQL boolean: an expression as given, a mapping as ANDed equalities.

    An empty mapping is refused: it would fence every row of the table.
    """
    if isinstance(where, ColumnElement):
        return where
    if isinstance(where, Mapping):
        if not where:
            raise ConfigError("where must not be empty (it would match every row)")
        return sa.and_(*(column(table, name, "where") == value for name, value in where.items()))
    raise TypeError(f"where must be a SQL boolean expression or a mapping of column -> value, got {where!r}")


def checked_values(table: sa.Table, values: object, fence_name: str, role: str = "values") -> dict[str, Any]:
    """``values`` checked: a non-empty mapping of existing columns, the fence column not among them."""
    if not isinstance(values, Mapping):
        raise TypeError(f"{role} must be a mapping of column -> value, got {values!r}")
    if not values:
        raise ConfigError(f"{role} must not be empty")
    out: dict[str, Any] = {}
    for name, value in values.items():
        col = column(table, name, role)
        if col.name == fence_name:
            raise ConfigError(
                f"{role} must not name the fence column {fence_name!r}: it is set from the token"
            )
        out[col.name] = value
    return out
