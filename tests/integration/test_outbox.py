"""The transactional outbox on the machine's real PostgreSQL and MariaDB and a real Redis.

Writing: ``enqueue_in`` inside a SQLAlchemy transaction (Session, Connection, and their asyncio
forms) writes a row that only its commit makes visible; a rollback leaves nothing. Relaying: a
``Server`` given ``outbox_url`` moves committed rows to Redis and runs them; a push repeated
after a relay failed between the push and the delete enqueues once, even when the first run
finished and kept no record. Bad input is a clear error; a database that is not there yet is
waited for, said once, and relayed from when it comes. The fault campaign (killed relays and
pools, a restarted Redis, many writers) is ``test_outbox_faults.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from tests.docs_blocks import block_with
from tests.queue_helpers import eventually, messages, new_server, pending, scheduled, stats
from tests.sql_helpers import Database, own_database

from fencekit import App, Client, ConfigError, PayloadError, Server, Task
from fencekit.integrations.sql import outbox
from fencekit.integrations.sql.outbox import create_outbox, enqueue_in
from fencekit.runtime.exits import ExitCode
from fencekit.services.relay import Relay

ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("item", sa.String(40), nullable=False),
    sa.Column("jid", sa.String(200)),
)

RUNS: list[tuple[str, dict[str, Any]]] = []


class Ship:
    queue = "shipping"
    operation = "ship"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> str:
        from fencekit import current_job

        RUNS.append((current_job().jid, payload))
        return f"shipped {payload['order']}"


@pytest.fixture(params=["postgresql", "mariadb"])
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    with own_database(request.param, "outbox") as database:
        engine = sa.create_engine(database.sync_url)
        try:
            ORDERS.create(engine)
            create_outbox(engine)
        finally:
            engine.dispose()
        yield database


@pytest.fixture
def engine(db: Database) -> Iterator[sa.Engine]:
    engine = sa.create_engine(db.sync_url)
    yield engine
    engine.dispose()


@pytest.fixture(autouse=True)
def _no_runs() -> None:
    RUNS.clear()


def outbox_rows(engine: sa.Engine) -> list[str]:
    table = outbox.outbox_table()
    with engine.connect() as conn:
        return [row.jid for row in conn.execute(sa.select(table.c.jid).order_by(table.c.id))]


@contextlib.asynccontextmanager
async def serving(redis_url: str, db: Database, **options: Any) -> AsyncIterator[Server]:
    """A Server running Ship that relays ``db``'s outbox."""
    options.setdefault("web_port", None)
    server = new_server(redis_url, Ship, outbox_url=db.sync_url, outbox_poll=0.05, **options)
    run = asyncio.create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 15)
        yield server
    finally:
        server.stop()
        await asyncio.wait_for(run, 30)


def order(session: Session | sa.Connection, item: str) -> str:
    """The user's transaction: an order row and the task that ships it, its jid stored with it."""
    jid = enqueue_in(session, Task("shipping", "ship", {"order": item}))
    session.execute(sa.insert(ORDERS).values(item=item, jid=jid))
    return jid


# -- writing -----------------------------------------------------------------------------------


async def test_a_committed_session_enqueues_its_task_and_a_rolled_back_one_nothing(
    db: Database, engine: sa.Engine, redis_url: str, raw: redis.Redis
) -> None:
    with Session(engine) as session:
        kept = order(session, "chessboard")
        assert outbox_rows(engine) == []  # not visible before the commit
        session.commit()
    with Session(engine) as session:
        dropped = order(session, "clock")
        session.rollback()
    with engine.connect() as conn:  # a Connection's transaction decides the same way
        kept_too = order(conn, "pieces")
        conn.commit()
    with engine.connect() as conn:
        order(conn, "timer")
        conn.rollback()
    assert outbox_rows(engine) == [kept, kept_too]
    with engine.connect() as conn:
        assert conn.execute(sa.select(ORDERS.c.jid).order_by(ORDERS.c.id)).scalars().all() == [kept, kept_too]
    async with serving(redis_url, db):
        await eventually(lambda: len(RUNS) == 2, 15, what="the two committed orders shipped")
        assert [jid for jid, _ in RUNS] == [kept, kept_too]
        assert [p["order"] for _, p in RUNS] == ["chessboard", "pieces"]
        await eventually(lambda: outbox_rows(engine) == [], 5, what="the relayed rows deleted")
        await eventually(lambda: not raw.keys("fencekit:{shipping}:relayed:*"), 5, what="markers gone")
        await asyncio.sleep(0.3)  # the rolled-back ones had their chance
    assert dropped not in [jid for jid, _ in RUNS]
    assert len(RUNS) == 2
    async with Client(redis_url) as client:
        assert await client.result(kept, queue="shipping") == "shipped chessboard"


