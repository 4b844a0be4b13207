"""THE race, on real processes: a delivery paused past its lease cannot overwrite the redelivery's row.

A fencekit Server runs in a child process (``ServerProcess``). Its job reads
its token, writes a "ready" file and waits for a "go" file just before its
``fenced_update``. The test SIGSTOPs the child; its heartbeat lapses, a Server
in this process reaps it and redelivers the job with a larger token, and that
second delivery's ``fenced_update`` commits. Then the test creates the go file
and SIGCONTs the child: its late ``fenced_update`` changes 0 rows (``False``,
and ``FencedOutError`` with ``raise_on_stale=True``). The row holds the second
delivery's values and token. Run on the real PostgreSQL and MariaDB.
"""

from __future__ import annotations

import json
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from tests.queue_helpers import ServerProcess, eventually, new_server, running
from tests.sql_helpers import Database, own_database

from fencekit import Client, Task, current_job
from fencekit.integrations.sql import fence_column, fenced_update

pytestmark = pytest.mark.slow

metadata = sa.MetaData()
orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("status", sa.String(40), nullable=False),
    sa.Column("written_by", sa.String(40)),
    fence_column(),
)

CHILD = textwrap.dedent(
    '''
    """A Server whose job pauses just before its fenced UPDATE. argv: url queue ttl grace db_url dir"""
    import asyncio
    import json
    import os
    import sys
    from pathlib import Path

    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    from fencekit import FencedOutError, Server, current_job
    from fencekit.integrations.sql import fenced_update

    URL, QUEUE, TTL, GRACE, DB_URL, DIR = sys.argv[1:7]
    DIR = Path(DIR)
    orders = sa.Table(
        "orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("status", sa.String(40)), sa.Column("written_by", sa.String(40)),
        sa.Column("fence_token", sa.BigInteger),
    )
    engine = sa.create_engine(DB_URL, poolclass=NullPool)


    class ShipWorker:
        queue = QUEUE
        operation = "ship"

        @classmethod
        async def perform(cls, payload):
            token = current_job().token
            (DIR / "ready").write_text(str(token.value))
            while not (DIR / "go").exists():
                await asyncio.sleep(0.02)
            values = {"status": "shipped", "written_by": f"first-{os.getpid()}"}
            with engine.begin() as conn:
                applied = fenced_update(conn, orders, token, where={"id": payload["id"]}, values=values)
            try:
                with engine.begin() as conn:
                    fenced_update(
                        conn, orders, token, where={"id": payload["id"]}, values=values, raise_on_stale=True
                    )
                raised = None
            except FencedOutError as exc:
                raised = str(exc)
            (DIR / "result.tmp").write_text(json.dumps({"applied": applied, "raised": raised}))
            (DIR / "result.tmp").rename(DIR / "result")
            return "first"


    server = Server(redis_url=URL, heartbeat_ttl=float(TTL), grace=float(GRACE), web_port=0)
    server.add_workers(ShipWorker)
    asyncio.run(server.run())
    '''
)


@pytest.fixture(params=["postgresql", "mariadb"])
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    with own_database(request.param, "race") as database:
        engine = sa.create_engine(database.sync_url, poolclass=NullPool)
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(orders.insert().values(id=1, status="new"))
        engine.dispose()
        yield database


@pytest.fixture
def child_procs() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for proc in started:
        proc.close()  # SIGCONT then SIGKILL if still running


def read_row(db: Database) -> dict[str, Any]:
    engine = sa.create_engine(db.sync_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(sa.select(orders)).mappings().one())
    finally:
        engine.dispose()


async def test_a_delivery_paused_past_its_lease_is_fenced_out_of_the_sql_row(
    tmp_path: Path, redis_url: str, db: Database, child_procs: list[ServerProcess]
) -> None:
    work = tmp_path / "race"
    work.mkdir()
    child = ServerProcess(
        tmp_path, redis_url, "orders", ttl=1.0, source=CHILD, extra_args=(db.sync_url, str(work))
    )
    child_procs.append(child)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("orders", "ship", {"id": 1}))
    try:
        # written by the child (open, then write): wait for its content, not for the file
        await eventually(
            lambda: (work / "ready").exists() and (work / "ready").read_text().strip(),
            timeout=20,
            what="first delivery ready",
        )
    except TimeoutError:
        raise AssertionError(f"the child never started the job; its log:\n{child.log()}") from None
    first_token = int((work / "ready").read_text())
    child.signal(signal.SIGSTOP)  # paused just before its UPDATE, lease running out

    second: list[int] = []
    aengine = create_async_engine(db.async_url, poolclass=NullPool)

    class ShipWorker:  # the same (queue, operation): the redelivery lands here
        queue = "orders"
        operation = "ship"

        @classmethod
        async def perform(cls, payload: dict[str, Any]) -> str:
            token = current_job().token
            async with aengine.begin() as conn:
                applied = await fenced_update(
                    conn, orders, token, where={"id": payload["id"]},
                    values={"status": "shipped", "written_by": "second"},
                )  # fmt: skip
            assert applied is True
            second.append(token.value)
            return "second"

    try:
        server = new_server(redis_url, ShipWorker, heartbeat_ttl=1.0)
        async with running(server):
            await eventually(lambda: second, timeout=15, what="the redelivery committed")
            assert read_row(db)["written_by"] == "second"
            (work / "go").touch()
            child.signal(signal.SIGCONT)
            try:
                await eventually(
                    lambda: (work / "result").exists(), timeout=15, what="the first delivery's write"
                )
            except TimeoutError:
                raise AssertionError(f"the resumed child never wrote; its log:\n{child.log()}") from None
            async with Client(redis_url=redis_url) as client:
                assert await client.result(jid, timeout=10) == "second"
    finally:
        child.signal(signal.SIGCONT)
        await aengine.dispose()

    result = json.loads((work / "result").read_text())
    (second_token,) = second
    assert second_token > first_token  # the redelivery holds the larger token
    assert result["applied"] is False  # the late UPDATE changed 0 rows
    assert result["raised"] is not None
    assert f"token {first_token}" in result["raised"]
    assert str(second_token) in result["raised"]
    got = read_row(db)
    assert (got["status"], got["written_by"], got["fence_token"]) == ("shipped", "second", second_token)
    child.signal(signal.SIGTERM)
    assert child.wait(15) == 0
