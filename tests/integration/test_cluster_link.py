"""The lean hot path on a real Redis Cluster: routing by slot, redirects, a URL that does not fit.

A 3-master :class:`~fencekit.testing.cluster.LocalCluster` (no replicas) per module,
flushed per test. Each test drives :class:`fencekit._redis.cluster.link.ClusterLink`
(what a consumer and a ``Client`` use on a ``redis+cluster://`` URL) with the queue's
own scripts, and checks the outcome on the nodes themselves: a redirect is followed
and the script runs exactly once (the queue's ``enqueued`` counter says how many
times it ran).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from tests.cluster_helpers import KEYS, enqueue, migrating, queues_on_every_master

from fencekit import Server
from fencekit._redis.cluster.link import ClusterLink, slot_of
from fencekit._redis.cluster.maps import read_fullest
from fencekit._redis.cluster.routing import HASH_SLOTS, SlotMap
from fencekit._redis.link import open_link
from fencekit._redis.run import NodeLost
from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError, StoreError
from fencekit.testing import RedisServer
from fencekit.testing.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, server_binary: str) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("cluster-link"), binary=server_binary)
    local.start(timeout=60)
    yield local
    local.cleanup()


@pytest.fixture
def url(cluster: LocalCluster) -> str:
    for node in cluster.masters:
        with node.client() as client:
            client.flushall()
    return cluster.url()


def enqueued(client: Any, queue: str) -> int:
    return int(client.hget(KEYS.queue(queue).stats, "enqueued") or 0)


async def test_a_pipeline_over_queues_on_every_master_comes_back_in_order(
    cluster: LocalCluster, url: str
) -> None:
    names = queues_on_every_master(cluster, per_master=2)
    link = await open_link(parse_url(url), name="t")
    try:
        assert isinstance(link, ClusterLink)
        calls = [enqueue(KEYS.queue(name), f"j{i}") for i, name in enumerate(names * 3)]
        replies = await link.pipeline(calls)
        assert not any(isinstance(r, BaseException) for r in replies), replies
        lengths = [await link.execute("LLEN", KEYS.queue(name).pending) for name in names]
    finally:
        await link.aclose()
    assert lengths == [3] * len(names)
    with cluster.client() as client:
        assert [enqueued(client, name) for name in names] == [3] * len(names)
    for name in names:  # each queue's keys are on the node that owns its slot, and only there
        owner = cluster.owner(KEYS.queue(name).pending)
        with owner.client() as node:
            assert node.llen(KEYS.queue(name).pending) == 3


async def test_a_script_error_comes_back_in_its_slot_and_the_others_run(
    cluster: LocalCluster, url: str
) -> None:
    names = queues_on_every_master(cluster, per_master=1)
    link = await open_link(parse_url(url), name="t")
    try:
        with cluster.client() as client:
            client.set(KEYS.queue(names[1]).pending, "not a list")  # the enqueue's LPUSH fails
        replies = await link.pipeline([enqueue(KEYS.queue(name), "j") for name in names])
    finally:
        await link.aclose()
    assert isinstance(replies[1], StoreError), replies
    assert "WRONGTYPE" in str(replies[1])
    assert not isinstance(replies[0], BaseException)
    assert not isinstance(replies[2], BaseException)


async def test_moved_after_a_slot_moved_is_followed_and_the_script_runs_once(
    cluster: LocalCluster, url: str
) -> None:
    queue = "moving"
    qk = KEYS.queue(queue)
    link = await open_link(parse_url(url), name="t")
    try:
        await link.call(enqueue(qk, "before"))
        old = cluster.owner(qk.pending)
        target = next(m for m in cluster.masters if m.port != old.port)
        await asyncio.to_thread(cluster.move_slot, slot_of(qk.pending), target)
        # the link's map still names the old owner: MOVED, the map is read again, the call goes on
        await link.pipeline([enqueue(qk, "after-1"), enqueue(qk, "after-2")])
        assert await link.execute("LLEN", qk.pending) == 3
        assert not link.closed
        assert link.redirects["moved"] >= 1
    finally:
        await link.aclose()
    with target.client() as node:
        assert node.llen(qk.pending) == 3
        assert enqueued(node, queue) == 3  # each enqueue ran exactly once
    assert cluster.owner(qk.pending).port == target.port


async def test_during_a_migration_ask_and_tryagain_are_followed_and_each_script_runs_once(
    cluster: LocalCluster, url: str
) -> None:
    """Keys moved one by one while enqueues go on: ASK and TRYAGAIN answers, never a double run."""
    queue = "migrating"
    qk = KEYS.queue(queue)
    single = f"{{{queue}}}:single"
    link = await open_link(parse_url(url), name="t")
    sent = 0
    try:
        for i in range(20):
            await link.call(enqueue(qk, f"seed-{i}"))
        with cluster.client() as client:
            client.set(single, "v")  # a one-key command is served behind ASKING
        async with migrating(cluster, qk.pending) as migration:
            migration.move_by_hand(single)
            assert await link.execute("GET", single) == b"v"
            migration.resume()
            while not migration.mover.done():  # enqueues race the migration's batches
                await link.call(enqueue(qk, f"during-{sent}"))
                sent += 1
        await link.call(enqueue(qk, "after"))
        sent += 1
        length = await link.execute("LLEN", qk.pending)
        followed = dict(link.redirects)
    finally:
        await link.aclose()
    assert sent >= 2
    assert followed["ask"] >= 1  # the GET, and enqueues while the queue's keys were all moved
    assert followed["tryagain"] >= 1  # enqueues while its keys were split between the nodes
    assert followed["moved"] >= 1  # the first call after the slot changed owner
    assert length == 20 + sent
    with migration.target.client() as node:
        assert enqueued(node, queue) == 20 + sent  # nothing ran twice, nothing was dropped
        assert node.llen(qk.pending) == 20 + sent


async def test_a_node_that_dies_fails_its_calls_alone_and_the_link_serves_the_others(
    tmp_path: Path, server_binary: str
) -> None:
    with LocalCluster(tmp_path / "c", binary=server_binary) as local:
        names = queues_on_every_master(local, per_master=1)
        victim = local.owner(KEYS.queue(names[0]).pending)
        link = await open_link(parse_url(local.url()), name="t")
        try:
            await link.pipeline([enqueue(KEYS.queue(name), "j") for name in names])
            local.kill(victim)
            for _ in range(3):  # the first meets the dead connection, the next ones the back-off
                replies = await link.pipeline([enqueue(KEYS.queue(name), "k") for name in names])
                assert isinstance(replies[0], NodeLost), replies
                assert not any(isinstance(r, BaseException) for r in replies[1:]), replies
            assert not link.closed
            with pytest.raises(NodeLost):
                await link.execute("LLEN", KEYS.queue(names[0]).pending)
            assert await link.execute("LLEN", KEYS.queue(names[1]).pending) == 4
        finally:
            await link.aclose()
        again = await open_link(parse_url(local.url()), name="t")  # the seeds: the dead one is skipped
        try:
            assert await again.execute("LLEN", KEYS.queue(names[2]).pending) == 4
        finally:
            await again.aclose()


async def test_a_connection_that_opens_as_its_caller_is_cancelled_stays_the_link_s(
    cluster: LocalCluster, url: str
) -> None:
    # The caller is cancelled after the node's connection opened but before it resumed: the
    # connection is nobody's then unless the link keeps it (a socket left open otherwise).
    link = await open_link(parse_url(url), name="t")
    assert isinstance(link, ClusterLink)
    try:
        held = set(link._conns)
        address = next(a for a in link.slot_map.primaries if a not in held)
        caller = asyncio.create_task(link._conn(address))
        while address not in link._opening:
            await asyncio.sleep(0)
        opening = link._opening[address]
        while not opening.done():
            await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        conn = opening.result()
        assert link._conns.get(address) is conn
        assert not conn.closed
        assert await link._conn(address) is conn  # the next caller uses it
    finally:
        await link.aclose()
    assert conn.closed


async def test_a_cluster_url_on_a_plain_server_is_a_config_error(redis_server: RedisServer) -> None:
    url = f"redis+cluster://{redis_server.host}:{redis_server.port}"
    with pytest.raises(ConfigError, match="not a Redis Cluster node"):
        await open_link(parse_url(url), name="t")
    server = Server(url)
    server.add_workers(_Noop)
    with pytest.raises(ConfigError, match="cluster mode off"):
        await asyncio.wait_for(server.run(), 20)


async def test_a_plain_url_on_a_cluster_node_is_a_config_error_at_start(
    cluster: LocalCluster, url: str
) -> None:
    node = cluster.masters[0]
    server = Server(f"redis://{node.host}:{node.port}/0")
    server.add_workers(_Noop)
    with pytest.raises(ConfigError, match=r"is a Redis Cluster node: use a redis\+cluster:// URL"):
        await asyncio.wait_for(server.run(), 20)


async def test_no_seed_answering_is_a_store_error_naming_each(server_binary: str) -> None:
    from fencekit.testing import free_port

    url = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}?socket_connect_timeout=0.5"
    with pytest.raises(StoreError, match="no seed node") as info:
        await open_link(parse_url(url), name="t")
    assert str(info.value).count("cannot connect") == 2


def test_the_redis_py_client_of_a_cluster_url_re_sends_nothing(cluster: LocalCluster, url: str) -> None:
    from fencekit._redis.clients import sync_client

    client = sync_client(url)
    try:
        assert isinstance(client, redis.RedisCluster)
        assert client.retry.get_retries() == 0
        client.set("{x}:k", "1")
        assert client.get("{x}:k") == b"1"
    finally:
        client.close()


class _Noop:
    queue = "noop"
    operation = "noop"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        return None


def test_the_operator_commands_work_on_a_cluster_url(cluster: LocalCluster, url: str) -> None:
    """``fencekit enqueue``, ``queues``, ``job`` and ``purge`` over queues on every master."""
    from tests.integration.test_cli import fk, ok_json

    names = queues_on_every_master(cluster)
    jids = [ok_json(fk(url, "enqueue", name, "op", "--json"))["jid"] for name in names]
    rows = {row["name"]: row for row in ok_json(fk(url, "queues", "--json"))["queues"]}
    assert {name: rows[name]["pending"] for name in names} == dict.fromkeys(names, 1)
    for name, jid in zip(names, jids, strict=True):
        shown = ok_json(fk(url, "job", jid, "--queue", name, "--json"))
        assert (shown["queue"], shown["status"]) == (name, "pending")
    assert fk(url, "purge", names[2], "--yes").returncode == 0
    with cluster.client() as client:
        assert [client.llen(KEYS.queue(name).pending) for name in names] == [1, 1, 0]


async def test_a_cluster_with_acl_users_takes_the_urls_credentials_on_every_node(
    tmp_path: Path, server_binary: str
) -> None:
    """AUTH with an ACL user on the seed and on every node reached from the map, hot path and redis-py."""
    from fencekit._redis.clients import aclose_client, async_client

    with LocalCluster(tmp_path / "acl", binary=server_binary) as local:
        names = queues_on_every_master(local)  # before the default user is off: the harness uses it
        assert len(names) == 3
        for node in local.nodes:
            with node.client() as admin:
                admin.execute_command("ACL", "SETUSER", "jobs", "on", ">s3cret", "~*", "&*", "+@all")
                admin.execute_command("ACL", "SETUSER", "default", "off")
        hosts = ",".join(f"{host}:{port}" for host, port in local.startup_nodes)
        good = parse_url(f"redis+cluster://jobs:s3cret@{hosts}/")
        link = await open_link(good, name="t")
        try:
            replies = await link.pipeline([enqueue(KEYS.queue(name), "j") for name in names])
            assert not any(isinstance(r, BaseException) for r in replies), replies
        finally:
            await link.aclose()
        client = async_client(good)
        try:
            assert [await client.llen(KEYS.queue(name).pending) for name in names] == [1, 1, 1]
        finally:
            await aclose_client(client)
        with pytest.raises(StoreError, match="refused AUTH") as refused:
            await open_link(parse_url(f"redis+cluster://jobs:wrong@{hosts}/"), name="t")
        assert "wrong" not in str(refused.value)


async def test_a_tls_cluster_url_verifies_every_node_on_the_hot_path_and_in_redis_py(tmp_path: Path) -> None:
    """``rediss+cluster://`` with the CA: the seed, every node from the map, the lean link and redis-py."""
    from fencekit._redis.clients import aclose_client, async_client
    from fencekit.testing import find_server_binary
    from fencekit.testing.tls import make_certificates

    certs = make_certificates(tmp_path / "certs")
    with LocalCluster(tmp_path / "tls", tls=certs, binary=find_server_binary("redis")) as local:
        names = queues_on_every_master(local)
        target = parse_url(local.url(tls=True))
        assert target.tls is not None
        link = await open_link(target, name="t")
        try:
            replies = await link.pipeline([enqueue(KEYS.queue(name), "j") for name in names])
            assert not any(isinstance(r, BaseException) for r in replies), replies
            assert isinstance(link, ClusterLink)
            assert set(link.slot_map.primaries) == {(local.host, port) for port in local.tls_ports[:3]}
        finally:
            await link.aclose()
        client = async_client(target)
        try:
            assert [await client.llen(KEYS.queue(name).pending) for name in names] == [1, 1, 1]
        finally:
            await aclose_client(client)
        wrong_ca = make_certificates(tmp_path / "other")  # a CA that signed none of the nodes
        with pytest.raises(StoreError, match="no seed node"):
            await open_link(parse_url(local.url(tls=True).replace(str(certs.ca_cert), str(wrong_ca.ca_cert))))


