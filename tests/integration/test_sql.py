"""fencekit.integrations.sql on the real PostgreSQL and MariaDB, through Core and ORM, sync and asyncio.

Each database is this module's own (created, then dropped). Every behaviour runs
over both servers and the four kinds of executor: Connection, Session,
AsyncConnection, AsyncSession. Rows are read back with plain SQL.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool
from tests.docs_blocks import block_with
from tests.sql_helpers import Database, own_database

from fencekit import FencedOutError, FenceToken
from fencekit.errors import ConfigError
from fencekit.integrations.sql import (
    UpsertOutcome,
    fence_column,
    fence_mapped_column,
    fenced_delete,
    fenced_update,
    fenced_upsert,
)
from fencekit.integrations.sql.alembic import add_fence_column, drop_fence_column

metadata = sa.MetaData()
accounts = sa.Table(
    "accounts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("account", sa.String(40), nullable=False, unique=True),
    sa.Column("balance", sa.Integer, nullable=False),
    sa.Column("note", sa.String(40)),
    sa.Column("deleted_at", sa.DateTime),
    fence_column(),
)


class Base(DeclarativeBase):
    pass


class Account(Base):
    __table__ = accounts


MODES = ["connection", "session", "async-connection", "async-session"]


@pytest.fixture(scope="module", params=["postgresql", "mariadb"])
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    with own_database(request.param, "sql") as database:
        engine = sa.create_engine(database.sync_url, poolclass=NullPool)
        metadata.create_all(engine)
        engine.dispose()
        yield database


@pytest.fixture
def engine(db: Database) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db.sync_url, poolclass=NullPool)
    yield eng
    eng.dispose()


class Writer:
    """Runs a fencekit.integrations.sql call in its own committed transaction through one kind of executor."""

    def __init__(self, mode: str, db: Database, engine: sa.Engine) -> None:
        self.mode = mode
        self.engine = engine
        self.aengine = create_async_engine(db.async_url, poolclass=NullPool)

    async def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "connection":
            with self.engine.begin() as conn:
                return fn(conn, *args, **kwargs)
        if self.mode == "session":
            with Session(self.engine) as session, session.begin():
                return fn(session, *args, **kwargs)
        if self.mode == "async-connection":
            async with self.aengine.begin() as aconn:
                return await fn(aconn, *args, **kwargs)
        async with AsyncSession(self.aengine) as asession, asession.begin():
            return await fn(asession, *args, **kwargs)


@pytest.fixture(params=MODES)
async def write(request: pytest.FixtureRequest, db: Database, engine: sa.Engine) -> AsyncIterator[Writer]:
    writer = Writer(request.param, db, engine)
    yield writer
    await writer.aengine.dispose()


def new_account(engine: sa.Engine, fence: int | None, balance: int = 100) -> str:
    name = uuid.uuid4().hex[:20]
    with engine.begin() as conn:
        conn.execute(accounts.insert().values(account=name, balance=balance, fence_token=fence))
    return name


def row(engine: sa.Engine, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        got = conn.execute(sa.select(accounts).where(accounts.c.account == name)).mappings().first()
    return dict(got) if got is not None else None


# -- fenced_update ---------------------------------------------------------------------


async def test_an_update_over_a_null_fence_applies_and_stores_the_token(
    write: Writer, engine: sa.Engine
) -> None:
    name = new_account(engine, fence=None)
    token = FenceToken(1_764_000_000_000_001, "{payments}:job:1")
    applied = await write(fenced_update, accounts, token, where={"account": name}, values={"balance": 7})
    assert applied is True
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["fence_token"]) == (7, token.value)


async def test_a_stale_token_changes_nothing_and_raises_when_asked(write: Writer, engine: sa.Engine) -> None:
    name = new_account(engine, fence=20)
    assert await write(fenced_update, Account, 10, where={"account": name}, values={"balance": 1}) is False
    with pytest.raises(FencedOutError, match="token 10"):
        await write(
            fenced_update, Account, 10, where={"account": name}, values={"balance": 1}, raise_on_stale=True
        )
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["fence_token"]) == (100, 20)


async def test_an_equal_token_writes_again_and_a_newer_one_takes_over(
    write: Writer, engine: sa.Engine
) -> None:
    name = new_account(engine, fence=None)
    where = accounts.c.account == name  # an expression, not a mapping
    assert await write(fenced_update, accounts, 5, where=where, values={"balance": 1}) is True
    assert await write(fenced_update, accounts, 5, where=where, values={"balance": 2}) is True
    assert await write(fenced_update, accounts, 5, where=where, values={"balance": 2}) is True  # no change
    assert await write(fenced_update, accounts, 6, where=where, values={"note": "six"}) is True
    assert await write(fenced_update, accounts, 5, where=where, values={"balance": 3}) is False
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["note"], got["fence_token"]) == (2, "six", 6)


async def test_a_missing_row_returns_false_even_with_raise_on_stale(write: Writer) -> None:
    missing = {"account": "no-such-" + uuid.uuid4().hex[:8]}
    assert await write(fenced_update, accounts, 3, where=missing, values={"balance": 1}) is False
    kwargs = {"where": missing, "values": {"balance": 1}, "raise_on_stale": True}
    assert await write(fenced_update, accounts, 3, **kwargs) is False


# -- fenced_upsert and tombstones ---------------------------------------------------------


async def test_an_upsert_inserts_updates_and_refuses_a_stale_token(write: Writer, engine: sa.Engine) -> None:
    name = uuid.uuid4().hex[:20]
    key = {"account": name}
    assert await write(fenced_upsert, Account, 10, key=key, values={"balance": 1}) is UpsertOutcome.INSERTED
    assert await write(fenced_upsert, Account, 10, key=key, values={"balance": 2}) is UpsertOutcome.UPDATED
    assert await write(fenced_upsert, Account, 12, key=key, values={"balance": 3}) is UpsertOutcome.UPDATED
    assert await write(fenced_upsert, Account, 11, key=key, values={"balance": 4}) is UpsertOutcome.STALE
    with pytest.raises(FencedOutError):
        await write(fenced_upsert, Account, 11, key=key, values={"balance": 4}, raise_on_stale=True)
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["fence_token"]) == (3, 12)
    assert UpsertOutcome.STALE.applied is False
    assert UpsertOutcome.UPDATED.applied is True


async def test_an_upsert_over_a_null_fence_updates(write: Writer, engine: sa.Engine) -> None:
    name = new_account(engine, fence=None)
    outcome = await write(fenced_upsert, accounts, 4, key={"account": name}, values={"balance": 9})
    assert outcome is UpsertOutcome.UPDATED
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["fence_token"]) == (9, 4)


async def test_a_stale_upsert_after_a_newer_fenced_delete_does_not_bring_the_row_back(
    write: Writer, engine: sa.Engine
) -> None:
    name = uuid.uuid4().hex[:20]
    key = {"account": name}
    when = datetime.datetime(2026, 12, 1, 12, 0, 0)
    assert await write(fenced_upsert, accounts, 10, key=key, values={"balance": 1}) is UpsertOutcome.INSERTED
    assert await write(fenced_delete, accounts, 30, where=key, tombstone={"deleted_at": when}) is True
    # the delivery of token 20, paused until now, arrives with its upsert: refused, row stays deleted
    assert await write(fenced_upsert, accounts, 20, key=key, values={"balance": 2}) is UpsertOutcome.STALE
    assert await write(fenced_update, accounts, 20, where=key, values={"balance": 2}) is False
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["deleted_at"], got["fence_token"]) == (1, when, 30)
    # a newer delivery may revive it, by clearing the tombstone itself
    revive = {"balance": 5, "deleted_at": None}
    assert await write(fenced_upsert, accounts, 40, key=key, values=revive) is UpsertOutcome.UPDATED
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["deleted_at"], got["fence_token"]) == (5, None, 40)


async def test_a_plain_delete_forgets_the_fence_which_is_why_fenced_delete_exists(
    write: Writer, engine: sa.Engine
) -> None:
    name = uuid.uuid4().hex[:20]
    key = {"account": name}
    await write(fenced_upsert, accounts, 30, key=key, values={"balance": 1})
    with engine.begin() as conn:
        conn.execute(accounts.delete().where(accounts.c.account == name))
    assert await write(fenced_upsert, accounts, 20, key=key, values={"balance": 2}) is UpsertOutcome.INSERTED


# -- concurrent writers ----------------------------------------------------------------------


@pytest.mark.parametrize("op", ["update", "upsert"])
def test_concurrent_threads_leave_the_highest_tokens_values(engine: sa.Engine, op: str) -> None:
    name = new_account(engine, fence=None)
    tokens = list(range(1, 9))
    random.shuffle(tokens)
    start = threading.Barrier(len(tokens))
    errors: list[BaseException] = []

    def deliver(token: int) -> None:
        try:
            start.wait(10)
            with engine.begin() as conn:
                if op == "update":
                    fenced_update(conn, accounts, token, where={"account": name}, values={"balance": token})
                else:
                    fenced_upsert(conn, accounts, token, key={"account": name}, values={"balance": token})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=deliver, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["fence_token"]) == (8, 8)


@pytest.mark.parametrize("op", ["update", "upsert"])
async def test_concurrent_tasks_leave_the_highest_tokens_values(
    db: Database, engine: sa.Engine, op: str
) -> None:
    name = uuid.uuid4().hex[:20] if op == "upsert" else new_account(engine, fence=None)
    aengine = create_async_engine(db.async_url, poolclass=NullPool)
    tokens = list(range(1, 9))
    random.shuffle(tokens)

    async def deliver(token: int) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            if op == "update":
                await fenced_update(
                    session, Account, token, where={"account": name}, values={"balance": token}
                )
            else:
                await fenced_upsert(session, Account, token, key={"account": name}, values={"balance": token})

    try:
        await asyncio.wait_for(asyncio.gather(*(deliver(t) for t in tokens)), 30)
    finally:
        await aengine.dispose()
    got = row(engine, name)
    assert got is not None
    assert (got["balance"], got["fence_token"]) == (8, 8)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "kwargs", "error", "match"),
    [
        (True, {}, TypeError, "positive int"),
        (0, {}, ConfigError, ">= 1"),
        (-5, {}, ConfigError, ">= 1"),
        ("7", {}, TypeError, "got str"),
        (7, {"values": {}}, ConfigError, "values must not be empty"),
        (7, {"values": {"fence_token": 1}}, ConfigError, "set from the token"),
        (7, {"values": {"balanse": 1}}, ConfigError, "no column 'balanse'"),
        (7, {"where": {"acount": "x"}}, ConfigError, "no column 'acount'"),
        (7, {"where": {}}, ConfigError, "where must not be empty"),
        (7, {"where": "account = 'x'"}, TypeError, "SQL boolean expression"),
        (7, {"fence_column": "fence"}, ConfigError, "no column 'fence'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(
    engine: sa.Engine, token: Any, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    call = {"where": {"account": "x"}, "values": {"balance": 1}, **kwargs}
    with engine.connect() as conn:
        with pytest.raises(error, match=match):
            fenced_update(conn, accounts, token, **call)
        with pytest.raises(TypeError, match="Table or a mapped ORM class"):
            fenced_update(conn, "accounts", 1, where={"account": "x"}, values={"balance": 1})
    with pytest.raises(TypeError, match="Session, Connection"):
        fenced_update(engine, accounts, 1, where={"account": "x"}, values={"balance": 1})  # type: ignore[call-overload]


def test_upsert_refuses_a_key_in_values_and_an_empty_key(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        with pytest.raises(ConfigError, match="key columns"):
            fenced_upsert(conn, accounts, 1, key={"account": "x"}, values={"account": "y", "balance": 1})
        with pytest.raises(ConfigError, match="key must not be empty"):
            fenced_upsert(conn, accounts, 1, key={}, values={"balance": 1})


def test_upsert_on_another_dialect_is_a_clear_error_and_update_still_works() -> None:
    engine = sa.create_engine("sqlite://")
    metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(accounts.insert().values(account="a", balance=1))
            with pytest.raises(ConfigError, match="PostgreSQL and MySQL/MariaDB, not 'sqlite'"):
                fenced_upsert(conn, accounts, 1, key={"account": "a"}, values={"balance": 2})
            assert fenced_update(conn, accounts, 3, where={"account": "a"}, values={"balance": 2}) is True
            assert fenced_update(conn, accounts, 2, where={"account": "a"}, values={"balance": 9}) is False
    finally:
        engine.dispose()


# -- Alembic -----------------------------------------------------------------------------------


def test_the_alembic_operations_add_and_drop_a_nullable_bigint_fence(engine: sa.Engine) -> None:
    table = "ledger_" + uuid.uuid4().hex[:8]
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, amount INTEGER)"))
        conn.execute(sa.text(f"INSERT INTO {table} (id, amount) VALUES (1, 5)"))
        with Operations.context(MigrationContext.configure(conn)):
            add_fence_column(table)  # through alembic.op, as in a migration's upgrade()
        add_fence_column(table, column="other_fence", operations=Operations(MigrationContext.configure(conn)))
    columns = {c["name"]: c for c in sa.inspect(engine).get_columns(table)}
    for name in ("fence_token", "other_fence"):
        assert isinstance(columns[name]["type"], sa.BigInteger)
        assert columns[name]["nullable"] is True
    ledger = sa.Table(table, sa.MetaData(), autoload_with=engine)
    big = 1_764_000_000_000_000  # a Redis-clock token in µs needs BIGINT
    with engine.begin() as conn:
        assert fenced_update(conn, ledger, big, where={"id": 1}, values={"amount": 6}) is True
        assert conn.execute(sa.select(ledger.c.fence_token)).scalar() == big
        with Operations.context(MigrationContext.configure(conn)):
            drop_fence_column(table)
            drop_fence_column(table, column="other_fence")
    assert {c["name"] for c in sa.inspect(engine).get_columns(table)} == {"id", "amount"}


# -- a declarative model with fence_mapped_column, and the docs example ------------------------


class Declared(DeclarativeBase):
    pass


class Shipment(Declared):
    __tablename__ = "shipments"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    status: Mapped[str] = mapped_column(sa.String(20))
    fence_token: Mapped[int | None] = fence_mapped_column()


async def test_a_declarative_model_with_fence_mapped_column(write: Writer, engine: sa.Engine) -> None:
    Declared.metadata.create_all(engine)
    ident = random.randrange(1, 2**31)
    with Session(engine) as session, session.begin():
        session.add(Shipment(id=ident, status="new"))
    assert await write(fenced_update, Shipment, 9, where=Shipment.id == ident, values={"status": "sent"})
    assert not await write(fenced_update, Shipment, 8, where={"id": ident}, values={"status": "lost"})
    with Session(engine) as session:
        got = session.get(Shipment, ident)
        assert got is not None
        assert (got.status, got.fence_token) == ("sent", 9)
    columns = {c["name"]: c for c in sa.inspect(engine).get_columns("shipments")}
    assert isinstance(columns["fence_token"]["type"], sa.BigInteger)
    assert columns["fence_token"]["nullable"] is True


def test_the_docs_example(db: Database) -> None:
    # The first example of docs/guides/database.md ("In short") as it stands, on this test's database.
    block = block_with("fenced_upsert(conn")
    code = block.replace("postgresql+psycopg://postgres@127.0.0.1:5432/test", db.sync_url)
    assert code != block
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    engine = sa.create_engine(db.sync_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status, fence_token FROM payments")).one() == ("settled", 200)
    engine.dispose()