async def test_the_asyncio_session_and_connection_write_the_same_rows(
    db: Database, engine: sa.Engine, redis_url: str
) -> None:
    aengine = create_async_engine(db.async_url)
    try:
        async with AsyncSession(aengine) as session:
            kept = await enqueue_in(session, Task("shipping", "ship", {"order": "async-1"}))
            await session.commit()
        async with AsyncSession(aengine) as session:
            await enqueue_in(session, Task("shipping", "ship", {"order": "async-2"}))
            await session.rollback()
        async with aengine.connect() as conn:
            kept_too = await enqueue_in(conn, Task("shipping", "ship", {"order": "async-3"}))
            await conn.commit()
    finally:
        await aengine.dispose()
    assert outbox_rows(engine) == [kept, kept_too]
    async with serving(redis_url, db):
        await eventually(lambda: len(RUNS) == 2, 15, what="the committed ones shipped")
    assert sorted(p["order"] for _, p in RUNS) == ["async-1", "async-3"]


async def test_a_task_function_writes_into_the_outbox_with_its_app_settings(
    db: Database, engine: sa.Engine, redis_url: str, raw: redis.Redis
) -> None:
    app = App(redis_url=redis_url, keep_result=0)

    @app.task(queue="shipping")
    async def label(order: str, copies: int = 1) -> str:
        return order * copies

    with Session(engine) as session:
        jid = label.enqueue_in(session, "board", copies=2)
        later = label.options(delay=60).enqueue_in(session, "late")
        session.commit()
    assert outbox_rows(engine) == [jid, later]
    server = new_server(redis_url, outbox_url=db.sync_url, outbox_poll=0.05, web_port=None)
    server.add_workers(label)
    run = asyncio.create_task(server.run())
    try:
        await eventually(lambda: stats(raw, "shipping").get("processed", 0) == 1, 15, what="label ran")
        assert not raw.exists(f"fencekit:{{shipping}}:job:{jid}")  # the app's keep_result=0
        [(envelope, due)] = scheduled(raw, "shipping")
        assert envelope["jid"] == later
        assert 55_000 < due - time.time() * 1000 <= 60_000
    finally:
        server.stop()
        await asyncio.wait_for(run, 30)


