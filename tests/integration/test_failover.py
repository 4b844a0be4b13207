"""Sentinel failover under load, on real processes, measured on the new master.

A master, a replica and three sentinels (:class:`fencekit.testing.sentinel.LocalSentinel`,
``down-after-milliseconds 1000``); ``python -m fencekit.pool`` (2 children x 8,
heartbeat TTL 3 s) on the ``redis+sentinel://`` URL; a producer enqueueing one task
every ~4.5 ms through ``Client`` on the same URL. Three seconds in, the master goes
away: ``SENTINEL FAILOVER`` (planned), SIGKILL of the master, a planned failover
with one sentinel down, and one while every connection to the sentinels is killed
again and again.

What counts is what the **new** master knows once the old one is demoted (a
demoted master throws away what was written to it after the promotion): every
task whose ``enqueue`` returned must be there -- its fenced effect written, or
still pending, scheduled or in flight, or dead-lettered. The bounds bind:

- lost (acknowledged, unknown to the new master) <= what the producer
  acknowledged in any 200 ms (about 45 at this rate) without durable mode,
  and 0 with ``durable_replicas=1``;
- no task counted twice (``processed`` equals the number of effects), and
  every effect is the newest delivery's (its token is the largest any run of
  that task wrote);
- the old master sees no fencekit write later than 0.2 s after the sentinels
  announced the switch (without the master watch: ten seconds);
- the pool keeps processing on the new master without restarting a child;
- every exception the producer saw is a ``StoreError`` (``DurabilityError``
  included): anything else fails the test.

Each scenario prints its report (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from tests.fault_helpers import (
    PoolRunner,
    Producer,
    ReadyProbe,
    close_client,
    jids_of,
    log_lines,
    most_in_window,
)

from fencekit import (
    AsyncDistributedLock,
    AsyncFenceGate,
    Client,
    IdempotencyGuard,
    StoreError,
    Task,
    connect,
    connect_async,
)
from fencekit._aio.closing import aclose_all
from fencekit._redis.process import free_port
from fencekit._redis.sentinel import MasterWatch, ask_sentinels
from fencekit._redis.url import parse_url
from fencekit.testing import RedisServer, wait_until
from fencekit.testing.sentinel import LocalSentinel

pytestmark = pytest.mark.slow

INTERVAL = 0.0045  # the producer's pace: ~220 tasks/s
LOSS_WINDOW = 0.2  # seconds of acknowledged work a failover may lose without durable mode
OLD_MASTER_SLACK = 0.2  # seconds after the switch announcement the old master may still see a write

APP = textwrap.dedent(
    """
    import asyncio, os
    from fencekit import FencedOutError, current_job

    RUNS = os.environ["TEST_RUNS_DIR"]
    _f = None

    def record(line):
        global _f
        if _f is None or _f[0] != os.getpid():
            _f = (os.getpid(), open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a", buffering=1))
        _f[1].write(line + "\\n")

    class Work:
        queue = "work"
        operation = "do"
        retry_count = 50

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            await asyncio.sleep(0.002)
            try:
                await job.set_if_fresh("effect:" + job.jid, job.token.value)
            except FencedOutError:
                record(f"fenced {job.jid} {job.token.value}")
                raise
            record(f"ran {job.jid} {job.token.value}")

    WORKERS = [Work]
    """
)


@pytest.fixture
def cluster(tmp_path: Path, server_binary: str) -> Iterator[LocalSentinel]:
    deployment = LocalSentinel(tmp_path / "sentinel", binary=server_binary)
    deployment.start()
    yield deployment
    deployment.cleanup()


def write_app(directory: Path) -> Path:
    (directory / "faultapp.py").write_text(APP)
    runs = directory / "runs"
    runs.mkdir(exist_ok=True)
    return runs


def read_runs(runs_dir: Path) -> tuple[dict[str, list[int]], int]:
    """jid -> tokens of its runs whose fenced write landed; and how many writes were fenced out."""
    runs: dict[str, list[int]] = {}
    fenced = 0
    for path in runs_dir.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            kind, jid, token = line.split()
            if kind == "ran":
                runs.setdefault(jid, []).append(int(token))
            else:
                fenced += 1
    return runs, fenced


class SwitchMonitor(threading.Thread):
    """Records when the sentinels announce ``+switch-master``, and the old master's last fencekit write.

    The old master is read directly (a connection that no watch moves) every
    5 ms until it reports itself a replica: its fencekit state -- counters,
    heartbeats, queue length -- changes only when someone writes to it.
    """

    def __init__(self, cluster: LocalSentinel, old: RedisServer) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.old = old
        self.switched_at: float | None = None
        self.last_write: float | None = None
        self.demoted_at: float | None = None
        self._stop_event = threading.Event()
        self._listeners: list[threading.Thread] = []

    def start(self) -> None:
        for sentinel in self.cluster.sentinels:
            if sentinel.is_running:
                listener = threading.Thread(target=self._listen, args=(sentinel,), daemon=True)
                listener.start()
                self._listeners.append(listener)
        super().start()

    def _listen(self, sentinel: RedisServer) -> None:
        try:
            client = redis.Redis(host=sentinel.host, port=sentinel.port, socket_timeout=0.5)
            pubsub = client.pubsub()
            pubsub.subscribe("+switch-master")
            while not self._stop_event.is_set():
                message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
                if message is not None and self.switched_at is None:
                    self.switched_at = time.monotonic()
            pubsub.close()
            client.close()
        except (redis.RedisError, OSError):
            return  # a sentinel the scenario kills; the others announce too

    def _read(self, r: redis.Redis) -> tuple[bool, Any]:
        """(still master?, fencekit state) read in one transaction: both describe the same instant.

        The demotion replaces the node's data with the new master's; read apart,
        that replacement would look like a late write.
        """
        pipe = r.pipeline(transaction=True)
        pipe.execute_command("ROLE")
        pipe.hgetall("fencekit:{work}:stats")
        pipe.zrange("fencekit:{registry}:beats", -1, -1, withscores=True)
        pipe.llen("fencekit:{work}:pending")
        role, *state = pipe.execute()
        return role[0] == b"master", state

    def run(self) -> None:
        r = self.old.client(socket_timeout=1.0)
        last = None
        while not self._stop_event.is_set():
            try:
                master, now = self._read(r)
            except (redis.RedisError, OSError):
                break  # killed
            if not master:
                self.demoted_at = time.monotonic()
                break
            if last is not None and now != last:
                self.last_write = time.monotonic()
            last = now
            time.sleep(0.005)
        r.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)
        for listener in self._listeners:
            listener.join(5)


@dataclass
class Report:
    name: str
    acknowledged: int
    refused: int
    lost: list[str]
    counted_twice: int
    stale_effects: list[str]
    processed: int
    effects: int
    fenced_out_writes: int
    bound: int
    switch_seconds: float
    # bytes of the old master's replication stream, written before the fault, that the promoted
    # replica never had (its offset at the promotion is lower): async replication's loss, 0 when
    # it kept up; a lower bound, read just before the fault
    unreplicated: int
    old_master_last_write: float | None  # seconds after the switch announcement
    after_switch: int
    pool_log: str
    producer_other: list[str]
    producer_errors: list[str] = field(default_factory=list)
    ready_during: list[int] = field(default_factory=list)  # /ready between the fault and the demotion
    ready_after: int = 0

    def print(self) -> None:
        last = "-" if self.old_master_last_write is None else f"{self.old_master_last_write:+.3f}s"
        print(
            f"\n[{self.name}] acknowledged={self.acknowledged} refused={self.refused} lost={len(self.lost)} "
            f"(bound {self.bound}) counted_twice={self.counted_twice} "
            f"stale_effects={len(self.stale_effects)} "
            f"processed={self.processed} effects={self.effects} fenced_out_writes={self.fenced_out_writes} "
            f"switch={self.switch_seconds:.2f}s unreplicated={self.unreplicated}B "
            f"old_master_last_write={last} after_switch={self.after_switch}"
        )


def _unfinished(r: redis.Redis) -> set[str]:
    """jids the master holds as pending, scheduled or in flight."""
    raws = list(r.lrange("fencekit:{work}:pending", 0, -1)) + list(
        r.zrange("fencekit:{work}:scheduled", 0, -1)
    )
    for key in r.scan_iter("fencekit:{work}:inflight:*"):
        raws += list(r.hvals(key))
    return jids_of(raws)


def _dead(r: redis.Redis) -> set[str]:
    return jids_of([v for k, v in r.hgetall("fencekit:{work}:dead").items() if not k.endswith(b":why")])


def _effects(r: redis.Redis, jids: set[str]) -> dict[str, int]:
    pipe = r.pipeline(transaction=False)
    ordered = sorted(jids)
    for jid in ordered:
        pipe.get("effect:" + jid)
    return {jid: int(v) for jid, v in zip(ordered, pipe.execute()) if v is not None}


def run_failover(
    cluster: LocalSentinel,
    tmp_path: Path,
    name: str,
    fault: Callable[[LocalSentinel], None],
    *,
    durable: bool = False,
) -> Report:
    runs_dir = write_app(tmp_path)
    durable_args = ("--durable-replicas", "1", "--durable-timeout", "1") if durable else ()
    pool = PoolRunner(
        tmp_path, cluster.url, "--procs", "2", "--concurrency", "8", "--heartbeat-ttl", "3", "--grace", "1",
        *durable_args,
    )  # fmt: skip
    client_kwargs = {"durable_replicas": 1, "durable_timeout": 1.0} if durable else None
    producer: Producer | None = None
    probe: ReadyProbe | None = None
    monitor: SwitchMonitor | None = None
    try:
        pool.wait_ready()
        probe = ReadyProbe(f"http://127.0.0.1:{pool.web_port}/ready")
        probe.start()
        producer = Producer(cluster.url, interval=INTERVAL, client_kwargs=client_kwargs)
        producer.start()
        wait_until(lambda: len(producer.report.accepted) >= 300, 20, what="load before the fault")  # type: ignore[union-attr]
        old_address = cluster.master_address()
        old_node = cluster.node_at(old_address)
        monitor = SwitchMonitor(cluster, old_node)
        monitor.start()
        with old_node.client(socket_timeout=5.0) as r:
            offset_before = int(r.info("replication")["master_repl_offset"])
        t_fault = time.monotonic()
        fault(cluster)
        new_address = cluster.wait_for_new_master(old_address, timeout=40)
        switch_seconds = time.monotonic() - t_fault
        with cluster.node_at(new_address).client(socket_timeout=5.0) as r:
            promoted_at = int(r.info("replication")["second_repl_offset"])  # its offset when promoted
        if not old_node.is_running:  # the crash: it comes back empty, as a replica of the new master
            old_node.config["replicaof"] = f"{new_address[0]} {new_address[1]}"
            old_node.start()
        cluster.wait_demoted(old_node, timeout=40)
        monitor.stop()
        t_settled = time.monotonic()
        ready_during = probe.statuses_between(t_fault, t_settled)
        wait_until(
            # tuple(): the producer's thread adds to the dict meanwhile
            lambda: sum(1 for t in tuple(producer.report.accepted_at.values()) if t > t_settled) >= 200,  # type: ignore[union-attr]
            60,
            what="load on the new master",
        )
        report = producer.stop()
        producer = None
        new_node = cluster.node_at(new_address)
        with new_node.client(socket_timeout=5.0) as r:
            acknowledged = set(report.accepted)

            wait_until(
                lambda: not (_unfinished(r) & acknowledged),
                60,
                interval=0.2,
                what="every acknowledged task finished on the new master",
            )
            known = _unfinished(r) | _dead(r)
            effects = _effects(r, acknowledged | set(report.refused))
            processed = int(r.hget("fencekit:{work}:stats", "processed") or 0)
        ready_after = pool.ready_status()
        assert pool.proc.poll() is None, pool.output()[-3000:]
    finally:
        if producer is not None:
            producer.stop()
        if monitor is not None:
            monitor.stop()
        if probe is not None:
            probe.stop()
        pool.stop()
    runs, fenced = read_runs(runs_dir)
    lost = sorted(acknowledged - known - set(effects))
    stale = sorted(jid for jid, token in effects.items() if token != max(runs.get(jid, [token])))
    switched = monitor.switched_at if monitor is not None else None
    last_write = monitor.last_write if monitor is not None else None
    return Report(
        name=name,
        acknowledged=len(acknowledged),
        refused=len(report.refused),
        lost=lost,
        counted_twice=processed - len(effects),
        stale_effects=stale,
        processed=processed,
        effects=len(effects),
        fenced_out_writes=fenced,
        bound=0 if durable else most_in_window(list(report.accepted_at.values()), LOSS_WINDOW),
        switch_seconds=switch_seconds,
        unreplicated=max(0, offset_before - promoted_at),
        old_master_last_write=(last_write - switched) if last_write is not None and switched else None,
        after_switch=sum(1 for t in report.accepted_at.values() if t > t_settled),
        pool_log=pool.output(),
        producer_other=report.other,
        producer_errors=[m for _, m in report.errors],
        ready_during=ready_during,
        ready_after=ready_after,
    )


def check(report: Report, *, durable: bool = False) -> None:
    report.print()
    assert report.producer_other == [], (
        f"the producer saw non-StoreError exceptions: {report.producer_other[:5]}"
    )
    # report.producer_errors holds StoreErrors only (NotSent, DurabilityError, ... by their class names)
    assert len(report.lost) <= report.bound, (
        f"{len(report.lost)} acknowledged tasks unknown to the new master "
        f"(bound {report.bound}; the promoted replica lacked at least {report.unreplicated} bytes of "
        f"the old master's stream): {report.lost[:10]}"
    )
    if durable:
        assert report.lost == []
    assert report.counted_twice == 0, f"processed={report.processed} but {report.effects} effects"
    assert report.stale_effects == [], f"effects written by a stale delivery: {report.stale_effects[:10]}"
    if report.old_master_last_write is not None:
        assert report.old_master_last_write <= OLD_MASTER_SLACK, (
            f"the old master saw a write {report.old_master_last_write:.2f}s after the switch was announced"
        )
    assert report.after_switch >= 200
    assert report.ready_after == 200
    assert "killed by" not in report.pool_log, "a child was restarted"
    assert "Traceback" not in report.pool_log, report.pool_log[-3000:]


def planned(cluster: LocalSentinel) -> None:
    cluster.failover(wait=False)


def crash(cluster: LocalSentinel) -> None:
    cluster.kill_master()


def planned_with_a_sentinel_down(cluster: LocalSentinel) -> None:
    cluster.sentinels[2].kill()
    cluster.failover(wait=False)


def planned_while_sentinel_connections_drop(cluster: LocalSentinel) -> None:
    """Kill every connection of every sentinel (the watches' subscriptions and polls) during the switch."""
    cluster.failover(wait=False)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        for sentinel in cluster.sentinels:
            try:
                with redis.Redis(host=sentinel.host, port=sentinel.port, socket_timeout=0.5) as admin:
                    admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            except (redis.RedisError, OSError):
                continue
        time.sleep(0.05)


@pytest.mark.alone
def test_a_planned_failover_loses_at_most_200_ms_of_acknowledged_work(
    cluster: LocalSentinel, tmp_path: Path
) -> None:
    check(run_failover(cluster, tmp_path, "SENTINEL FAILOVER", planned))


@pytest.mark.alone
def test_a_planned_failover_with_durable_acknowledgement_loses_nothing(
    cluster: LocalSentinel, tmp_path: Path
) -> None:
    check(
        run_failover(cluster, tmp_path, "SENTINEL FAILOVER, durable_replicas=1", planned, durable=True),
        durable=True,
    )


@pytest.mark.alone
def test_sigkill_of_the_master_under_load(cluster: LocalSentinel, tmp_path: Path) -> None:
    report = run_failover(cluster, tmp_path, "SIGKILL of the master", crash)
    check(report)
    assert report.refused > 0, "enqueue kept succeeding while there was no master"
    assert 503 in report.ready_during, "/ready never said Redis was unavailable while there was no master"
    ends = log_lines(report.pool_log, "Redis answers again")
    assert ends, "the pool's processes never said Redis answered again"
    assert all("after an outage of" in line for line in ends), ends


@pytest.mark.alone
def test_sigkill_of_the_master_with_durable_acknowledgement_loses_nothing(
    cluster: LocalSentinel, tmp_path: Path
) -> None:
    check(run_failover(cluster, tmp_path, "SIGKILL, durable_replicas=1", crash, durable=True), durable=True)


@pytest.mark.alone
def test_a_planned_failover_with_a_sentinel_down(cluster: LocalSentinel, tmp_path: Path) -> None:
    check(
        run_failover(cluster, tmp_path, "SENTINEL FAILOVER, one sentinel down", planned_with_a_sentinel_down)
    )


@pytest.mark.alone
def test_a_planned_failover_while_every_sentinel_connection_drops(
    cluster: LocalSentinel, tmp_path: Path
) -> None:
    name = "SENTINEL FAILOVER, sentinel connections killed"
    check(run_failover(cluster, tmp_path, name, planned_while_sentinel_connections_drop))


async def test_a_watch_polls_every_tenth_of_a_second_after_its_subscriptions_drop(
    cluster: LocalSentinel,
) -> None:
    """After a subscription that was up drops, the watch polls every DEGRADED_POLL_INTERVAL for
    DEGRADED_FOR seconds, not every poll_interval: an announcement may have been missed (only the
    failover's leader says a promotion began). A CI run with every sentinel connection killed
    once saw writes reach the old master 0.44 s after the switch: the watch had waited out its
    1 s poll interval. A sentinel that is down (its subscription never comes up) announces
    nothing: it does not make the watch poll the others faster."""
    silent = f"127.0.0.1:{free_port()}"
    target = parse_url(cluster.url.replace("redis+sentinel://", f"redis+sentinel://{silent},", 1))
    watch = MasterWatch(target, poll_interval=60.0)
    await watch.start()
    try:
        assert watch.address == cluster.master_address()

        def subscribed() -> bool:  # the watch's subscriptions are up (the silent one keeps failing)
            for sentinel in cluster.sentinels:
                with redis.Redis(host=sentinel.host, port=sentinel.port, socket_timeout=2) as admin:
                    if not admin.execute_command("CLIENT", "LIST", "TYPE", "pubsub"):
                        return False
            return True

        await asyncio.to_thread(wait_until, subscribed, 10, what="the watch's subscriptions")
        assert not watch.degraded()
        for sentinel in cluster.sentinels:  # every subscription drops once
            with redis.Redis(host=sentinel.host, port=sentinel.port, socket_timeout=2) as admin:
                admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await asyncio.to_thread(wait_until, watch.degraded, 10, what="the watch degraded")
        before = watch.polls
        # each drop asks for one poll; after that, with a 60 s interval, the old watch polled no
        # more for a minute; degraded, it polls every 0.1 s for 5 s
        await asyncio.to_thread(
            wait_until, lambda: watch.polls - before >= 20, 30, what="polls after the drop"
        )
        await asyncio.to_thread(wait_until, lambda: not watch.degraded(), 30, what="back to its interval")
    finally:
        await watch.aclose()


async def test_a_poll_asks_again_on_a_new_connection_when_the_sentinel_dropped_its_idle_one(
    cluster: LocalSentinel,
) -> None:
    """Every sentinel drops its clients' idle connections (CLIENT KILL); the next poll still hears
    all of them: SENTINEL MASTER is a read, asked once more on a new connection. Without that, a
    poll made right after connections were dropped heard nobody (the failover test's 0.44 s)."""
    target = parse_url(cluster.url)
    pollers = [
        redis.asyncio.Redis(host=host, port=port, **target.sentinel_kwargs(aio=True))
        for host, port in target.sentinels
    ]
    try:
        assert len(await ask_sentinels(target, pollers)) == len(pollers)  # connections now idle
        for sentinel in cluster.sentinels:
            with redis.Redis(host=sentinel.host, port=sentinel.port, socket_timeout=2) as admin:
                admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        replies = await ask_sentinels(target, pollers)
        assert len(replies) == len(pollers), replies
    finally:
        await aclose_all(*pollers)


async def test_enqueue_raises_store_error_while_no_master_is_known(cluster: LocalSentinel) -> None:
    """Between the crash and the promotion, Client.enqueue raises StoreError (never hangs,
    never reports success), and succeeds again on the new master once it is named."""
    client = Client(cluster.url)
    try:
        await client.enqueue(Task("work", "do"))
        old = cluster.master_address()
        await asyncio.to_thread(cluster.kill_master)
        with pytest.raises(StoreError):
            await asyncio.wait_for(client.enqueue(Task("work", "do")), 5)
        new = await asyncio.to_thread(cluster.wait_for_new_master, old)
        jid = None
        for _ in range(100):
            try:
                jid = await client.enqueue(Task("work", "do"))
                break
            except StoreError:
                await asyncio.sleep(0.1)
        assert jid is not None, "enqueue never succeeded on the new master"
    finally:
        await close_client(client)
    with cluster.node_at(new).client() as r:
        assert any(jid.encode() in raw for raw in r.lrange("fencekit:{work}:pending", 0, -1))


def test_the_helper_names_one_master_and_demotes_the_old_one(cluster: LocalSentinel) -> None:
    old = cluster.master_address()
    new = cluster.failover()
    assert new != old
    assert cluster.role(cluster.node_at(new)) == "master"
    cluster.wait_demoted(cluster.node_at(old), timeout=40)
    assert isinstance(cluster.master(), RedisServer)


async def test_closing_a_sentinel_client_closes_its_sentinel_connections(cluster: LocalSentinel) -> None:
    """``Client.close()`` closes its connections to the sentinels and its master watch's."""
    client = Client(cluster.url)
    await client.enqueue(Task("work", "do"))
    await client.close()
    manager = client.redis.connection_pool.sentinel_manager  # type: ignore[attr-defined]
    still_open = [
        c for s in manager.sentinels for c in s.connection_pool._available_connections if c.is_connected
    ]
    for s in manager.sentinels:
        await s.aclose()
    assert still_open == [], f"{len(still_open)} sentinel connection(s) left open by Client.close()"


# -- the primitives on Sentinel (fencekit.connect) --------------------------------------------


def _idempotency_writes(
    url: str, stop: threading.Event, acked: list[tuple[str, float]], errors: list[str]
) -> None:
    """Begin a fresh idempotency key every ~4.5 ms through a synchronous ``fencekit.connect`` client."""
    client = connect(url)
    guard = IdempotencyGuard(client)
    n = 0
    try:
        while not stop.is_set():
            key = f"order-{n}"
            n += 1
            try:
                if guard.try_begin(key, ttl=timedelta(hours=1)):
                    acked.append((key, time.monotonic()))
            except StoreError:
                time.sleep(0.05)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(INTERVAL)
    finally:
        client.close()


@pytest.mark.alone
def test_the_primitives_follow_a_planned_failover_through_fencekit_connect(cluster: LocalSentinel) -> None:
    """``fencekit.connect`` leaves the old master too: a begun idempotency key is on the new master."""
    stop = threading.Event()
    acked: list[tuple[str, float]] = []
    errors: list[str] = []
    writer = threading.Thread(
        target=_idempotency_writes, args=(cluster.url, stop, acked, errors), daemon=True
    )
    writer.start()
    try:
        wait_until(lambda: len(acked) >= 300, 60, what="keys begun before the fault")
        old = cluster.master_address()
        cluster.failover(wait=False)
        new = cluster.wait_for_new_master(old, timeout=40)
        cluster.wait_demoted(cluster.node_at(old), timeout=40)
        settled = time.monotonic()
        wait_until(lambda: sum(1 for _, t in acked if t > settled) >= 200, 60, what="keys on the new master")
    finally:
        stop.set()
        writer.join(15)
    assert errors == [], errors[:5]
    with cluster.node_at(new).client() as r:
        pipe = r.pipeline(transaction=False)
        for key, _ in acked:
            pipe.exists(f"fencekit:idem:{{{key}}}")
        present = pipe.execute()
    lost = [key for (key, _), there in zip(acked, present) if not there]
    bound = most_in_window([t for _, t in acked], LOSS_WINDOW)
    print(f"\n[fencekit.connect, SENTINEL FAILOVER] begun={len(acked)} lost={len(lost)} (bound {bound})")
    assert len(lost) <= bound, lost[:10]


async def test_connect_async_gives_an_asyncio_client_that_follows_the_master(cluster: LocalSentinel) -> None:
    client = connect_async(cluster.url)
    try:
        gate = AsyncFenceGate(client)
        lock = AsyncDistributedLock(client)
        handle = await lock.acquire("batch-1", ttl=timedelta(seconds=30))
        await gate.set_if_fresh(handle.token, "{batch-1}:status", "before")
        old = cluster.master_address()
        await asyncio.to_thread(cluster.failover)
        for _ in range(100):  # StoreError while the master moves, then the new master answers
            try:
                await gate.set_if_fresh(handle.token, "{batch-1}:status", "after")
                break
            except StoreError:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the asyncio client never reached the new master")
        assert cluster.master_address() != old
        with cluster.master().client() as r:
            assert r.get("{batch-1}:status") == b"after"
    finally:
        await client.aclose()


# -- what Redis itself can bound: min-replicas-to-write ----------------------------------------


def _plain_writes_lost(cluster: LocalSentinel) -> tuple[int, int]:
    """A plain redis-py writer that knows nothing of sentinels writes to the master through a failover.

    Returns (writes acknowledged by the old master after the promotion began, of those lost).
    """
    old = cluster.master()
    plain = old.client(socket_timeout=1.0)
    acked: list[tuple[int, float]] = []
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            try:
                plain.set(f"plain:{n}", 1)
                acked.append((n, time.monotonic()))
            except (redis.RedisError, OSError):
                pass  # refused (NOREPLICAS, READONLY): not acknowledged
            n += 1
            time.sleep(INTERVAL)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    wait_until(lambda: len(acked) >= 200, 20, what="plain writes")
    started = time.monotonic()
    cluster.failover(wait=False)
    cluster.wait_demoted(old, timeout=40)
    stop.set()
    writer.join(10)
    plain.close()
    after = [n for n, t in acked if t > started]
    with cluster.master().client() as r:
        pipe = r.pipeline(transaction=False)
        for n in after:
            pipe.exists(f"plain:{n}")
        present = pipe.execute()
    return len(after), sum(1 for there in present if not there)


def test_min_replicas_to_write_bounds_the_window_for_clients_that_do_not_follow_the_sentinels(
    tmp_path: Path, server_binary: str
) -> None:
    """The Redis-side setting for everyone: a master with no replica within ``min-replicas-max-lag``
    refuses writes, so the old master stops accepting them a second or two after the promotion
    instead of ten (a client without fencekit's watch keeps writing to it until it is demoted)."""
    results = {}
    for name, config in (
        ("without", {}),
        (
            "with min-replicas-to-write 1, min-replicas-max-lag 1",
            {"min-replicas-to-write": 1, "min-replicas-max-lag": 1},
        ),
    ):
        deployment = LocalSentinel(tmp_path / name.replace(" ", "-"), binary=server_binary, config=config)
        with deployment:
            results[name] = _plain_writes_lost(deployment)
    for name, (acknowledged, lost) in results.items():
        print(
            f"\n[plain redis-py writer, SENTINEL FAILOVER, {name}] "
            f"acknowledged after the command={acknowledged} lost={lost} (~{lost * INTERVAL:.1f}s of writes)"
        )
    without = results["without"][1]
    bounded = results["with min-replicas-to-write 1, min-replicas-max-lag 1"][1]
    assert without > 0, "the demotion discarded nothing: the scenario did not reproduce the window"
    assert bounded < without
    assert bounded * INTERVAL <= 3.0, f"{bounded} writes lost with min-replicas-max-lag 1"