def _with_a_hole(full: SlotMap, slot: int) -> SlotMap:
    """``full`` without ``slot``: what a node amid a failover may answer to CLUSTER SLOTS."""
    ranges = []
    for start, end in ((0, slot - 1), (slot + 1, HASH_SLOTS - 1)):
        at = start
        while at <= end:
            owner, last = full.owner(at), at
            while last + 1 <= end and full.owner(last + 1) == owner:
                last += 1
            ranges.append((at, last, owner))
            at = last + 1
    return SlotMap(ranges)


async def test_a_map_without_the_slots_owner_is_read_again_by_every_entry_point(
    cluster: LocalCluster, url: str
) -> None:
    """Every way in (call, pipeline on one node and on several, execute, block_then) reads a map
    that names no owner for the call's slot again and goes on, instead of failing every call on
    that slot for as long as the link lives (CI: a producer's 685 enqueues in 40 s, all refused)."""
    names = queues_on_every_master(cluster, per_master=1)
    link = await open_link(parse_url(url), name="t")
    assert isinstance(link, ClusterLink)
    try:
        qk = KEYS.queue(names[0])
        slot = slot_of(qk.pending)
        full = link.slot_map
        await link.call(enqueue(qk, "warm"))
        for way in ("call", "pipeline", "pipeline over nodes", "execute", "block_then"):
            link._map = _with_a_hole(full, slot)
            if way == "call":
                await link.call(enqueue(qk, way))
            elif way == "pipeline":
                replies = await link.pipeline([enqueue(qk, "p1"), enqueue(qk, "p2")])
                assert not any(isinstance(r, BaseException) for r in replies), replies
            elif way == "pipeline over nodes":
                replies = await link.pipeline([enqueue(KEYS.queue(n), "m") for n in names])
                assert not any(isinstance(r, BaseException) for r in replies), replies
            elif way == "execute":
                assert await link.execute("LLEN", qk.pending) >= 1
            else:
                first, _ = await link.block_then(("BLPOP", qk.pending, 1), [], 2)
                assert first is not None
            assert link.slot_map.get(slot) is not None, way  # read again: the hole is gone
    finally:
        await link.aclose()


class _MapConn:
    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.closed = False
        self.asked = 0

    async def execute(self, *args: Any) -> Any:
        self.asked += 1
        return self.reply


async def test_reading_the_map_again_prefers_a_node_that_knows_every_slot() -> None:
    part = _MapConn([[0, 5460, [b"h", 1]]])
    full = _MapConn([[0, 5460, [b"h", 1]], [5461, 16383, [b"h", 2]]])
    later = _MapConn([[0, 16383, [b"h", 3]]])
    target = parse_url("redis+cluster://h:1")
    nodes: Any = [(("h", 1), part), (("h", 2), full), (("h", 3), later)]
    got = await read_fullest(nodes, target)
    assert (got.served, got.get(6000)) == (HASH_SLOTS, ("h", 2))
    assert later.asked == 0  # the first full map ends the search
    got = await read_fullest([(("h", 1), part)], target)  # type: ignore[list-item]
    assert got.served == 5461  # none full: the fullest