def test_bad_input_is_a_clear_error_and_writes_nothing(db: Database, engine: sa.Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(PayloadError, match="unique_key"):
            enqueue_in(session, Task("shipping", "ship", {}, unique_key="k"))
        with pytest.raises(PayloadError, match="takes a Task"):
            enqueue_in(session, {"queue": "shipping"})  # type: ignore[call-overload]
        with pytest.raises(PayloadError, match="delay or at"):
            enqueue_in(session, Task("shipping", "ship", {}), delay=1, at=datetime.now(timezone.utc))
        with pytest.raises(PayloadError):
            enqueue_in(session, Task("shipping", "ship", {"x": object()}))
        with pytest.raises(PayloadError, match=r"max_payload|bytes"):
            enqueue_in(session, Task("shipping", "ship", {"x": "y" * 5000}), max_payload=1000)
        with pytest.raises(ConfigError, match="outbox table"):
            enqueue_in(session, Task("shipping", "ship", {}), table="orders; DROP TABLE orders")
        with pytest.raises(TypeError, match="Session, Connection"):
            enqueue_in(engine, Task("shipping", "ship", {}))  # type: ignore[call-overload]
        session.commit()
    assert outbox_rows(engine) == []
    lite = sa.create_engine("sqlite://")
    try:
        with Session(lite) as session, pytest.raises(ConfigError, match="PostgreSQL or MariaDB"):
            enqueue_in(session, Task("shipping", "ship", {}))
        with pytest.raises(ConfigError, match="PostgreSQL or MariaDB"):
            create_outbox(lite)
    finally:
        lite.dispose()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite:///x.db", "PostgreSQL or MariaDB"),
        ("not a url", "outbox_url"),
        ("postgresql+asyncpg://postgres@127.0.0.1/test", "sync"),
        ("mysql+aiomysql://root@127.0.0.1/test", "sync"),
    ],
)
def test_a_server_given_an_outbox_url_it_cannot_relay_says_so_before_it_starts(
    url: str, says: str, redis_url: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        asyncio.run(new_server(redis_url, Ship, outbox_url=url, web_port=None).run())


# -- relaying exactly once -----------------------------------------------------------------------


class Failed(Exception):
    """Raised by the test hook between a batch's push and its delete: the batch is abandoned."""


async def test_a_push_repeated_after_a_failed_delete_enqueues_once_even_after_the_run_left_no_record(
    db: Database, engine: sa.Engine, redis_url: str, raw: redis.Redis
) -> None:
    with Session(engine) as session:
        jids = [enqueue_in(session, Task("shipping", "ship", {"order": n}, keep_result=0)) for n in range(5)]
        session.commit()
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Client(redis_url).keys
    logger = logging.getLogger("test.outbox.relay")
    failing = Relay(client, keys, db.sync_url, table="fencekit_outbox", logger=logger, after_push=_fail)
    try:
        with pytest.raises(Failed):
            await failing.relay_batch()  # pushed; the delete never ran: the rows stay
    finally:
        await failing.close()
    assert outbox_rows(engine) == jids
    assert [e["jid"] for e in pending(raw, "shipping")] == jids  # in the rows' order
    server = new_server(redis_url, Ship, keep_result=0, web_port=None)  # runs them; no relay
    run = asyncio.create_task(server.run())
    try:
        await eventually(lambda: stats(raw, "shipping").get("processed") == 5, 15, what="five runs")
    finally:
        server.stop()
        await asyncio.wait_for(run, 30)
    assert not raw.exists(f"fencekit:{{shipping}}:job:{jids[0]}")  # finished, no record to dedupe by
    relay = Relay(client, keys, db.sync_url, table="fencekit_outbox", logger=logger)
    try:
        assert await relay.relay_batch() == 5  # the rows pushed again ...
    finally:
        await relay.close()
        await client.aclose()
    assert (relay.stats.relayed, relay.stats.deduped) == (0, 5)  # ... enqueue nothing
    assert pending(raw, "shipping") == []
    assert stats(raw, "shipping")["deduped"] == 5
    assert outbox_rows(engine) == []
    assert not raw.keys("fencekit:{shipping}:relayed:*")  # the rows are gone: so are the markers
    assert sorted(jid for jid, _ in RUNS) == sorted(jids)


def _fail(rows: object) -> None:
    raise Failed


async def test_a_relay_waits_for_a_table_not_there_yet_says_so_once_and_relays_when_it_comes(
    db: Database, engine: sa.Engine, redis_url: str
) -> None:
    async with serving(redis_url, db, outbox_table="late_outbox") as server:
        await eventually(
            lambda: any("outbox relay" in m for m in messages(server.logger)), 10, what="the failure said"
        )
        await asyncio.sleep(1.5)  # several failed rounds
        said = [m for m in messages(server.logger) if "outbox relay failed" in m]
        assert len(said) == 1, said  # then a line only when the back-off grows, as every loop's
        assert "late_outbox" in said[0]
        create_outbox(engine, "late_outbox")
        with Session(engine) as session:
            enqueue_in(session, Task("shipping", "ship", {"order": "late"}), table="late_outbox")
            session.commit()
        await eventually(lambda: len(RUNS) == 1, 15, what="the row relayed once the table came")
        await eventually(
            lambda: any("outbox relay recovered" in m for m in messages(server.logger)), 5, what="recovered"
        )


async def test_metrics_show_the_outbox_backlog_and_what_was_relayed(
    db: Database, engine: sa.Engine, redis_url: str
) -> None:
    with Session(engine) as session:
        for n in range(3):
            order(session, f"m{n}")
        session.commit()
    async with serving(redis_url, db, web_port=0) as server:
        await eventually(lambda: len(RUNS) == 3, 15, what="three shipped")
        assert server.web is not None
        url = f"http://127.0.0.1:{server.web.port}/metrics"

        def read() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())

        text = await asyncio.to_thread(read)
    assert "fencekit_outbox_relayed_total 3.0" in text
    assert "fencekit_outbox_deduped_total 0.0" in text
    assert "fencekit_outbox_rows " in text  # the first count, taken before the first batch
    assert "fencekit_outbox_lag_seconds " in text


# -- fencekit relay --------------------------------------------------------------------------------


def fencekit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencekit", *args], capture_output=True, text=True, timeout=timeout
    )


def test_fencekit_relay_without_a_database_or_with_a_bad_one_exits_2(redis_url: str) -> None:
    result = fencekit("relay", "--redis-url", redis_url)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "--sql-url" in result.stderr
    result = fencekit("relay", "--redis-url", redis_url, "--sql-url", "sqlite:///x.db")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "PostgreSQL or MariaDB" in result.stderr
    result = fencekit("relay", "--redis-url", redis_url, "--sql-url", "nope://")
    assert result.returncode == ExitCode.USAGE, result.stderr


def test_fencekit_relay_moves_committed_rows_until_sigterm(
    db: Database, engine: sa.Engine, redis_url: str, raw: redis.Redis
) -> None:
    with Session(engine) as session:
        jids = [order(session, f"cli{n}") for n in range(4)]
        session.commit()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencekit", "relay", "--json", "--redis-url", redis_url, "--sql-url",
         db.sync_url, "--outbox-poll", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while len(pending(raw, "shipping")) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(e["jid"] for e in pending(raw, "shipping")) == sorted(jids)
        while outbox_rows(engine) and time.monotonic() < deadline:  # deleted just after the push
            time.sleep(0.05)
        assert outbox_rows(engine) == []
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == ExitCode.OK, err
    assert json.loads(out.strip().splitlines()[-1]) == {"relayed": 4, "deduped": 0}
    assert "relaying the outbox fencekit_outbox" in out + err
    assert db.name in out + err


