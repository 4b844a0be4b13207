"""A real Redis Cluster of private servers, for tests, with replicas and faults.

:class:`LocalCluster` starts ``masters`` (default 3) ``redis-server
--cluster-enabled yes`` processes on free loopback ports (each with its own
cluster-bus port), plus ``replicas`` (default 0) replicas per master. It joins
them with ``CLUSTER MEET``, splits the 16384 hash slots between the masters
with ``CLUSTER ADDSLOTSRANGE`` (Redis 7+), attaches each replica with
``CLUSTER REPLICATE``, and waits until every node reports
``cluster_state:ok``, every replica's link to its master is up and every
node's view of the topology is the same.

Without replicas it proves that fencekit's scripts keep their keys in one
slot (I5 of docs/design.md). With replicas it lets a test fault the cluster
the way production faults it, with Redis's own protocol, so that fencekit's
behaviour under MOVED, ASK, TRYAGAIN and failovers is exercised for real:

- :meth:`LocalCluster.failover` -- ``CLUSTER FAILOVER [FORCE]`` on a replica
  (a planned switch: the old master becomes a replica of the new one);
- :meth:`LocalCluster.kill` + :meth:`LocalCluster.wait_promoted` -- SIGKILL of
  a node, then the cluster's own failure detection (``node_timeout_ms``)
  promotes a replica; :meth:`LocalCluster.restart` brings the killed node back
  (its ``nodes.conf`` lives in its own directory, so it rejoins the cluster,
  as a replica of the node that took its slots);
- :meth:`LocalCluster.pause` / :meth:`LocalCluster.resume` -- SIGSTOP/SIGCONT
  (a node that hangs: sockets open, no answers);
- :meth:`LocalCluster.move_slot` -- live resharding of one slot
  (``SETSLOT IMPORTING/MIGRATING``, ``GETKEYSINSLOT`` + ``MIGRATE``,
  ``SETSLOT NODE``), with a hook while the slot is half-moved.

Roles are never cached: :attr:`LocalCluster.masters`,
:attr:`LocalCluster.replicas`, :meth:`LocalCluster.owner` and
:meth:`LocalCluster.role` ask the nodes (``ROLE``, ``CLUSTER NODES``,
``CLUSTER SLOTS``), since failovers change them. Every wait is bounded and a
timeout names what was still wrong.

::

    with LocalCluster(replicas=1, node_timeout_ms=1000) as cluster:
        client = cluster.client(decode_responses=True)   # redis.RedisCluster
        url = cluster.url()                              # redis+cluster://h:p,h:p,...
        old = cluster.owner("{job}:1")
        cluster.kill(old)
        new = cluster.wait_promoted(old)                 # a replica of old, now master
        cluster.restart(old)                             # back, as a replica of new
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from fencekit.testing import RedisServer
from fencekit.testing._cluster_nodes import ClusterNodes
from fencekit.testing._cluster_view import (
    ADMIN_TIMEOUT,
    HASH_SLOTS,
    MANUAL_FAILOVER_RETRY,
    MIGRATE_TIMEOUT_MS,
    _in_ranges,
    _Lost,
    _slots_of,
    _text,
)

__all__ = ["HASH_SLOTS", "LocalCluster"]


class LocalCluster(ClusterNodes):
    """A Redis Cluster of private servers with the faults production has (see the module docstring)."""

    # slots ----------------------------------------------------------------
    def slot(self, key: str | bytes) -> int:
        """The hash slot of ``key``, as the servers compute it (``CLUSTER KEYSLOT``)."""
        error: Exception | None = None
        for node in self._live():
            try:
                return int(self._command(node, "CLUSTER", "KEYSLOT", key))
            except redis.RedisError as exc:
                error = exc
        raise RuntimeError(f"{self!r}: no live node answers CLUSTER KEYSLOT ({error})")

    def slot_owner(self, slot: int) -> RedisServer:
        """The master serving ``slot`` now, by ``CLUSTER SLOTS`` of a live node."""
        if not 0 <= slot < HASH_SLOTS:
            raise ValueError(f"slot must be in 0..{HASH_SLOTS - 1}, got {slot}")
        error: Exception | None = None
        for node in self._live():
            try:
                table = self._command(node, "CLUSTER", "SLOTS")
            except redis.RedisError as exc:
                error = exc
                continue
            for entry in table:
                low, high, master = int(entry[0]), int(entry[1]), entry[2]
                if low <= slot <= high:
                    return self._server_at(_text(master[0]), int(master[1]))
            raise RuntimeError(f"{self!r}: no master serves slot {slot} (asked port {node.port})")
        raise RuntimeError(f"{self!r}: no live node answers CLUSTER SLOTS ({error})")

    def owner(self, key: str | bytes) -> RedisServer:
        """The master currently serving ``key``'s slot."""
        return self.slot_owner(self.slot(key))

    # faults -----------------------------------------------------------------
    def _remember(self, server: RedisServer) -> None:
        """Before a kill or a pause: what ``server`` holds, if it is a master, for :meth:`wait_promoted`."""
        node_id = self.node_id(server)
        try:
            view = self._peer_view(exclude=server)
        except RuntimeError:
            return
        entry = view.get(node_id)
        if entry is None or entry.role != "master" or entry.failing:
            self._lost.pop(node_id, None)
            return
        replica_ids = tuple(
            v.node_id for v in view.values() if v.role == "replica" and v.master_id == node_id
        )
        self._lost[node_id] = _Lost(replica_ids, entry.ranges)

    def failover(self, master: RedisServer, *, force: bool = False, timeout: float = 30.0) -> RedisServer:
        """``CLUSTER FAILOVER`` (``FORCE`` when ``force``) on a replica of ``master``; return it.

        Waits until that replica is master of ``master``'s slots on every live
        node's view, the old master (when it is live) is a replica of it with
        its link up, and the cluster is stable. A graceful failover needs
        ``master`` to answer; ``force=True`` does not (e.g. after :meth:`pause`).
        Redis drops a manual failover it could not complete in 5 s (a node
        starved of CPU, or paused meanwhile); the command is then asked again.
        """
        deadline = time.monotonic() + timeout
        master_id = self.node_id(master)
        view = self._peer_view(exclude=master)
        entry = view.get(master_id)
        if entry is None or entry.role != "master":
            raise ValueError(f"{master!r} is not a master")
        live = {node.port for node in self._live()}
        candidates = [
            self._server(v.node_id)
            for v in view.values()
            if v.role == "replica" and v.master_id == master_id and not v.failing and v.port in live
        ]
        if not candidates:
            raise ValueError(f"{master!r} has no live replica to fail over to")
        replica = candidates[0]
        ranges = entry.ranges
        command = ("CLUSTER", "FAILOVER", *(["FORCE"] if force else []))
        self._command(replica, *command)
        asked = time.monotonic()
        replica_id = self.node_id(replica)

        def done() -> RedisServer | None:
            nonlocal asked
            if _text(self._command(replica, "ROLE")[0]) != "master":
                if time.monotonic() - asked >= MANUAL_FAILOVER_RETRY:  # Redis dropped it: ask again
                    self.failovers_asked_again += 1
                    self._command(replica, *command)
                    asked = time.monotonic()
                return None
            if not _slots_of(ranges) <= _slots_of(self._view(replica)[replica_id].ranges):
                return None
            if master.is_running and master.port not in self._paused:
                role = self._command(master, "ROLE")
                if _text(role[0]) == "master" or int(role[2]) != replica.port:
                    return None
            return None if self._problems() else replica

        return self._wait_for(done, deadline, f"port {replica.port} to take over from port {master.port}")

    def kill(self, server: RedisServer) -> None:
        """SIGKILL ``server`` (a crash); :meth:`wait_promoted` then waits for its replica's promotion."""
        self._check_member(server)
        if server.is_running:
            self._remember(server)
        server.kill()
        self._paused.discard(server.port)

    def pause(self, server: RedisServer) -> None:
        """SIGSTOP ``server`` (:meth:`RedisServer.pause`): it hangs with its sockets open."""
        self._check_member(server)
        self._remember(server)
        server.pause()
        self._paused.add(server.port)

    def resume(self, server: RedisServer, *, wait: bool = True, timeout: float = 30.0) -> None:
        """SIGCONT after :meth:`pause`; with ``wait``, until the cluster is stable again.

        A master paused for longer than ``node_timeout_ms`` has been failed
        over meanwhile: it comes back as a replica of the node that took its slots.
        """
        self._check_member(server)
        server.resume()
        self._paused.discard(server.port)
        if wait:
            self.wait_stable(timeout)

    def wait_promoted(self, old_master: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Wait until the cluster promotes a replica of ``old_master`` (killed or paused); return it.

        The promotion is the cluster's own: the node is flagged failing after
        ``node_timeout_ms``, then its replicas hold an election. Done when a
        former replica is master of all of ``old_master``'s slots and the live
        nodes are stable (``cluster_state:ok`` everywhere). The election needs
        the votes of a majority of the masters: with fewer than three masters,
        losing one leaves no majority and no replica is ever promoted.
        """
        deadline = time.monotonic() + timeout
        old_id = self.node_id(old_master)
        lost = self._lost.get(old_id)
        if lost is None:
            view = self._peer_view(exclude=old_master)
            entry = view.get(old_id)
            if entry is None or entry.role != "master" or not entry.ranges:
                raise ValueError(f"{old_master!r} is not a master holding slots")
            replica_ids = tuple(
                v.node_id for v in view.values() if v.role == "replica" and v.master_id == old_id
            )
            lost = _Lost(replica_ids, entry.ranges)
        if not lost.replica_ids:
            raise ValueError(f"{old_master!r} had no replica to promote")
        slots = _slots_of(lost.ranges)

        def promoted() -> RedisServer | None:
            live = {node.port for node in self._live()}
            for replica_id in lost.replica_ids:
                replica = self._server(replica_id)
                if replica.port not in live or _text(self._command(replica, "ROLE")[0]) != "master":
                    continue
                if slots <= _slots_of(self._view(replica)[replica_id].ranges) and not self._problems():
                    return replica
            return None

        new = self._wait_for(promoted, deadline, f"a replica of port {old_master.port} to be promoted")
        self._lost.pop(old_id, None)
        return new

    def restart(self, server: RedisServer, *, wait: bool = True, timeout: float = 30.0) -> RedisServer:
        """Start a killed node again (same port, directory and ``nodes.conf``); with ``wait``, until stable.

        The node reloads its identity and its last view of the cluster from
        ``nodes.conf`` and rejoins. A master that was failed over while down
        learns that its slots moved and becomes a replica of their new owner
        (it had no persistence: it resyncs from it). Restarting a master
        before its replica was promoted brings it back as the (empty) master.
        """
        self._check_member(server)
        deadline = time.monotonic() + timeout
        server.start(timeout=timeout)
        self._paused.discard(server.port)
        if wait:
            self._wait_for(lambda: not self._problems(), deadline, f"port {server.port} to rejoin")
        return server

    # resharding -------------------------------------------------------------
    def move_slot(
        self,
        slot: int,
        to: RedisServer,
        *,
        batch: int = 100,
        replace: bool = False,
        pause_between: float = 0.0,
        on_migrating: Callable[[], None] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Move ``slot`` and its keys to the master ``to``, live, as ``redis-cli --cluster reshard`` does.

        ``CLUSTER SETSLOT slot IMPORTING`` on ``to``, ``MIGRATING`` on the
        current owner, then ``on_migrating()`` (from here until the end, the
        source answers ``ASK`` for a key it no longer has and ``TRYAGAIN`` for
        a multi-key command over keys split between the two nodes), then
        ``CLUSTER GETKEYSINSLOT`` + ``MIGRATE host port "" 0 5000 [REPLACE]
        KEYS ...`` in batches of ``batch`` keys (``REPLACE`` when ``replace``;
        sleeping ``pause_between`` seconds after each batch), then ``CLUSTER
        SETSLOT slot NODE`` on ``to``, on the source and on every other live
        master (the others learn it from them). Waits until every live node
        agrees that ``to`` serves the slot. Moving a slot to its owner does
        nothing. An error on the way (``BUSYKEY`` without ``replace``, a
        timeout) is raised as is and leaves the slot half-moved, as it would
        leave a real cluster.
        """
        if not 0 <= slot < HASH_SLOTS:
            raise ValueError(f"slot must be in 0..{HASH_SLOTS - 1}, got {slot}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self._check_member(to)
        deadline = time.monotonic() + timeout
        source = self.slot_owner(slot)
        if source is to:
            return
        if self.role(to) != "master":
            raise ValueError(f"{to!r} is not a master: slots can only move to a master")
        source_id, target_id = self.node_id(source), self.node_id(to)
        self._command(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        self._command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        if on_migrating is not None:
            on_migrating()
        options = ["REPLACE"] if replace else []
        while True:
            keys = self._command(source, "CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            self._command(
                source,
                "MIGRATE", to.host, to.port, "", 0, MIGRATE_TIMEOUT_MS, *options, "KEYS", *keys,
                timeout=MIGRATE_TIMEOUT_MS / 1000 + ADMIN_TIMEOUT,
            )  # fmt: skip
            if pause_between > 0:
                time.sleep(pause_between)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self!r}: slot {slot} still has keys on port {source.port}")
        others = [n for n in self._live() if n is not to and n is not source and self.role(n) == "master"]
        for node in (to, source, *others):
            self._command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)

        def moved() -> bool:
            for node in self._live():
                view = self._view(node)
                owner = next(
                    (v for v in view.values() if v.role == "master" and _in_ranges(slot, v.ranges)), None
                )
                if owner is None or owner.node_id != target_id:
                    return False
            mine = self._view(to)[target_id], self._view(source)[source_id]
            if any(slot in v.migrating or slot in v.importing for v in mine):
                return False
            return not self._problems()

        self._wait_for(moved, deadline, f"every node to see slot {slot} on port {to.port}")

    # access ---------------------------------------------------------------
    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(node.host, node.port) for node in self.nodes]

    def _seeds(self) -> list[RedisServer]:
        """The live nodes (every node when none is live) for a client's discovery."""
        return self._live() or list(self.nodes)

    def url(self, tls: bool = False) -> str:
        """``redis+cluster://host:port,host:port,...`` listing every node.

        ``tls=True``: ``rediss+cluster://`` on the nodes' TLS ports (a cluster
        built with ``tls``), verifying them against its CA.
        """
        if tls and self.tls is None:
            raise ValueError("url(tls=True) needs a LocalCluster built with tls=make_certificates(...)")
        ports = self.tls_ports if tls else [node.port for node in self.nodes]
        hosts = ",".join(
            f"[{node.host}]:{port}" if ":" in node.host else f"{node.host}:{port}"
            for node, port in zip(self.nodes, ports, strict=True)
        )
        if not tls:
            return f"redis+cluster://{hosts}"
        assert self.tls is not None
        return f"rediss+cluster://{hosts}/?ssl_ca_certs={self.tls.ca_cert}"

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        """A synchronous ``redis.RedisCluster`` that discovers the slots from the live nodes."""
        nodes = [
            redis.cluster.ClusterNode(node.host, node.port)  # type: ignore[no-untyped-call]
            for node in self._seeds()
        ]
        return redis.RedisCluster(startup_nodes=nodes, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.RedisCluster:
        """An asyncio ``redis.asyncio.RedisCluster`` (it initializes on first use)."""
        nodes = [redis.asyncio.cluster.ClusterNode(node.host, node.port) for node in self._seeds()]
        return redis.asyncio.RedisCluster(startup_nodes=nodes, **kwargs)

    def __repr__(self) -> str:
        return f"LocalCluster(ports={[n.port for n in self.nodes]})"
