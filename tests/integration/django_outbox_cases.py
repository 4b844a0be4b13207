# ruff: noqa: PT017 - a script, not a pytest module: plain asserts on caught exceptions
"""The Django outbox cases, in a process of their own (Django is configured once per process).

``python tests/integration/django_outbox_cases.py <vendor> <database>``: configures Django on
that database (``django_cases.configure``), creates the outbox table with the migration
operation ``create_outbox_operation()``, then writes tasks with
``fencekit.integrations.django.enqueue_in`` -- in an ``atomic()`` block that commits, in one
that rolls back, and outside any (autocommit) -- and prints ``committed <jid>`` /
``rolled-back <jid>`` lines and ``ok``. The test relays the table and checks Redis.
"""

from __future__ import annotations

import sys

from django_cases import configure


class Rollback(Exception):
    pass


def main(vendor: str, name: str) -> int:
    configure(vendor, name)
    from django.apps import apps
    from django.db import connection, transaction
    from fkapp.models import Analysis

    from fencekit import PayloadError, Task
    from fencekit.integrations.django import create_outbox_operation, enqueue_in

    with connection.schema_editor() as editor:
        editor.create_model(Analysis)
        create_outbox_operation().code(apps, editor)

    with transaction.atomic():
        Analysis.objects.create(game="d1", status="queued")
        print("committed", enqueue_in(Task("work", "do", {"game": "d1"}, keep_result=0)))
    try:
        with transaction.atomic():
            Analysis.objects.create(game="d2", status="queued")
            print("rolled-back", enqueue_in(Task("work", "do", {"game": "d2"}, keep_result=0)))
            raise Rollback
    except Rollback:
        pass
    assert not Analysis.objects.filter(game="d2").exists()
    print("committed", enqueue_in(Task("work", "do", {"game": "d3"}, keep_result=0), delay=0))
    try:
        enqueue_in({"queue": "work"})  # type: ignore[arg-type]
    except PayloadError as exc:
        assert "Task" in str(exc)
    else:
        raise AssertionError("a dict was written into the outbox")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
