"""The outbox against ``enqueue`` after commit, side by side in one run: ``python -m bench.outbox``.

Options: ``[--rounds 3] [--n 300] [--rows 20000]``.

Makes its own databases (``fk_bench_outbox_<random>`` on the PostgreSQL at 127.0.0.1:5432, user
postgres, and on the MariaDB at 127.0.0.1:3306, user root; both dropped at the end, also after an
error or Ctrl-C) and a private Redis, then, ``--rounds`` times, in turn:

1. **commit -> start latency**: a writer in this process sends ``--n`` tasks one at a time, 8 ms
   apart (so no two ride one batch, after 20 of warm-up), each in its own transaction on one
   connection: insert a small row into its own ``bench_order`` table, then either

   - ``plain enqueue after commit``: commit (PostgreSQL), then ``await client.enqueue(task)``;
   - ``outbox, PostgreSQL, LISTEN/NOTIFY``: ``enqueue_in(conn, task)`` then commit (the relay
     waits on the table's channel; ``enqueue_in``'s ``pg_notify`` wakes it at the commit);
   - ``outbox, PostgreSQL, polling``: the same with the relay's ``OutboxSql.can_listen`` patched
     to False (``unittest.mock.patch.object``, in the consumer process only): a bench-only
     switch that shows what a driver without LISTEN gets, a look every ``outbox_poll`` (0.2 s);
   - ``outbox, MariaDB, polling``: the same on MariaDB (no NOTIFY there: polling, 0.2 s).

   The commit time is ``time.time()`` taken as the commit returns (for the outbox the commit is
   when the row becomes visible to the relay); for the plain case the ``enqueue`` that follows
   is part of the figure, as it is of the user's path. The consumer is one fencekit ``Server``
   in a subprocess (``python -m bench.outbox --serve ...``: concurrency 16, logging at WARNING,
   uvloop when installed), started fresh for each case and round, with the relay of that
   case's database in its services (``outbox_url``, ``outbox_poll`` 0.2, ``outbox_batch``
   500); the plain case's Server is the PostgreSQL LISTEN one, its relay idle. Its task
   (``stamp``) takes ``time.time()`` first and then RPUSHes ``"<i> <start>"`` to a Redis
   list; start - commit of task i is its latency. p50 / p99 / mean in ms, and each outbox
   case ÷ plain. A subprocess, so the writer's own work does not sit on the consumer's loop.
2. **relay throughput on PostgreSQL** (no consumer runs; the tasks stay pending on queue
   ``outbox_tp``, purged after each case):

   - the writer's cost, µs per call, 500 calls a transaction, the commits included: ``--rows``
     plain INSERTs into ``bench_order`` of a row shaped and sized like an outbox row (two short
     strings, two integers, a text ``note`` as long as the task's JSON envelope) against ``--rows``
     ``enqueue_in(conn, task)`` calls (each one ``INSERT ... RETURNING pg_notify(...)``): their
     ratio, and the difference -- what the outbox adds to the user's transaction. Beside them,
     to see where it goes: ``outbox_row`` + its INSERT without the ``pg_notify``, ``outbox_row``
     alone (validate and encode the task; no database) and a ``SELECT pg_notify(...)`` alone (what
     a second statement for the notification would cost: ``enqueue_in`` rides it on the INSERT);
   - one ``Relay`` (``fencekit.services.relay``, in this process; its database connection
     opened before the rows are written) moving the ``--rows`` committed rows to Redis:
     ``await relay.relay_batch()`` until it returns 0, rows/s, with ``batch`` 500 (the default;
     it moves the rows ``enqueue_in`` wrote), 100 (the rows of the INSERTs without
     ``pg_notify``) and 2000 (rows of one bulk INSERT of 500 ``outbox_row`` values a
     transaction). After each drain the outbox table must be empty, the queue hold exactly
     ``--rows`` pending tasks and the relay have created ``--rows`` tasks, none deduped (else
     an error);
   - against it, the same number of tasks from one producer straight to Redis:
     ``client.enqueue`` one at a time, awaited (what a request handler does), and
     ``client.enqueue_many`` in chunks of 500: tasks/s (the queue checked the same way).

Prints the medians of the rounds, every round's figure and the ratios; no thresholds. On a
2-core machine the writer, the Server (its consumer and relay), Redis and the database share
the cores: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis.asyncio as aredis
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from bench.common import percentile, spawn, stop
from fencekit import Client, Task
from fencekit.produce.outbox import create_outbox, enqueue_in, outbox_row, outbox_table
from fencekit.settings import DEFAULT_OUTBOX_TABLE
from fencekit.testing import RedisServer

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
MARIA_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/"
MARIA_URL = "mysql+pymysql://root@127.0.0.1:3306/{db}"

LAT_QUEUE = "outbox_lat"
TP_QUEUE = "outbox_tp"
STAMPS = "bench:outbox:stamps"
GAP = 0.008  # s between two latency tasks
WARMUP = 20
TXN = 500  # rows per writer transaction in the throughput part
CHUNK = 500  # enqueue_many
POLL = 0.2
CONCURRENCY = 16
BATCHES = (500, 100, 2000)
TIMES = "\N{MULTIPLICATION SIGN}"

PLAIN = "plain enqueue after commit"
PG_LISTEN = "outbox, PostgreSQL, LISTEN/NOTIFY"
PG_POLL = "outbox, PostgreSQL, polling"
MARIA_POLL = "outbox, MariaDB, polling"
# (case, database, outbox?, relay listens?)
LATENCY_CASES = (
    (PLAIN, "pg", False, True),
    (PG_LISTEN, "pg", True, True),
    (PG_POLL, "pg", True, False),
    (MARIA_POLL, "maria", True, False),
)

Figures = dict[str, list[float]]


# -- the consumer (``--serve``: a Server in a subprocess) -------------------------------------


class Stamp:
    """Records its start: ``"<i> <time.time()>"`` RPUSHed to :data:`STAMPS` (the time taken first)."""

    queue = LAT_QUEUE
    operation = "stamp"
    redis: aredis.Redis | None = None

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        started = time.time()
        assert cls.redis is not None
        await cls.redis.rpush(STAMPS, f"{payload['i']} {started!r}")


def serve(redis_url: str, outbox_url: str, listen: bool) -> None:
    """Run the bench's consumer: a Server with the relay of ``outbox_url`` until SIGTERM."""
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    from unittest import mock

    from fencekit import Server
    from fencekit.services._relay_sql import OutboxSql

    async def run() -> None:
        Stamp.redis = aredis.Redis.from_url(redis_url)
        server = Server(
            redis_url, concurrency=CONCURRENCY, web_port=None, outbox_url=outbox_url, outbox_poll=POLL
        )
        server.add_workers(Stamp)
        try:
            await server.run()
        finally:
            await Stamp.redis.aclose()

    with contextlib.ExitStack() as patches:
        if not listen:  # bench-only: what a driver without LISTEN gets
            patches.enter_context(
                mock.patch.object(OutboxSql, "can_listen", new=property(lambda self: False))
            )
        asyncio.run(run())


