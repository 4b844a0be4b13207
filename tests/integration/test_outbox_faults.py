"""The outbox's exactly-once under real faults, on the machine's PostgreSQL and MariaDB.

Each committed transaction's task is enqueued once and a rolled-back one's never, while relays
are SIGKILLed mid-batch (once exactly between the Redis push and the row delete, at the test's
hook) and restarted, while two pools relay at once and one is killed twice, while Redis restarts
under the relay, and while 8 writers commit 10,000 rows into two relays. Runs are counted
outside Redis (an append-only file per process) by a pool that is never killed, so "once" is
the enqueue's, not hidden by a retry; where no pool runs, the queue itself is counted.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session
from tests.fault_helpers import PoolRunner, runs_from_files, write_app
from tests.queue_helpers import pending, stats
from tests.sql_helpers import Database, own_database

from fencekit import Task
from fencekit.integrations.sql.outbox import create_outbox, enqueue_in, outbox_table
from fencekit.testing import RedisServer, wait_until

# with the other fault campaigns, one at a time (on one worker)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults")]

RELAY = textwrap.dedent(
    """
    import asyncio, logging, os, signal, sys, time
    from fencekit import Client
    from fencekit.services.relay import Relay

    KILL_AT = int(os.environ.get("KILL_AT_BATCH", "0"))
    PAUSE = float(os.environ.get("PUSH_PAUSE", "0"))
    batches = 0

    def after_push(rows):
        global batches
        batches += 1
        print(f"pushed {len(rows)}", flush=True)
        if batches == KILL_AT:  # the hook point: pushed to Redis, rows not deleted
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(PAUSE)

    async def main():
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        async with Client(sys.argv[1]) as client:
            relay = Relay(client.redis, client.keys, sys.argv[2], table="fencekit_outbox", batch=10,
                          poll=0.05, logger=logging.getLogger("relay"), after_push=after_push)
            print("relay ready", flush=True)
            await relay.loop().run()

    asyncio.run(main())
    """
)

RELAY_ONLY_APP = "from faultapp import Hold\nWORKERS = [Hold]\n"
"""The app of pools that relay and serve nothing of the outbox's queue."""


class RelayProcess:
    """The relay script in a process of its own, its output in a file."""

    def __init__(self, directory: Path, redis_url: str, sql_url: str, **env: str) -> None:
        self.log = directory / f"relay-{time.monotonic_ns()}.log"
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(directory / "relay_script.py"), redis_url, sql_url],
            env={**os.environ, **env}, stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(lambda: "relay ready" in self.output() or self.proc.poll() is not None, 30, what="relay")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()

    stop = kill


class Writer(threading.Thread):
    """``n`` transactions, each an order row and its task: every other one rolled back."""

    def __init__(self, url: str, n: int, *, first: int = 0, pause: float = 0.005, per_txn: int = 1) -> None:
        super().__init__(daemon=True)
        self.url, self.n, self.first, self.pause, self.per_txn = url, n, first, pause, per_txn
        self.committed: list[str] = []
        self.rolled_back: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        engine = sa.create_engine(self.url)
        try:
            for i in range(self.first, self.first + self.n):
                with Session(engine) as session:
                    jids = [
                        enqueue_in(session, Task("work", "do", {"n": i, "k": k, "sleep": 0}, keep_result=0))
                        for k in range(self.per_txn)
                    ]
                    if self.per_txn == 1 and i % 2:
                        session.rollback()
                        self.rolled_back += jids
                    else:
                        session.commit()
                        self.committed += jids
                time.sleep(self.pause)
        except BaseException as exc:
            self.error = exc
        finally:
            engine.dispose()


@pytest.fixture(params=["postgresql", "mariadb"])
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    with own_database(request.param, "outboxfault") as database:
        engine = sa.create_engine(database.sync_url)
        try:
            create_outbox(engine)
        finally:
            engine.dispose()
        yield database


def rows_left(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(outbox_table())).scalar_one())
    finally:
        engine.dispose()


def wait_runs(runs: Path, jids: list[str], timeout: float) -> collections.Counter[str]:
    wait_until(lambda: set(jids) <= set(runs_from_files(runs)), timeout, what=f"{len(jids)} runs")
    time.sleep(1.5)  # a second enqueue of any would run by now
    return runs_from_files(runs)


def test_400_transactions_with_the_relay_killed_twice_mid_batch_run_the_committed_200_once(
    db: Database, tmp_path: Path, redis_url: str, r: redis.Redis
) -> None:
    runs = write_app(tmp_path)
    (tmp_path / "relay_script.py").write_text(RELAY)
    pool = PoolRunner(tmp_path, redis_url, "--procs", "1", "--concurrency", "8")
    relays: list[RelayProcess] = []
    writer = Writer(db.sync_url, 400)
    try:
        pool.wait_ready()
        writer.start()
        # 1. killed by its own hook after the Redis push of its 3rd batch, before the delete
        relays.append(RelayProcess(tmp_path, redis_url, db.sync_url, KILL_AT_BATCH="3"))
        assert relays[0].proc.wait(30) == -signal.SIGKILL, relays[0].output()
        assert relays[0].output().count("pushed") == 3
        # 2. killed by the test while a batch is pushed and not yet deleted (0.3 s between the two)
        relays.append(RelayProcess(tmp_path, redis_url, db.sync_url, PUSH_PAUSE="0.3"))
        wait_until(lambda: "pushed" in relays[1].output(), 30, what="a batch pushed")
        time.sleep(0.1)
        relays[1].kill()
        # 3. a relay that lives
        relays.append(RelayProcess(tmp_path, redis_url, db.sync_url))
        writer.join(60)
        assert writer.error is None, writer.error
        assert (len(writer.committed), len(writer.rolled_back)) == (200, 200)
        counts = wait_runs(runs, writer.committed, 60)
        assert rows_left(db.sync_url) == 0
        assert all(counts[jid] == 1 for jid in writer.committed), {j: c for j, c in counts.items() if c != 1}
        assert set(counts) == set(writer.committed)  # nothing rolled back ran
        assert stats(r, "work")["enqueued"] == 200
        assert stats(r, "work")["deduped"] >= 2  # each killed batch pushed again, enqueued once
    finally:
        for relay in relays:
            relay.stop()
        pool.stop()


