"""Fenced writes for SQLAlchemy 2.x (Core and ORM, sync and asyncio): ``pip install fencekit-jobs[sql]``.

A row keeps, in a nullable BIGINT fence column, the largest token that wrote
it; every write here presents a token and is one statement that applies only
while the stored fence is NULL or not larger. A delivery paused past its lease
and redelivered elsewhere therefore cannot overwrite the newer delivery's work
when it resumes: its statement changes 0 rows. The guide is ``docs/guides/database.md``.

- :func:`fenced_update` -- ``UPDATE ... WHERE <where> AND (fence IS NULL OR fence <= :t)``
- :func:`fenced_upsert` -- insert-or-update by a business key (PostgreSQL, MySQL/MariaDB)
- :func:`fenced_delete` -- a tombstone that keeps the fence, so nothing older resurrects the row
- :func:`fence_column`, :func:`fence_mapped_column` -- the column for models;
  :mod:`fencekit.integrations.sql.alembic` -- the migration operations
"""

from fencekit.integrations._fencing import TokenLike, UpsertOutcome
from fencekit.integrations.sql.columns import FENCE_TYPE, fence_column, fence_mapped_column
from fencekit.integrations.sql.delete import fenced_delete
from fencekit.integrations.sql.update import fenced_update
from fencekit.integrations.sql.upsert import fenced_upsert

__all__ = [
    "FENCE_TYPE",
    "TokenLike",
    "UpsertOutcome",
    "fence_column",
    "fence_mapped_column",
    "fenced_delete",
    "fenced_update",
    "fenced_upsert",
]
