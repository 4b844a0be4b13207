# ruff: noqa: PT017 - a script, not a pytest module: plain asserts on caught exceptions
"""The Django cases, run in a process of their own per database (Django is configured once per process).

``python tests/integration/django_cases.py <vendor> <database>``: configures Django
on that database of the machine's server, creates the model's table, runs every
case and prints ``ok <n>``; a failed case is a traceback and exit code 1. The
model lives in a throwaway app module written beside this process
(``FK_DJANGO_APP_DIR``).
"""

from __future__ import annotations

import os
import sys
import threading

DATABASES = {
    "postgresql": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "USER": "postgres",
    },
    "mariadb": {"ENGINE": "django.db.backends.mysql", "HOST": "127.0.0.1", "PORT": "3306", "USER": "root"},
}

MODELS = """
from django.db import models

from fencekit.integrations.django import FenceField


class Analysis(models.Model):
    game = models.CharField(max_length=40, unique=True)
    status = models.CharField(max_length=20)
    fence_token = FenceField()

    class Meta:
        app_label = "fkapp"
"""


def configure(vendor: str, name: str) -> None:
    import pymysql

    pymysql.version_info = (2, 2, 1, "final", 0)  # Django asks mysqlclient >= 1.4.3; PyMySQL stands in
    pymysql.install_as_MySQLdb()
    app_dir = os.environ["FK_DJANGO_APP_DIR"]
    os.makedirs(os.path.join(app_dir, "fkapp"), exist_ok=True)
    for file, text in (("__init__.py", ""), ("models.py", MODELS)):
        with open(os.path.join(app_dir, "fkapp", file), "w") as f:
            f.write(text)
    sys.path.insert(0, app_dir)
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {**DATABASES[vendor], "NAME": name}},
        INSTALLED_APPS=["fkapp"],
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def main(vendor: str, name: str) -> int:
    configure(vendor, name)
    from django.db import close_old_connections, connection, transaction
    from fkapp.models import Analysis

    import fencekit
    from fencekit import FencedOutError, FenceToken
    from fencekit.integrations.django import UpsertOutcome, fenced_update, fenced_upsert

    with connection.schema_editor() as editor:
        editor.create_model(Analysis)
    cases = 0

    def row(game: str) -> tuple[str, int | None]:
        got = Analysis.objects.get(game=game)
        return got.status, got.fence_token

    def tok(value: int) -> FenceToken:
        return FenceToken(value, "job:analysis")

    # 0.6.1's call, unchanged: `from fencekit import fenced_update` is this one
    assert fencekit.fenced_update is fenced_update
    Analysis.objects.create(game="g1", status="new")  # fence NULL: any token is accepted
    assert fenced_update(Analysis.objects.filter(game="g1"), tok(100), updates={"status": "running"}) is True
    assert row("g1") == ("running", 100)
    assert fenced_update(Analysis.objects.filter(game="g1"), tok(100), updates={"status": "done"}) is True
    assert row("g1") == ("done", 100)  # an equal token writes again (one delivery, many writes)
    assert fenced_update(Analysis.objects.filter(game="g1"), tok(99), updates={"status": "stale"}) is False
    try:
        fenced_update(
            Analysis.objects.filter(game="g1"), tok(99), updates={"status": "stale"}, raise_on_stale=True
        )
    except FencedOutError as exc:
        assert "99" in str(exc)
    else:
        raise AssertionError("a stale token with raise_on_stale=True must raise")
    assert row("g1") == ("done", 100)
    assert fenced_update(Analysis.objects.filter(game="nope"), tok(500), updates={"status": "x"}) is False
    cases += 5

    for bad, why in (({}, "non-empty"), ({"fence_token": 1}, "set from the token")):
        try:
            fenced_update(Analysis.objects.filter(game="g1"), tok(200), updates=bad)
        except ValueError as exc:  # 0.6.1 raises ValueError here
            assert why in str(exc), exc
        else:
            raise AssertionError(f"updates={bad} must be refused")
    cases += 1

    # the upsert: one statement per vendor
    assert (
        fenced_upsert(Analysis, tok(10), key={"game": "g2"}, updates={"status": "a"})
        is UpsertOutcome.INSERTED
    )
    assert row("g2") == ("a", 10)
    assert (
        fenced_upsert(Analysis, tok(20), key={"game": "g2"}, updates={"status": "b"}) is UpsertOutcome.UPDATED
    )
    assert (
        fenced_upsert(Analysis, tok(15), key={"game": "g2"}, updates={"status": "old"}) is UpsertOutcome.STALE
    )
    assert row("g2") == ("b", 20)
    with transaction.atomic():  # inside the caller's transaction too
        assert (
            fenced_upsert(Analysis, 30, key={"game": "g2"}, updates={"status": "c"}) is UpsertOutcome.UPDATED
        )
    assert row("g2") == ("c", 30)
    cases += 4
    for kwargs, why in (
        ({"key": {}, "updates": {"status": "x"}}, "key must not be empty"),
        ({"key": {"game": "g9"}, "updates": {"fence_token": 3}}, "set from the token"),
        ({"key": {"game": "g9"}, "updates": {"nope": 3}}, "no field 'nope'"),
    ):
        try:
            fenced_upsert(Analysis, tok(40), **kwargs)
        except fencekit.ConfigError as exc:
            assert why in str(exc), exc
        else:
            raise AssertionError(f"{kwargs} must be refused")
    cases += 1

    # writers racing with shuffled tokens: the row ends with the highest token's values
    Analysis.objects.create(game="g3", status="new")
    tokens = [7, 3, 11, 5, 9, 2, 8, 10]
    errors: list[BaseException] = []

    def write(value: int) -> None:
        try:
            fenced_update(Analysis.objects.filter(game="g3"), tok(value), updates={"status": f"by {value}"})
            fenced_upsert(Analysis, tok(value), key={"game": "g4"}, updates={"status": f"by {value}"})
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=write, args=(t,)) for t in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert row("g3") == ("by 11", 11)
    assert row("g4") == ("by 11", 11)
    cases += 1
    print(f"ok {cases}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
