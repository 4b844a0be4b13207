"""Fenced writes for Django: ``pip install fencekit-jobs[django]``.

Importable without Django: Django is imported only when a function runs.
:func:`fenced_update` is fencekit 0.6.1's ``fencekit.integrations.django.fenced_update``
(same signature, same results), except that a row whose fence is still NULL
is accepted too. :func:`fenced_upsert` is one raw statement per dialect, built
from the model's meta with the connection's own quoting: Django's
``bulk_create(update_conflicts=True)`` cannot carry the fence predicate.
The SQL and the race they close are explained in ``docs/guides/database.md``.

The transactional outbox (``docs/guides/outbox.md``): :func:`enqueue_in` writes a
task into the outbox table in the connection's current transaction (inside
``transaction.atomic()`` it commits, or rolls back, with your writes), and
:func:`create_outbox_operation` is the migration operation that creates the
table (its columns are the SQLAlchemy ones, compiled for the connection's
database: the outbox needs ``fencekit-jobs[sql]`` beside Django).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from fencekit.errors import ConfigError, FencedOutError
from fencekit.integrations._fencing import UpsertOutcome, token_value
from fencekit.jobs.task import Task
from fencekit.primitives.tokens import FenceToken
from fencekit.produce.outbox import check_dialect, outbox_row
from fencekit.settings import ClientOptions, resolve

__all__ = [
    "FenceField",
    "SupportsFencedUpdate",
    "UpsertOutcome",
    "create_outbox_operation",
    "enqueue_in",
    "fenced_update",
    "fenced_upsert",
]


def FenceField(**options: Any) -> Any:
    """The fence column for a model: a nullable ``BigIntegerField`` (tokens are ~1.8e15).

    ``fence_token = FenceField()``; ``makemigrations`` adds it as any field.
    ``options`` go to the field (``db_index=True``, ``db_column=...``).
    """
    from django.db import models  # type: ignore[import-untyped]

    return models.BigIntegerField(**{"null": True, "blank": True, **options})


class SupportsFencedUpdate(Protocol):
    """Minimal QuerySet-shaped interface used by :func:`fenced_update`.

    Django's ``QuerySet`` satisfies this protocol.
    """

    def filter(self, *args: Any, **kwargs: Any) -> SupportsFencedUpdate:
        """Return a narrowed queryset (Django ``filter`` semantics)."""
        ...

    def update(self, **kwargs: Any) -> int:
        """Apply field updates; return the number of rows modified."""
        ...


def fenced_update(
    queryset: SupportsFencedUpdate,
    token: FenceToken,
    *,
    updates: Mapping[str, Any],
    fence_field: str = "fence_token",
    raise_on_stale: bool = False,
) -> bool:
    """Atomically apply *updates* when the row fence is NULL or not newer than *token*.

    Builds the Django / SQL pattern::

        UPDATE ...
        SET <updates>, fence_token = <token.value>
        WHERE ... AND (fence_token IS NULL OR fence_token <= <token.value>)

    Pass a queryset already narrowed to the target row(s), for example
    ``AnalysisJob.objects.filter(pk=job_id)``. Returns ``True`` when at least
    one row was updated, ``False`` when none matched (missing row or a newer
    fence stored); with *raise_on_stale* no match raises
    :class:`~fencekit.errors.FencedOutError` (missing rows included, as in 0.6.1).
    *updates* must be non-empty and must not include *fence_field*.
    """
    from django.db.models import Q  # type: ignore[import-untyped]

    if not fence_field:
        raise ValueError("fence_field must be a non-empty str")
    if not updates:
        raise ValueError("updates must be non-empty")
    if fence_field in updates:
        raise ValueError(f"{fence_field!r} is set from the token; omit it from updates")

    payload = dict(updates)
    payload[fence_field] = token.value
    accepts = Q(**{f"{fence_field}__isnull": True}) | Q(**{f"{fence_field}__lte": token.value})
    updated = int(queryset.filter(accepts).update(**payload))
    if updated > 0:
        return True
    if raise_on_stale:
        raise FencedOutError(
            f"token {token.value} for {token.resource!r} did not update any "
            f"row (missing or fenced out on {fence_field!r})"
        )
    return False


def fenced_upsert(
    model: Any,
    token: FenceToken | int,
    *,
    key: Mapping[str, Any],
    updates: Mapping[str, Any],
    fence_field: str = "fence_token",
    using: str | None = None,
) -> UpsertOutcome:
    """Insert the row of ``model`` with business key ``key``, or update it unless a newer token holds it.

    ``key`` maps the fields of a unique constraint to their values, ``updates``
    the other fields. PostgreSQL: ``INSERT ... ON CONFLICT (key) DO UPDATE ...
    WHERE fence IS NULL OR fence <= EXCLUDED.fence RETURNING (xmax = 0)``;
    MySQL/MariaDB: ``INSERT ... ON DUPLICATE KEY UPDATE`` with every column
    guarded by the fence and the fence assigned last (see
    :mod:`fencekit.integrations.sql.upsert` for the row-count rules). Runs on ``using``
    (default: the router's write database) inside any open transaction.
    Returns :class:`UpsertOutcome`. Other vendors raise ConfigError.
    """
    from django.db import connections, router

    value = token_value(token)
    if not key:
        raise ConfigError("key must not be empty")
    if not updates:
        raise ConfigError("updates must not be empty")
    for role, names in (("key", key), ("updates", updates)):
        if fence_field in names:
            raise ConfigError(f"{fence_field!r} is set from the token; omit it from {role}")
    both = sorted(set(key) & set(updates))
    if both:
        raise ConfigError(f"updates must not name the key fields: {', '.join(map(repr, both))}")
    alias = using or router.db_for_write(model)
    connection = connections[alias]
    meta = model._meta
    qn = connection.ops.quote_name

    def field(name: str) -> Any:
        try:
            return meta.get_field(name)
        except Exception:
            raise ConfigError(f"model {meta.label} has no field {name!r}") from None

    fence = qn(field(fence_field).column)
    row = {**key, **updates}
    columns = [qn(field(name).column) for name in row]
    params = [field(name).get_db_prep_save(v, connection) for name, v in row.items()] + [value]
    table = qn(meta.db_table)
    insert = (
        f"INSERT INTO {table} ({', '.join([*columns, fence])}) "
        f"VALUES ({', '.join(['%s'] * (len(columns) + 1))})"
    )
    set_columns = [qn(field(name).column) for name in updates]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            keys = ", ".join(qn(field(name).column) for name in key)
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in [*set_columns, fence])
            cursor.execute(
                f"{insert} ON CONFLICT ({keys}) DO UPDATE SET {sets} "
                f"WHERE {table}.{fence} IS NULL OR {table}.{fence} <= EXCLUDED.{fence} "
                "RETURNING (xmax = 0)",
                params,
            )
            got = cursor.fetchone()
            if got is None:
                return UpsertOutcome.STALE
            return UpsertOutcome.INSERTED if got[0] else UpsertOutcome.UPDATED
        if connection.vendor == "mysql":
            ok = f"({fence} IS NULL OR {fence} <= VALUES({fence}))"
            sets = ", ".join(f"{c} = IF({ok}, VALUES({c}), {c})" for c in [*set_columns, fence])
            cursor.execute(f"{insert} ON DUPLICATE KEY UPDATE {sets}", params)
            if cursor.rowcount == 2:
                return UpsertOutcome.UPDATED
            where = " AND ".join(f"{qn(field(name).column)} = %s" for name in key)
            cursor.execute(
                f"SELECT {fence} FROM {table} WHERE {where} FOR UPDATE",
                [field(name).get_db_prep_save(v, connection) for name, v in key.items()],
            )
            stored = cursor.fetchone()
            if stored is not None and stored[0] is not None and int(stored[0]) > value:
                return UpsertOutcome.STALE
            return UpsertOutcome.INSERTED
        raise ConfigError(f"fenced_upsert supports PostgreSQL and MySQL/MariaDB, not {connection.vendor!r}")


_VENDORS = {"postgresql": "postgresql", "mysql": "mysql"}  # Django's vendor -> the outbox's dialect


def enqueue_in(
    task: Task,
    using: str = "default",
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    table: str | None = None,
) -> str:
    """Write ``task`` into the outbox through Django's connection ``using``; returns its jid.

    In ``transaction.atomic()`` the task is enqueued once that transaction
    commits (a relay moves it to Redis) and never if it rolls back; outside
    one, Django commits the row at once. ``table`` defaults to the
    ``outbox_table`` setting (``FENCEKIT_OUTBOX_TABLE``).
    """
    from django.db import connections

    connection = connections[using]
    dialect = check_dialect(_VENDORS.get(connection.vendor, connection.vendor))
    settings = resolve(ClientOptions, {}, owner="enqueue_in")  # once: it reads the environment
    name = table or settings["outbox_table"]
    row = outbox_row(
        task, delay=delay, at=at, keep_result=settings["keep_result"], max_payload=settings["max_payload"]
    )
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        insert = f"INSERT INTO {quoted} (queue, jid, due_ms, keep_ms, envelope) VALUES (%s, %s, %s, %s, %s)"
        values: list[object] = [row.queue, row.jid, row.due_ms, row.keep_ms, row.envelope]
        if dialect == "postgresql":  # one round trip: the NOTIFY goes out with the commit
            insert += " RETURNING pg_notify(%s, '')"
            values.append(name)
        cursor.execute(insert, values)
    return row.jid


def create_outbox_operation(table: str | None = None) -> Any:
    """A migration operation creating the outbox table (and dropping it when migrated back)::

    operations = [create_outbox_operation()]
    """
    from django.db import migrations

    def forward(apps: Any, schema_editor: Any) -> None:
        for statement in _outbox_ddl(schema_editor.connection, table):
            schema_editor.execute(statement, params=None)

    def backward(apps: Any, schema_editor: Any) -> None:
        name = table or resolve(ClientOptions, {}, owner="create_outbox_operation")["outbox_table"]
        schema_editor.execute(f"DROP TABLE {schema_editor.connection.ops.quote_name(name)}", params=None)

    return migrations.RunPython(forward, backward)


def _outbox_ddl(connection: Any, table: str | None) -> list[str]:
    """``CREATE TABLE`` of the outbox for Django ``connection``'s database, from the SQLAlchemy columns."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import mysql, postgresql
    from sqlalchemy.schema import CreateTable

    from fencekit.produce.outbox import outbox_table

    dialect = check_dialect(_VENDORS.get(connection.vendor, connection.vendor))
    name = table or resolve(ClientOptions, {}, owner="create_outbox_operation")["outbox_table"]
    compiled = postgresql.dialect() if dialect == "postgresql" else mysql.dialect()  # type: ignore[no-untyped-call]
    return [str(CreateTable(outbox_table(name, sa.MetaData())).compile(dialect=compiled))]