# -- databases ---------------------------------------------------------------------------------


class Databases:
    """This run's PostgreSQL and MariaDB databases (created, then dropped by :meth:`drop`)."""

    def __init__(self) -> None:
        self.name = f"fk_bench_outbox_{secrets.token_hex(4)}"
        self.pg = PG_URL.format(db=self.name)
        self.maria = MARIA_URL.format(db=self.name)
        self.made: list[str] = []

    def create(self) -> None:
        admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        finally:
            admin.dispose()
        self.made.append("pg")
        admin = sa.create_engine(MARIA_ADMIN)
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f"CREATE DATABASE `{self.name}`"))
        finally:
            admin.dispose()
        self.made.append("maria")

    def drop(self) -> None:
        if "pg" in self.made:
            admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
            try:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
            finally:
                admin.dispose()
        if "maria" in self.made:
            admin = sa.create_engine(MARIA_ADMIN)
            try:
                with admin.connect() as conn:
                    conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{self.name}`"))
            finally:
                admin.dispose()
        self.made.clear()

    def url(self, which: str) -> str:
        return self.pg if which == "pg" else self.maria


ORDERS = sa.Table(
    "bench_order",
    sa.MetaData(),
    sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
    sa.Column("customer", sa.String(200), nullable=False),
    sa.Column("sku", sa.String(200), nullable=False),
    sa.Column("total", sa.BigInteger(), nullable=False),
    sa.Column("qty", sa.BigInteger(), nullable=False),
    sa.Column(  # as the outbox's envelope column
        "note",
        sa.Text().with_variant(
            mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
        ),
        nullable=False,
    ),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)


def _tables(url: str) -> sa.Engine:
    engine = sa.create_engine(url)
    create_outbox(engine)
    ORDERS.create(engine, checkfirst=True)
    return engine


SKU = "sku-" + "0" * 32  # as long as a jid


def _order(i: int, note: str = "") -> sa.Executable:
    """An order row; with ``note`` as long as an envelope, an outbox row's like (the columns too)."""
    return sa.insert(ORDERS).values(customer=f"customer-{i:05d}", sku=SKU, total=i, qty=1, note=note)


def _count(conn: sa.Connection) -> int:
    with conn.begin():
        return int(conn.execute(sa.select(sa.func.count()).select_from(outbox_table())).scalar_one())


# -- 1. commit -> start latency ----------------------------------------------------------------


def _client(url: str) -> Client:
    client = Client(url)
    client.logger.setLevel(logging.WARNING)  # enqueue logs each task at INFO otherwise
    return client


async def _send(
    conn: sa.Connection, client: Client, outbox: bool, first: int, n: int, committed: dict[int, float]
) -> None:
    for i in range(first, first + n):
        task = Task(LAT_QUEUE, "stamp", {"i": i})
        if outbox:
            with conn.begin():
                conn.execute(_order(i))
                enqueue_in(conn, task)
            committed[i] = time.time()
        else:
            with conn.begin():
                conn.execute(_order(i))
            committed[i] = time.time()
            await client.enqueue(task)
        await asyncio.sleep(GAP)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


async def _stamps(
    r: aredis.Redis, n: int, proc: subprocess.Popen[bytes], log: Path, timeout: float
) -> dict[int, float]:
    deadline = time.monotonic() + timeout
    while await r.llen(STAMPS) < n:
        if proc.poll() is not None:
            tail = _tail(log)
            raise RuntimeError(
                f"the Server exited ({proc.returncode}) before {n} tasks ran; its log:\n{tail}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"{await r.llen(STAMPS)} of {n} tasks ran within {timeout:g} s")
        await asyncio.sleep(0.01)
    stamps: dict[int, float] = {}
    for raw in await r.lrange(STAMPS, 0, -1):
        i, started = raw.split()
        stamps[int(i)] = float(started)
    return stamps


async def _latency_case(
    redis_url: str, dbs: Databases, case: tuple[str, str, bool, bool], n: int, log: Path
) -> list[float]:
    """One case: a fresh Server, the warm-up, then ``n`` tasks; their commit -> start in seconds."""
    _, which, outbox, listen = case
    argv = [sys.executable, "-m", "bench.outbox", "--serve", redis_url, "--outbox-url", dbs.url(which)]
    if not listen:
        argv.append("--no-listen")
    proc = spawn(argv, log)
    engine = sa.create_engine(dbs.url(which))
    try:
        async with _client(redis_url) as client:
            r = client.redis
            await r.delete(STAMPS)
            with engine.connect() as conn:
                committed: dict[int, float] = {}
                await _send(conn, client, outbox, 0, WARMUP, committed)
                await _stamps(r, WARMUP, proc, log, 60.0)  # also: the Server is up, its relay listening
                await asyncio.sleep(2 * POLL)
                await r.delete(STAMPS)
                committed.clear()
                await _send(conn, client, outbox, WARMUP, n, committed)
                stamps = await _stamps(r, n, proc, log, 60.0)
            if sorted(stamps) != sorted(committed):
                raise RuntimeError(f"{case[0]}: the tasks that ran are not the {n} sent")
            return [stamps[i] - committed[i] for i in committed]
    finally:
        engine.dispose()
        stop(proc)


# -- 2. relay throughput -----------------------------------------------------------------------


def _tp_task(i: int) -> Task:
    return Task(TP_QUEUE, "ship", {"order": i, "sku": "SKU-0042", "qty": 1})


def _per_call_us(run: Callable[[], object], rows: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / rows * 1e6


def _chunks(rows: int) -> Iterator[range]:
    for first in range(0, rows, TXN):
        yield range(first, min(first + TXN, rows))


def _insert_orders(conn: sa.Connection, rows: int, note: str) -> None:
    for chunk in _chunks(rows):
        with conn.begin():
            for i in chunk:
                conn.execute(_order(i, note))


def _enqueue_in(conn: sa.Connection, rows: int) -> None:
    for chunk in _chunks(rows):
        with conn.begin():
            for i in chunk:
                enqueue_in(conn, _tp_task(i))


def _notify(conn: sa.Connection, rows: int) -> None:
    name = outbox_table().name
    for chunk in _chunks(rows):
        with conn.begin():
            for _ in chunk:
                conn.execute(sa.select(sa.func.pg_notify(name, "")))  # as a statement of its own


def _insert_rows(conn: sa.Connection, rows: int) -> None:
    table = outbox_table()
    for chunk in _chunks(rows):
        with conn.begin():
            for i in chunk:
                conn.execute(sa.insert(table).values(outbox_row(_tp_task(i))._asdict()))


def _bulk_outbox(conn: sa.Connection, rows: int) -> None:
    table = outbox_table()
    for chunk in _chunks(rows):
        values = [outbox_row(_tp_task(i))._asdict() for i in chunk]
        with conn.begin():
            conn.execute(sa.insert(table), values)


async def _check_moved(client: Client, conn: sa.Connection, rows: int, what: str) -> None:
    left, pending = _count(conn), await client.queue(TP_QUEUE).length()
    if left or pending != rows:
        raise RuntimeError(f"{what}: {left} rows left in the outbox, {pending} tasks pending of {rows}")


async def _purge(client: Client) -> None:
    queue = client.queue(TP_QUEUE)
    await queue.purge()
    if await queue.length():
        raise RuntimeError("the throughput queue is not empty after its purge")


def _quiet() -> logging.Logger:
    logger = logging.getLogger("bench.outbox.relay")
    logger.setLevel(logging.WARNING)
    return logger


async def _relay_drain(
    client: Client, conn: sa.Connection, url: str, batch: int, rows: int, fill: Callable[[], None]
) -> float:
    """Rows/s of one Relay moving the ``rows`` committed rows ``fill`` writes."""
    from fencekit.services.relay import Relay

    relay = Relay(
        client.redis, client.keys, url, table=DEFAULT_OUTBOX_TABLE, batch=batch, poll=POLL, logger=_quiet()
    )
    try:
        if await relay.relay_batch():  # opens its connection before the clock starts
            raise RuntimeError("the outbox was not empty before a fill")
        fill()
        if _count(conn) != rows:
            raise RuntimeError(f"batch {batch}: {_count(conn)} rows in the outbox, not {rows}")
        started = time.perf_counter()
        while await relay.relay_batch():
            pass
        took = time.perf_counter() - started
    finally:
        await relay.close()
    if relay.stats.relayed != rows or relay.stats.deduped:
        raise RuntimeError(f"batch {batch}: relayed {relay.stats.relayed}, deduped {relay.stats.deduped}")
    await _check_moved(client, conn, rows, f"relay batch {batch}")
    await _purge(client)
    return rows / took


async def _throughput_round(redis_url: str, pg_url: str, rows: int, out: Figures) -> None:
    def add(key: str, value: float) -> None:
        out.setdefault(key, []).append(value)

    note = "n" * len(outbox_row(_tp_task(0)).envelope)  # an order row the size of an outbox row
    engine = sa.create_engine(pg_url)
    try:
        async with _client(redis_url) as client:
            with engine.connect() as conn:
                add("order insert", _per_call_us(lambda: _insert_orders(conn, rows, note), rows))
                with conn.begin():
                    conn.execute(sa.delete(ORDERS))
                add("outbox_row", _per_call_us(lambda: [outbox_row(_tp_task(i)) for i in range(rows)], rows))
                add("pg_notify", _per_call_us(lambda: _notify(conn, rows), rows))
                fills: dict[int, Callable[[], None]] = {  # the rows each relay drain moves
                    500: lambda: add("enqueue_in", _per_call_us(lambda: _enqueue_in(conn, rows), rows)),
                    100: lambda: add("outbox insert", _per_call_us(lambda: _insert_rows(conn, rows), rows)),
                    2000: lambda: _bulk_outbox(conn, rows),
                }
                for batch in BATCHES:
                    add(f"relay {batch}", await _relay_drain(client, conn, pg_url, batch, rows, fills[batch]))
            tasks = [_tp_task(i) for i in range(rows)]
            started = time.perf_counter()
            for task in tasks:
                await client.enqueue(task)
            add("enqueue", rows / (time.perf_counter() - started))
            with engine.connect() as conn:
                await _check_moved(client, conn, rows, "enqueue")
            await _purge(client)
            tasks = [_tp_task(i) for i in range(rows)]
            started = time.perf_counter()
            for first in range(0, rows, CHUNK):
                await client.enqueue_many(tasks[first : first + CHUNK])
            add("enqueue_many", rows / (time.perf_counter() - started))
            with engine.connect() as conn:
                await _check_moved(client, conn, rows, "enqueue_many")
            await _purge(client)
    finally:
        engine.dispose()


# -- the run -----------------------------------------------------------------------------------


def _rounds(values: list[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)


def _line(label: str, value: str, rounds: list[float], fmt: str, width: int = 44) -> None:
    print(f"    {label:{width}} {value}   rounds: {_rounds(rounds, fmt)}")


def _report(args: argparse.Namespace, f: Figures) -> None:
    med = {key: statistics.median(values) for key, values in f.items()}
    print(
        f"1. commit -> task start, {args.n} tasks one at a time ({GAP * 1000:g} ms apart), one Server "
        f"(subprocess, -c {CONCURRENCY}), outbox_poll {POLL:g} s; median of {args.rounds} rounds, ms"
    )
    head = ("case", "p50", "p99", "mean", "p50 ÷ plain", "p99 ÷ plain", "mean ÷ plain")
    print(f"  {head[0]:34} {head[1]:>8} {head[2]:>8} {head[3]:>8} {head[4]:>12} {head[5]:>12} {head[6]:>12}")
    for case, *_ in LATENCY_CASES:
        p50, p99, mean = (med[f"{case} {what}"] for what in ("p50", "p99", "mean"))
        ratios = (p50 / med[PLAIN + " p50"], p99 / med[PLAIN + " p99"], mean / med[PLAIN + " mean"])
        print(
            f"  {case:34} {p50:>8.2f} {p99:>8.2f} {mean:>8.2f} "
            + " ".join(f"{TIMES + format(x, '.1f'):>12}" for x in ratios)
        )
    for case, *_ in LATENCY_CASES:
        print(
            f"  rounds, {case}: p50 {_rounds(f[case + ' p50'], '.2f')}; "
            f"p99 {_rounds(f[case + ' p99'], '.2f')}; mean {_rounds(f[case + ' mean'], '.2f')}"
        )
    print()
    print(f"2. PostgreSQL, {args.rows:,} rows / tasks, median of {args.rounds} rounds")
    order, call = med["order insert"], med["enqueue_in"]
    print(f"  the writer, µs per call, {TXN} calls a transaction (the commits included):")
    _line("INSERT of an order row of the same size", f"{order:>8.1f}", f["order insert"], ".1f")
    _line("enqueue_in (INSERT ... RETURNING pg_notify)", f"{call:>8.1f}", f["enqueue_in"], ".1f")
    _line(
        "  outbox_row + its INSERT, no pg_notify", f"{med['outbox insert']:>8.1f}", f["outbox insert"], ".1f"
    )
    _line("  outbox_row alone (validate, encode)", f"{med['outbox_row']:>8.1f}", f["outbox_row"], ".1f")
    _line("  a SELECT pg_notify of its own", f"{med['pg_notify']:>8.1f}", f["pg_notify"], ".1f")
    print(
        f"    enqueue_in ÷ INSERT {TIMES}{call / order:.2f}: the outbox adds {call - order:.1f} µs per task"
    )
    print("  moving the rows to Redis (one Relay) / enqueueing straight to Redis (one producer), per s:")
    single, many = med["enqueue"], med["enqueue_many"]
    for batch in BATCHES:
        rate = med[f"relay {batch}"]
        label = f"relay, batch {batch}" + (" (default)" if batch == 500 else "")
        value = f"{rate:>8,.0f} rows/s   ÷ enqueue {TIMES}{rate / single:.2f}, "
        value += f"÷ enqueue_many {TIMES}{rate / many:.2f}"
        _line(label, value, f[f"relay {batch}"], ",.0f", 26)
    _line("enqueue, one at a time", f"{single:>8,.0f} tasks/s", f["enqueue"], ",.0f", 26)
    _line(f"enqueue_many, {CHUNK} a call", f"{many:>8,.0f} tasks/s", f["enqueue_many"], ",.0f", 26)


async def _round(redis_url: str, dbs: Databases, args: argparse.Namespace, home: Path, out: Figures) -> None:
    for case in LATENCY_CASES:
        name = case[0]
        lat = await _latency_case(redis_url, dbs, case, args.n, home / "server.log")
        ms = [x * 1000 for x in lat]
        out.setdefault(f"{name} p50", []).append(percentile(ms, 0.50))
        out.setdefault(f"{name} p99", []).append(percentile(ms, 0.99))
        out.setdefault(f"{name} mean", []).append(statistics.fmean(ms))
    await _throughput_round(redis_url, dbs.pg, args.rows, out)


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m bench.outbox", description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=300, help="tasks per latency case and round")
    parser.add_argument("--rows", type=int, default=20_000, help="rows / tasks per throughput case and round")
    parser.add_argument("--serve", metavar="REDIS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--outbox-url", help=argparse.SUPPRESS)
    parser.add_argument("--no-listen", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.outbox_url, listen=not args.no_listen)
        return
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="fk_bench_outbox_"))
    server = RedisServer(home / "redis")
    dbs = Databases()
    try:
        server.start()
        dbs.create()
        for which in ("pg", "maria"):
            _tables(dbs.url(which)).dispose()
        figures: Figures = {}
        for _ in range(args.rounds):
            asyncio.run(_round(server.url(), dbs, args, home, figures))
        _report(args, figures)
        print(f"({time.monotonic() - started:.0f} s, load average now {os.getloadavg()[0]:.2f})")
    finally:
        try:
            dbs.drop()
        finally:
            server.cleanup()
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
