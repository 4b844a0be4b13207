"""``LocalCluster`` with replicas, faulted for real (``fencekit.testing.cluster``).

One module-scoped cluster: 3 masters with one replica each, ``cluster-node-timeout``
1000 ms, on free loopback ports. The tests change its roles (failovers, a crash, a
hang, a moved slot), so none of them assumes which node is a master: each asks the
cluster, and each leaves every node running and the cluster stable. Nothing is
mocked: the roles, slots and keys are read back from the servers.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import AskError, TryAgainError

from fencekit._redis.url import parse_url
from fencekit.testing import RedisServer
from fencekit.testing.cluster import HASH_SLOTS, LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, server_binary: str) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("harness"),
        masters=3,
        replicas=1,
        node_timeout_ms=1000,
        binary=server_binary,
    )
    local.start(timeout=60)
    yield local
    local.cleanup()


@pytest.fixture(autouse=True)
def healthy(cluster: LocalCluster) -> Iterator[None]:
    """An empty, stable cluster for each test; whatever a test killed is back afterwards."""
    with cluster.client() as client:
        client.flushall()
    yield
    for node in cluster.nodes:
        if not node.is_running:
            cluster.restart(node, wait=False)
    cluster.wait_stable(timeout=30)


def direct(server: RedisServer) -> redis.Redis:
    """A plain client of one node (no cluster redirections followed)."""
    return server.client(decode_responses=True, socket_timeout=5)


def role_reply(server: RedisServer) -> list[object]:
    with direct(server) as client:
        reply = client.execute_command("ROLE")
    assert isinstance(reply, list)
    return reply


def replica_reads(server: RedisServer, keys: list[str]) -> list[str | None]:
    """The values a replica holds (READONLY: it answers instead of redirecting)."""
    with direct(server) as client:
        client.execute_command("READONLY")
        return [client.get(key) for key in keys]


def test_the_cluster_starts_with_one_replica_per_master(cluster: LocalCluster) -> None:
    masters, replicas = cluster.masters, cluster.replicas
    assert len(masters) == len(replicas) == 3
    assert {id(n) for n in masters} | {id(n) for n in replicas} == {id(n) for n in cluster.nodes}
    assert {id(cluster.master_of(r)) for r in replicas} == {id(m) for m in masters}
    for master in masters:
        assert cluster.role(master) == "master"
        assert role_reply(master)[0] == "master"
        assert cluster.master_of(master) is None
        assert len(cluster.replicas_of(master)) == 1
    for replica in replicas:
        assert cluster.role(replica) == "replica"
        with direct(replica) as client:
            assert client.info("replication")["master_link_status"] == "up"
    ids = [cluster.node_id(n) for n in cluster.nodes]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{40}", node_id) for node_id in ids)

    # the slots are served by the masters only, all of them
    with direct(replicas[0]) as client:
        table = client.execute_command("CLUSTER", "SLOTS")
    served = 0
    for low, high, master, *_ in table:
        served += high - low + 1
        assert cluster.slot_owner(low) in masters
        assert int(master[1]) in {m.port for m in masters}
    assert served == HASH_SLOTS
    key = "{start}:k"
    assert cluster.owner(key) is cluster.slot_owner(cluster.slot(key))
    assert cluster.slot(key) == cluster.slot("{start}:other")

    # each node keeps its cluster config in its own directory (it survives a kill)
    for node in cluster.nodes:
        assert (node.directory / f"nodes-{node.port}.conf").is_file()

    target = parse_url(cluster.url())
    assert target.is_cluster
    assert list(target.seeds) == cluster.startup_nodes
    with pytest.raises(ValueError, match="tls=make_certificates"):
        cluster.url(tls=True)
    with cluster.client(decode_responses=True) as client:
        client.set(key, "v")
        assert client.get(key) == "v"


def test_failover_keeps_the_keys_and_demotes_the_old_master(cluster: LocalCluster) -> None:
    keys = [f"{{fo}}:{i}" for i in range(50)]
    client = cluster.client(decode_responses=True)
    try:
        for i, key in enumerate(keys):
            client.set(key, str(i))
        old = cluster.owner(keys[0])
        [replica] = cluster.replicas_of(old)

        new = cluster.failover(old, timeout=30)

        assert new is replica
        assert cluster.owner(keys[0]) is new
        assert cluster.role(new) == "master"
        assert cluster.role(old) == "replica"
        assert cluster.master_of(old) is new
        role = role_reply(old)
        assert role[0] == "slave"
        assert int(str(role[2])) == new.port
        assert old not in cluster.masters
        # the client made before the failover follows MOVED; a new one finds the new master
        assert [client.get(key) for key in keys] == [str(i) for i in range(50)]
        with cluster.client(decode_responses=True) as fresh:
            assert [fresh.get(key) for key in keys] == [str(i) for i in range(50)]
        # the demoted master replicates the new one
        assert replica_reads(old, keys[:3]) == ["0", "1", "2"]
    finally:
        client.close()


@pytest.mark.slow
def test_kill_promotes_the_replica_with_the_acknowledged_writes_and_restart_rejoins(
    cluster: LocalCluster,
) -> None:
    keys = [f"{{crash}}:{i}" for i in range(100)]
    old = cluster.owner(keys[0])
    [replica] = cluster.replicas_of(old)
    old_id = cluster.node_id(old)
    with direct(old) as client:
        pipe = client.pipeline(transaction=False)
        for i, key in enumerate(keys):
            pipe.set(key, str(i))
        pipe.execute_command("WAIT", 1, 1000)
        *_, acked = pipe.execute()
    assert acked >= 1  # the replica has every write before the crash

    cluster.kill(old)
    assert not old.is_running
    started = time.monotonic()
    new = cluster.wait_promoted(old, timeout=30)
    took = time.monotonic() - started

    assert new is replica
    assert took < 30
    assert cluster.owner(keys[0]) is new
    assert cluster.role(new) == "master"
    assert cluster.role(old) is None  # not running: no role
    assert len(cluster.masters) == 3
    with cluster.client(decode_responses=True) as client:
        assert [client.get(key) for key in keys] == [str(i) for i in range(100)]

    cluster.restart(old, timeout=30)

    assert old.is_running
    assert cluster.node_id(old) == old_id
    with direct(old) as client:
        assert client.execute_command("CLUSTER", "MYID") == old_id
        assert client.info("replication")["master_link_status"] == "up"
    assert cluster.role(old) == "replica"
    assert cluster.master_of(old) is new
    assert replica_reads(old, keys[:3]) == ["0", "1", "2"]  # resynced from the new master


def test_a_paused_master_is_forced_out_and_resumes_as_a_replica(cluster: LocalCluster) -> None:
    key = "{hang}:k"
    old = cluster.owner(key)
    with direct(old) as client:
        client.set(key, "before")
        assert client.execute_command("WAIT", 1, 1000) >= 1
    cluster.pause(old)
    try:
        assert not old.ping()  # it hangs: the socket is open, nothing answers
        assert cluster.role(old) == "master"  # as its peers still see it
        new = cluster.failover(old, force=True, timeout=30)
        assert cluster.owner(key) is new
    finally:
        cluster.resume(old, timeout=30)
    assert cluster.role(old) == "replica"
    assert cluster.master_of(old) is new
    with cluster.client(decode_responses=True) as client:
        assert client.get(key) == "before"


def test_move_slot_moves_every_key_through_the_migrating_state(cluster: LocalCluster) -> None:
    keys = [f"{{mv}}:{i}" for i in range(500)]
    values = [str(i) for i in range(500)]
    slot = cluster.slot(keys[0])
    client = cluster.client(decode_responses=True)
    try:
        pipe = client.pipeline()
        for key, value in zip(keys, values):
            pipe.set(key, value)
        pipe.execute()
        source = cluster.slot_owner(slot)
        target = next(m for m in cluster.masters if m is not source)
        source_id, target_id = cluster.node_id(source), cluster.node_id(target)
        seen: list[str] = []

        def during() -> None:
            with direct(source) as src, direct(target) as dst:
                assert f"[{slot}->-{target_id}]" in src.execute_command("CLUSTER", "NODES")
                assert f"[{slot}-<-{source_id}]" in dst.execute_command("CLUSTER", "NODES")
                # one key already moved: the source answers ASK for it, and TRYAGAIN for a
                # multi-key command over keys now split between the two nodes
                moved = src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", keys[0])
                assert moved == "OK"
                with pytest.raises(AskError) as ask:
                    src.get(keys[0])
                assert (ask.value.slot_id, ask.value.node_addr) == (slot, (target.host, target.port))
                with pytest.raises(TryAgainError):
                    src.mget(keys[0], keys[1])
                assert src.get(keys[1]) == "1"  # not moved yet: still served here
            # a cluster client follows the ASK redirection
            assert client.get(keys[0]) == "0"
            assert client.get("{mv}:absent") is None
            seen.append("migrating")

        cluster.move_slot(slot, target, batch=100, on_migrating=during, timeout=30)

        assert seen == ["migrating"]
        assert cluster.slot_owner(slot) is target
        assert cluster.owner(keys[-1]) is target
        with direct(source) as src, direct(target) as dst:
            assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            assert dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 500
            assert dst.get(keys[-1]) == values[-1]
            assert "[" not in src.execute_command("CLUSTER", "NODES")  # no slot left half-moved
        assert [client.get(key) for key in keys] == values  # the old client follows MOVED
        with cluster.client(decode_responses=True) as fresh:
            assert [fresh.get(key) for key in keys] == values

        # and back, in smaller steps with a pause between them, with REPLACE
        cluster.move_slot(slot, source, batch=200, replace=True, pause_between=0.01, timeout=30)
        assert cluster.slot_owner(slot) is source
        with cluster.client(decode_responses=True) as fresh:
            assert [fresh.get(key) for key in keys] == values
    finally:
        client.close()


def test_the_harness_refuses_what_redis_would_not_do(cluster: LocalCluster, server_binary: str) -> None:
    master = cluster.owner("{refuse}:k")
    [replica] = cluster.replicas_of(master)
    slot = cluster.slot("{refuse}:k")
    with pytest.raises(ValueError, match="not a master"):
        cluster.move_slot(slot, replica)
    with pytest.raises(ValueError, match="not a master"):
        cluster.failover(replica)
    with pytest.raises(ValueError, match="slot must be"):
        cluster.move_slot(HASH_SLOTS, master)
    cluster.move_slot(slot, master)  # already there: nothing to do
    assert cluster.slot_owner(slot) is master
    with pytest.raises(ValueError, match="replicas must be"):
        LocalCluster(replicas=-1, binary=server_binary)


@pytest.mark.slow
def test_a_manual_failover_redis_dropped_is_asked_again(
    tmp_path_factory: pytest.TempPathFactory, server_binary: str
) -> None:
    """A graceful failover whose master hangs past Redis's 5 s manual-failover timeout: Redis
    drops it silently and the replica stays a replica (a CI run on a loaded host timed out
    waiting for the takeover so). The harness asks again and the takeover completes. A node
    timeout of 20 s keeps the cluster's own failure detection out of it."""
    local = LocalCluster(
        tmp_path_factory.mktemp("dropped"), masters=3, replicas=1, node_timeout_ms=20000, binary=server_binary
    )
    local.start(timeout=60)
    try:
        key = "{dropped}:k"
        old = local.owner(key)
        with direct(old) as client:
            client.set(key, "kept")
        [replica] = local.replicas_of(old)
        local.pause(old)
        waker = threading.Timer(7.0, local.resume, args=(old,), kwargs={"wait": False})
        waker.start()
        try:
            new = local.failover(old, timeout=40)
        finally:
            waker.join()
        assert new is replica
        assert local.failovers_asked_again >= 1
        assert local.role(old) == "replica"
        with local.client(decode_responses=True) as client:
            assert client.get(key) == "kept"
    finally:
        local.cleanup()
