"""Alembic operations: a fence column, and the outbox table, for a migration's ``upgrade()``::

    from fencekit.integrations.sql.alembic import add_fence_column

    def upgrade() -> None:
        add_fence_column("payments")

The column is a nullable BIGINT (:mod:`fencekit.integrations.sql.columns`): existing rows
get NULL, which the first fenced write accepts. Outside a migration script
pass ``operations=Operations(MigrationContext.configure(connection))``.
:func:`create_outbox_table` creates the transactional outbox's table
(:mod:`fencekit.integrations.sql.outbox`), the same columns as ``create_outbox``.
"""

from __future__ import annotations

from alembic import op as _op
from alembic.operations import Operations

from fencekit.integrations.sql.columns import fence_column
from fencekit.produce.outbox import outbox_columns
from fencekit.settings import DEFAULT_OUTBOX_TABLE


def add_fence_column(
    table_name: str,
    *,
    column: str = "fence_token",
    schema: str | None = None,
    operations: Operations | None = None,
) -> None:
    """``ALTER TABLE table_name ADD COLUMN column BIGINT NULL`` through Alembic."""
    ops = operations if operations is not None else _op
    ops.add_column(table_name, fence_column(column), schema=schema)


def drop_fence_column(
    table_name: str,
    *,
    column: str = "fence_token",
    schema: str | None = None,
    operations: Operations | None = None,
) -> None:
    """``ALTER TABLE table_name DROP COLUMN column`` through Alembic (a downgrade)."""
    ops = operations if operations is not None else _op
    ops.drop_column(table_name, column, schema=schema)


def create_outbox_table(
    table_name: str = DEFAULT_OUTBOX_TABLE, *, schema: str | None = None, operations: Operations | None = None
) -> None:
    """``CREATE TABLE`` the transactional outbox through Alembic (``outbox_table`` must name it)."""
    ops = operations if operations is not None else _op
    ops.create_table(table_name, *outbox_columns(), schema=schema)


def drop_outbox_table(
    table_name: str = DEFAULT_OUTBOX_TABLE, *, schema: str | None = None, operations: Operations | None = None
) -> None:
    """``DROP TABLE`` the transactional outbox through Alembic (a downgrade)."""
    ops = operations if operations is not None else _op
    ops.drop_table(table_name, schema=schema)