def test_two_pools_relaying_at_once_one_killed_twice_enqueue_each_committed_task_once(
    db: Database, tmp_path: Path, redis_url: str, r: redis.Redis
) -> None:
    runs = write_app(tmp_path)
    (tmp_path / "relayapp.py").write_text(RELAY_ONLY_APP)
    relay_args = (
        "--procs",
        "1",
        "--outbox-url",
        db.sync_url,
        "--outbox-batch",
        "10",
        "--outbox-poll",
        "0.05",
    )
    consumer = PoolRunner(tmp_path, redis_url, "--procs", "1", "--concurrency", "8")
    steady = PoolRunner(tmp_path, redis_url, *relay_args, app="relayapp:WORKERS")
    killed = PoolRunner(tmp_path, redis_url, *relay_args, app="relayapp:WORKERS")
    writer = Writer(db.sync_url, 400)
    try:
        for pool in (consumer, steady, killed):
            pool.wait_ready()
        writer.start()
        for _ in range(2):
            time.sleep(1.0)
            os.killpg(killed.proc.pid, signal.SIGKILL)  # the supervisor, its relay and its child
            killed.proc.wait(10)
            killed.stop()
            killed = PoolRunner(tmp_path, redis_url, *relay_args, app="relayapp:WORKERS")
            killed.wait_ready()
        writer.join(60)
        assert writer.error is None, writer.error
        counts = wait_runs(runs, writer.committed, 60)
        wait_until(lambda: rows_left(db.sync_url) == 0, 10, what="every row relayed and deleted")
        assert all(counts[jid] == 1 for jid in writer.committed), {j: c for j, c in counts.items() if c != 1}
        assert set(counts) == set(writer.committed)
        assert stats(r, "work")["enqueued"] == 200
    finally:
        for pool in (consumer, steady, killed):
            pool.stop()


def test_a_redis_restart_under_the_relay_loses_and_doubles_nothing(
    tmp_path: Path, server_binary: str
) -> None:
    server = RedisServer(
        tmp_path / "redis", binary=server_binary, appendonly=True, config={"appendfsync": "always"}
    )
    server.start()
    (tmp_path / "relay_script.py").write_text(RELAY)
    url = server.url()
    with own_database("postgresql", "outboxredis") as db:
        engine = sa.create_engine(db.sync_url)
        create_outbox(engine)
        engine.dispose()
        writer = Writer(db.sync_url, 300, pause=0.01)
        relay = RelayProcess(tmp_path, url, db.sync_url)
        try:
            writer.start()
            time.sleep(1.0)
            server.stop()
            time.sleep(4.0)  # the relay fails, backs off, the rows wait in the table
            server.start()
            writer.join(60)
            assert writer.error is None, writer.error
            wait_until(lambda: rows_left(db.sync_url) == 0, 30, what="every row relayed after the restart")
            # the line comes as the relay's step returns, after the batch that emptied the table
            wait_until(lambda: "Redis answers again (outbox relay" in relay.output(), 30, what="its line")
            log = relay.output()
        finally:
            relay.stop()
            client = redis.Redis.from_url(url)
            queued = [e["jid"] for e in pending(client, "work")]
            client.close()
            server.cleanup()
    assert "Redis is not answering (outbox relay" in log, log[-3000:]
    assert "Redis answers again (outbox relay" in log, log[-3000:]
    assert sorted(queued) == sorted(writer.committed)  # each once, none rolled back


def test_eight_writers_and_two_relays_move_10000_rows_each_once(
    db: Database, tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "relay_script.py").write_text(RELAY)
    relays = [RelayProcess(tmp_path, redis_url, db.sync_url) for _ in range(2)]
    writers = [Writer(db.sync_url, 50, first=w * 50, pause=0.0, per_txn=25) for w in range(8)]
    try:
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(120)
            assert writer.error is None, writer.error
        wait_until(lambda: rows_left(db.sync_url) == 0, 60, what="10,000 rows relayed")
        outputs = [relay.output() for relay in relays]
    finally:
        for relay in relays:
            relay.stop()
    committed = [jid for writer in writers for jid in writer.committed]
    assert len(committed) == 10_000
    client = redis.Redis.from_url(redis_url)
    try:
        queued = [e["jid"] for e in pending(client, "work")]
    finally:
        client.close()
    assert len(queued) == 10_000
    assert set(queued) == set(committed)
    assert all("pushed" in out for out in outputs), "both relays moved rows"
