"""The transactional outbox for SQLAlchemy: a task is enqueued if and only if your transaction commits.

::

    from fencekit.integrations.sql.outbox import create_outbox, enqueue_in

    create_outbox(engine)                      # once (or the Alembic operation, below)
    with Session(engine) as session, session.begin():
        session.add(Order(id=42, total=99))
        jid = enqueue_in(session, Task("shipping", "ship", {"order": 42}))
    # committed: a relay (outbox_url) enqueues the task; rolled back: nothing

``enqueue_in`` writes the task as one row inside the caller's transaction
(``Session``, ``Connection``; ``await`` it with an ``AsyncSession`` or
``AsyncConnection``); a relay -- a pool or ``Server`` given ``outbox_url``,
or ``fencekit relay`` -- moves committed rows to Redis with the jid as the
dedupe key. A task function writes its call with ``f.enqueue_in(session,
...)``. PostgreSQL and MariaDB/MySQL. The guide is ``docs/guides/outbox.md``;
the Alembic operation :func:`fencekit.integrations.sql.alembic.create_outbox_table`,
the Django forms :func:`fencekit.integrations.django.enqueue_in` and
:func:`~fencekit.integrations.django.create_outbox_operation`.
"""

from fencekit.produce.outbox import (
    OutboxRow,
    create_outbox,
    create_outbox_async,
    enqueue_in,
    outbox_columns,
    outbox_row,
    outbox_table,
)

__all__ = [
    "OutboxRow",
    "create_outbox",
    "create_outbox_async",
    "enqueue_in",
    "outbox_columns",
    "outbox_row",
    "outbox_table",
]