# -- Django ------------------------------------------------------------------------------------------


async def test_django_writes_the_outbox_in_its_own_transactions(
    db: Database, redis_url: str, raw: redis.Redis, tmp_path: Path
) -> None:
    """Django in a process of its own (``django_outbox_cases.py``) creates its own outbox table
    with the migration operation and writes; this process relays what it committed."""
    with own_database(db.kind, "djoutbox") as own:
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(Path(__file__).with_name("django_outbox_cases.py")), own.kind, own.name],
            env={**os.environ, "FK_DJANGO_APP_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.split("\n")
        assert "ok" in lines
        committed = [line.split()[1] for line in lines if line.startswith("committed ")]
        rolled_back = [line.split()[1] for line in lines if line.startswith("rolled-back ")]
        assert (len(committed), len(rolled_back)) == (2, 1)
        client = redis.asyncio.Redis.from_url(redis_url)
        relay = Relay(client, Client(redis_url).keys, own.sync_url, table="fencekit_outbox",
                      logger=logging.getLogger("test.outbox.django"))  # fmt: skip
        try:
            assert await relay.relay_batch() == 2
        finally:
            await relay.close()
            await client.aclose()
    assert sorted(e["jid"] for e in pending(raw, "work")) == sorted(committed)


# -- the guide's example ---------------------------------------------------------------------------


async def test_the_guides_example_commits_an_order_and_its_shipping_job(
    db: Database, redis_url: str, raw: redis.Redis
) -> None:
    """docs/guides/outbox.md's first block as it stands, on this test's database, then relayed."""
    block = block_with("ship.enqueue_in(session, order_id)")
    code = block.replace("postgresql+psycopg://postgres@127.0.0.1:5432/test", db.sync_url)
    assert code != block
    namespace: dict[str, Any] = {}
    await asyncio.to_thread(exec, code, namespace)
    namespace["engine"].dispose()
    server = new_server(redis_url, outbox_url=db.sync_url, outbox_poll=0.05, web_port=None)
    server.add_workers(namespace["ship"])
    run = asyncio.create_task(server.run())
    try:
        await eventually(lambda: stats(raw, "shipping").get("processed") == 1, 15, what="shipped")
        async with Client(redis_url) as client:
            result = await client.result(namespace["jid"], queue="shipping", timeout=15)
    finally:
        server.stop()
        await asyncio.wait_for(run, 30)
    assert result == "label for order 1"


def test_the_issues_names_reach_the_same_functions() -> None:
    """``fencekit.sql.outbox`` and ``fencekit.django`` (the short paths, deprecated since 0.2 as
    every ``fencekit.sql`` path) are the same modules as their homes under ``integrations``."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import fencekit.sql.outbox, fencekit.django, fencekit.integrations.sql.outbox as home\n"
        "import fencekit.integrations.django as dj\n"
        "assert fencekit.sql.outbox.enqueue_in is home.enqueue_in\n"
        "assert fencekit.django.enqueue_in is dj.enqueue_in\n"
        "assert fencekit.django.create_outbox_operation is dj.create_outbox_operation\n"
        "print('same')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "same", result.stderr


def test_the_alembic_operations_create_an_outbox_the_relay_reads_and_drop_it(
    db: Database, engine: sa.Engine
) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    from fencekit.integrations.sql.alembic import create_outbox_table, drop_outbox_table

    with engine.begin() as conn, Operations.context(MigrationContext.configure(conn)):
        create_outbox_table("migrated_outbox")  # through alembic.op, as in a migration's upgrade()
    columns = {c["name"] for c in sa.inspect(engine).get_columns("migrated_outbox")}
    assert columns == {"id", "queue", "jid", "due_ms", "keep_ms", "envelope", "created_at"}
    with Session(engine) as session:
        jid = enqueue_in(session, Task("shipping", "ship", {"order": "m"}), table="migrated_outbox")
        session.commit()
    with engine.connect() as conn:
        envelope = conn.execute(sa.text("SELECT envelope FROM migrated_outbox")).scalar_one()
    assert json.loads(envelope)["jid"] == jid  # the task, readable as JSON text
    with engine.begin() as conn:
        drop_outbox_table("migrated_outbox", operations=Operations(MigrationContext.configure(conn)))
    assert "migrated_outbox" not in sa.inspect(engine).get_table_names()
