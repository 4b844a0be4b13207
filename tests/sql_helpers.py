"""The machine's real SQL servers for the fenced-write tests: a database of the test module's own.

PostgreSQL 127.0.0.1:5432 (user postgres, trust) and MariaDB 127.0.0.1:3306
(root, no password). A server that does not answer fails the test with the
address in the message -- never a skip.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

SERVERS = {
    "postgresql": (
        "postgresql+psycopg://postgres@127.0.0.1:5432",
        "postgresql+psycopg://postgres@127.0.0.1:5432",
    ),
    "mariadb": ("mysql+pymysql://root@127.0.0.1:3306", "mysql+aiomysql://root@127.0.0.1:3306"),
}
ADMIN_DB = {"postgresql": "test", "mariadb": ""}


@dataclass(frozen=True)
class Database:
    kind: str  # "postgresql" or "mariadb"
    name: str

    @property
    def sync_url(self) -> str:
        return f"{SERVERS[self.kind][0]}/{self.name}"

    @property
    def async_url(self) -> str:
        return f"{SERVERS[self.kind][1]}/{self.name}"


def _admin(kind: str) -> sa.Engine:
    return sa.create_engine(f"{SERVERS[kind][0]}/{ADMIN_DB[kind]}", isolation_level="AUTOCOMMIT")


@contextlib.contextmanager
def own_database(kind: str, label: str) -> Iterator[Database]:
    """CREATE DATABASE fk_<label>_<random> on the ``kind`` server; DROP it afterwards."""
    name = f"fk_{label}_{uuid.uuid4().hex[:10]}"
    admin = _admin(kind)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    except sa.exc.OperationalError as exc:
        admin.dispose()
        pytest.fail(
            f"the {kind} server at {SERVERS[kind][0]} does not answer (these tests need it): {exc}",
            pytrace=False,
        )
    try:
        yield Database(kind, name)
    finally:
        with admin.connect() as conn:
            if kind == "postgresql":
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()
