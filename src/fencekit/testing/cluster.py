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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry
from typing_extensions import Self

from fencekit._redis.process import Managed
from fencekit.testing import RedisServer, find_server_binary, free_port
from fencekit.testing.tls import Certificates

__all__ = ["HASH_SLOTS", "LocalCluster"]

HASH_SLOTS = 16384
POLL_INTERVAL = 0.05
ADMIN_TIMEOUT = 2.0  # seconds: a paused node must not hang the harness
MIGRATE_TIMEOUT_MS = 5000
_FAILING_FLAGS = frozenset({"fail", "fail?", "pfail", "handshake", "noaddr"})
_T = TypeVar("_T")

Ranges = tuple[tuple[int, int], ...]


def _slot_ranges(count: int) -> list[tuple[int, int]]:
    """``count`` contiguous, inclusive slot ranges covering 0..16383."""
    bounds = [HASH_SLOTS * i // count for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _slots_of(ranges: Iterable[tuple[int, int]]) -> set[int]:
    return {slot for low, high in ranges for slot in range(low, high + 1)}


def _in_ranges(slot: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(low <= slot <= high for low, high in ranges)


def _parse_info(raw: object) -> dict[str, str]:
    """``INFO`` or ``CLUSTER INFO``'s ``field:value`` lines as a dict (redis-py parses ``INFO`` itself)."""
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    return dict(line.split(":", 1) for line in _text(raw).splitlines() if ":" in line)


@dataclass(frozen=True)
class _NodeView:
    """One line of ``CLUSTER NODES``: how the asked node sees ``node_id``."""

    node_id: str
    host: str
    port: int
    flags: frozenset[str]
    master_id: str | None  # for a replica, its master's id
    ranges: Ranges
    migrating: dict[int, str] = field(default_factory=dict)  # slot -> destination id
    importing: dict[int, str] = field(default_factory=dict)  # slot -> source id

    @property
    def role(self) -> str:
        return "master" if "master" in self.flags else "replica"

    @property
    def failing(self) -> bool:
        return bool(self.flags & _FAILING_FLAGS)


def _parse_nodes(raw: object) -> dict[str, _NodeView]:
    """``CLUSTER NODES`` as ``{node id: view}`` (the asked node's opinion)."""
    views: dict[str, _NodeView] = {}
    for line in _text(raw).splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        node_id, address, flags_text, master = parts[:4]
        hostport = address.split(",", 1)[0].split("@", 1)[0]
        host, _, port_text = hostport.rpartition(":")
        ranges: list[tuple[int, int]] = []
        migrating: dict[int, str] = {}
        importing: dict[int, str] = {}
        for item in parts[8:]:
            if item.startswith("["):
                body = item.strip("[]")
                if "->-" in body:
                    slot, other = body.split("->-", 1)
                    migrating[int(slot)] = other
                elif "-<-" in body:
                    slot, other = body.split("-<-", 1)
                    importing[int(slot)] = other
                continue
            low, _, high = item.partition("-")
            ranges.append((int(low), int(high or low)))
        views[node_id] = _NodeView(
            node_id=node_id,
            host=host.strip("[]"),
            port=int(port_text) if port_text.isdigit() else 0,
            flags=frozenset(flags_text.split(",")) - {"myself"},
            master_id=None if master == "-" else master,
            ranges=tuple(sorted(ranges)),
            migrating=migrating,
            importing=importing,
        )
    return views


@dataclass(frozen=True)
class _Lost:
    """What a master held when it was killed or paused: its replicas and its slots."""

    replica_ids: tuple[str, ...]
    ranges: Ranges


class LocalCluster(Managed):
    """``masters`` cluster-enabled servers (and ``replicas`` replicas each) joined into one Redis Cluster.

    ``nodes`` lists every server in creation order: the initial masters
    first, then the replicas of master 0, of master 1, ... Their roles change
    with failovers; :attr:`masters` and :attr:`replicas` give the current ones.
    ``node_timeout_ms`` is ``cluster-node-timeout``: how long a node must be
    unreachable before the cluster fails it over (``1000`` makes a promotion
    take a few seconds).
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        masters: int = 3,
        replicas: int = 0,
        host: str = "127.0.0.1",
        binary: str | None = None,
        flavor: str | None = None,
        node_timeout_ms: int = 5000,
        tls: Certificates | None = None,
    ) -> None:
        if masters < 1:
            raise ValueError(f"masters must be >= 1, got {masters}")
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        super().__init__(directory, "fencekit-cluster-")
        self.host = host
        self.binary = binary or find_server_binary(flavor)
        self.node_timeout_ms = node_timeout_ms
        self.master_count = masters
        self.replicas_per_master = replicas
        self.nodes: list[RedisServer] = []
        self.bus_ports: list[int] = []
        self.tls = tls
        self.tls_ports: list[int] = []  # with ``tls``: each node's TLS port (clients, bus and replication)
        taken: set[int] = set()
        for index in range(masters * (1 + replicas)):
            bus_port = free_port(host)
            port = free_port(host)
            while port == bus_port or port in taken or bus_port in taken:
                bus_port, port = free_port(host), free_port(host)
            taken |= {port, bus_port}
            node = RedisServer(
                self.directory / f"node-{index}",
                port=port,
                host=host,
                binary=self.binary,
                config={
                    "cluster-enabled": "yes",
                    # Relative to --dir: the node's own directory, which a kill leaves alone.
                    "cluster-config-file": f"nodes-{port}.conf",
                    "cluster-node-timeout": str(node_timeout_ms),
                    "cluster-port": str(bus_port),
                    "repl-diskless-sync-delay": "0",  # replicas sync at once, not after 5 s
                    **self._tls_config(host),
                },
            )
            self.nodes.append(node)
            self.bus_ports.append(bus_port)
        # replica index -> master index, as built (roles change later)
        self._planned_master: dict[int, int] = {
            masters + m * replicas + r: m for m in range(masters) for r in range(replicas)
        }
        self._ids: dict[int, str] = {}  # port -> node id (stable: it is in nodes.conf)
        self._paused: set[int] = set()  # ports of SIGSTOPped nodes
        self._lost: dict[str, _Lost] = {}  # node id of a killed/paused master -> what it held

    def _tls_config(self, host: str) -> dict[str, str]:
        """With ``tls``: a TLS port beside the plain one (kept for the harness), TLS on the bus too."""
        if self.tls is None:
            return {}
        port = free_port(host)
        self.tls_ports.append(port)
        return {
            "tls-port": str(port),
            "tls-cert-file": str(self.tls.server_cert),
            "tls-key-file": str(self.tls.server_key),
            "tls-ca-cert-file": str(self.tls.ca_cert),
            "tls-auth-clients": "no",
            "tls-cluster": "yes",  # CLUSTER SLOTS then names TLS ports to TLS clients
            "tls-replication": "yes",
        }

    # low level --------------------------------------------------------------
    def _command(self, server: RedisServer, *args: Any, timeout: float = ADMIN_TIMEOUT) -> Any:
        """One command on one node, on a fresh connection, no retries, raw (bytes) reply."""
        with server.client(
            socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
        ) as client:
            return client.execute_command(*args)

    def _view(self, server: RedisServer) -> dict[str, _NodeView]:
        return _parse_nodes(self._command(server, "CLUSTER", "NODES"))

    def _cluster_info(self, server: RedisServer) -> dict[str, str]:
        return _parse_info(self._command(server, "CLUSTER", "INFO"))

    def _replication(self, server: RedisServer) -> dict[str, str]:
        return _parse_info(self._command(server, "INFO", "replication"))

    def _live(self) -> list[RedisServer]:
        """Nodes that run and are not paused: the ones that can answer."""
        return [n for n in self.nodes if n.is_running and n.port not in self._paused]

    def _peer_view(self, *, exclude: RedisServer | None = None) -> dict[str, _NodeView]:
        """``CLUSTER NODES`` from the first live node (other than ``exclude``) that answers."""
        error: Exception | None = None
        for node in self._live():
            if node is exclude:
                continue
            try:
                return self._view(node)
            except redis.RedisError as exc:
                error = exc
        raise RuntimeError(f"{self!r}: no live node answers CLUSTER NODES ({error})")

    def _server(self, node_id: str) -> RedisServer:
        for node in self.nodes:
            if self._ids.get(node.port) == node_id:
                return node
        raise ValueError(f"no node of {self!r} has id {node_id}")

    def _server_at(self, host: str, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise ValueError(f"no node of {self!r} at {host}:{port}")

    def _check_member(self, server: RedisServer) -> None:
        if not any(node is server for node in self.nodes):
            raise ValueError(f"{server!r} is not a node of {self!r}")

    def _wait_for(self, check: Callable[[], _T | None], deadline: float, what: str) -> _T:
        """Poll ``check()`` until it returns a truthy value; Redis errors count as not yet."""
        last = ""
        while True:
            try:
                result = check()
            except redis.RedisError as exc:
                result, last = None, f"{type(exc).__name__}: {exc}"
            if result:
                return result
            if time.monotonic() >= deadline:
                try:
                    problems = "; ".join(self._problems()) or last or "no problem seen on the live nodes"
                except Exception as exc:  # the report must not hide the timeout
                    problems = f"(could not describe the cluster: {exc})"
                raise TimeoutError(f"{self!r}: timed out waiting for {what}: {problems}")
            time.sleep(POLL_INTERVAL)

    def _problems(self) -> list[str]:
        """Why the live nodes are not (yet) one stable cluster; empty when they are.

        Stable: every live node answers, says ``cluster_state:ok`` and knows
        every node; the live nodes' views of the live nodes (role, master,
        slots) are identical and flag none of them as failing; every live
        replica's replication link to the master it names is up.
        """
        live = self._live()
        if not live:
            return ["no live node"]
        problems: list[str] = []
        live_ids = {self.node_id(node): node for node in live}
        summaries: dict[int, tuple[tuple[str, str, str | None, Ranges], ...]] = {}
        views: dict[int, dict[str, _NodeView]] = {}
        for node in live:
            try:
                info = self._cluster_info(node)
                view = self._view(node)
            except redis.RedisError as exc:
                problems.append(f"{node.port}: {type(exc).__name__}: {exc}")
                continue
            views[node.port] = view
            if info.get("cluster_state") != "ok":
                problems.append(f"{node.port}: cluster_state:{info.get('cluster_state')}")
            if len(view) != len(self.nodes):
                problems.append(f"{node.port} knows {len(view)} of {len(self.nodes)} nodes")
            summary = []
            for node_id, peer in sorted(live_ids.items()):
                entry = view.get(node_id)
                if entry is None:
                    problems.append(f"{node.port} does not know {peer.port}")
                    continue
                if entry.failing:
                    problems.append(f"{node.port} flags {peer.port} {','.join(sorted(entry.flags))}")
                master_id = entry.master_id if entry.role == "replica" else None
                summary.append((node_id, entry.role, master_id, entry.ranges))
            summaries[node.port] = tuple(summary)
        if len(set(summaries.values())) > 1:
            problems.append(
                "views differ: "
                + " | ".join(f"{port}: {self._describe(s)}" for port, s in sorted(summaries.items()))
            )
        for node in live:
            own = views.get(node.port)
            entry = own.get(self.node_id(node)) if own else None
            if entry is None or entry.role != "replica" or entry.master_id is None:
                continue
            try:
                replication = self._replication(node)
            except redis.RedisError as exc:
                problems.append(f"{node.port}: {type(exc).__name__}: {exc}")
                continue
            upstream = next((n for n in self.nodes if self._ids.get(n.port) == entry.master_id), None)
            if upstream is None or replication.get("master_port") != str(upstream.port):
                problems.append(f"{node.port} replicates port {replication.get('master_port')}")
            elif replication.get("master_link_status") != "up":
                problems.append(f"{node.port}: master_link_status:{replication.get('master_link_status')}")
        return problems

    def _describe(self, summary: Iterable[tuple[str, str, str | None, Ranges]]) -> str:
        ports = {node_id: port for port, node_id in self._ids.items()}
        parts = []
        for node_id, role, master, ranges in summary:
            of = f" of {ports.get(master, master)}" if master else ""
            slots = ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in ranges)
            parts.append(f"{ports.get(node_id, node_id)}={role}{of}{' ' + slots if slots else ''}")
        return " ".join(parts)

    # lifecycle ------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Self:
        """Start the nodes, join them, assign the slots, attach the replicas; wait until stable.

        When the nodes' directories already hold a joined cluster (a second
        :meth:`start` after :meth:`stop`), the nodes reload it from their
        ``nodes.conf`` and this only waits until they are stable again.
        """
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.start(timeout=max(1.0, deadline - time.monotonic()))
            for node in self.nodes:
                self._ids[node.port] = _text(self._command(node, "CLUSTER", "MYID"))
            fresh = all(len(self._view(node)) == 1 for node in self.nodes)
            if fresh:
                self._create(deadline)
            self._wait_for(lambda: not self._problems(), deadline, "the cluster to be stable")
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, deadline: float) -> None:
        masters = self.nodes[: self.master_count]
        # Distinct config epochs up front (as redis-cli --cluster create does), so no
        # epoch collision has to be resolved before the first failover.
        for epoch, node in enumerate(self.nodes, start=1):
            self._command(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for node, (low, high) in zip(masters, _slot_ranges(len(masters)), strict=True):
            self._command(node, "CLUSTER", "ADDSLOTSRANGE", low, high)
        # Every pair meets once (not just node 0 and the rest): the nodes then need no
        # rounds of gossip, at one ping a second, to learn of each other.
        for index, node in enumerate(self.nodes):
            for other, bus_port in zip(self.nodes[index + 1 :], self.bus_ports[index + 1 :], strict=True):
                self._command(node, "CLUSTER", "MEET", other.host, other.port, bus_port)
        everyone = set(self._ids.values())

        def handshaken() -> bool:
            for node in self.nodes:
                view = self._view(node)
                if set(view) != everyone or any("handshake" in v.flags for v in view.values()):
                    return False
            return True

        self._wait_for(handshaken, deadline, "every node to know every other")
        for replica_index, master_index in self._planned_master.items():
            replica, master = self.nodes[replica_index], self.nodes[master_index]
            self._command(replica, "CLUSTER", "REPLICATE", self.node_id(master))

        def as_planned() -> bool:
            for node in self.nodes:
                view = self._view(node)
                for replica_index, master_index in self._planned_master.items():
                    entry = view.get(self.node_id(self.nodes[replica_index]))
                    if entry is None or entry.master_id != self.node_id(self.nodes[master_index]):
                        return False
            return not self._problems()

        self._wait_for(as_planned, deadline, "every replica to replicate its master")

    def stop(self) -> None:
        """Stop every node (SIGKILL: nothing to keep)."""
        for node in self.nodes:
            node.kill()
        self._paused.clear()

    def cleanup(self) -> None:
        """Stop the nodes and remove the directories this object created."""
        for node in self.nodes:
            node.cleanup()
        self._paused.clear()
        super().cleanup()

    def wait_stable(self, timeout: float = 30.0) -> None:
        """Wait until the live nodes form one stable cluster.

        That is: ``cluster_state:ok`` on every live node, identical views of
        the live nodes' roles, masters and slots, none of them flagged as
        failing, and every live replica's link to its master up. Killed and
        paused nodes are left out.
        """
        self._wait_for(lambda: not self._problems(), time.monotonic() + timeout, "the cluster to be stable")

    # topology -------------------------------------------------------------
    def node_id(self, server: RedisServer) -> str:
        """The cluster node id of ``server`` (40 hex digits; it survives restarts)."""
        self._check_member(server)
        known = self._ids.get(server.port)
        if known is not None:
            return known
        if not server.is_running:
            raise ValueError(f"{server!r} has not been started: it has no node id yet")
        node_id = _text(self._command(server, "CLUSTER", "MYID"))
        self._ids[server.port] = node_id
        return node_id

    def role(self, server: RedisServer) -> str | None:
        """``"master"`` or ``"replica"`` now; None for a node that is not running.

        A live node is asked (``ROLE``); a paused one cannot answer, so a live
        peer's ``CLUSTER NODES`` says what the cluster thinks it is.
        """
        self._check_member(server)
        if not server.is_running:
            return None
        if server.port not in self._paused:
            try:
                reply = self._command(server, "ROLE")
                return "master" if _text(reply[0]) == "master" else "replica"
            except redis.RedisError:
                pass
        try:
            entry = self._peer_view(exclude=server).get(self.node_id(server))
        except RuntimeError:
            return None
        return entry.role if entry is not None else None

    @property
    def masters(self) -> list[RedisServer]:
        """The running nodes that are masters now (in :attr:`nodes` order)."""
        return [node for node in self.nodes if self.role(node) == "master"]

    @property
    def replicas(self) -> list[RedisServer]:
        """The running nodes that are replicas now (in :attr:`nodes` order)."""
        return [node for node in self.nodes if self.role(node) == "replica"]

    def master_of(self, replica: RedisServer) -> RedisServer | None:
        """The master ``replica`` replicates, as the cluster sees it (None for a master)."""
        view = (
            self._view(replica)
            if replica.is_running and replica.port not in self._paused
            else self._peer_view(exclude=replica)
        )
        entry = view.get(self.node_id(replica))
        if entry is None or entry.role != "replica" or entry.master_id is None:
            return None
        return self._server(entry.master_id)

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The nodes the cluster lists as replicas of ``master`` (running or not)."""
        master_id = self.node_id(master)
        view = self._peer_view()
        return [
            self._server(v.node_id)
            for v in view.values()
            if v.role == "replica" and v.master_id == master_id and v.node_id in self._ids.values()
        ]

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
        self._command(replica, "CLUSTER", "FAILOVER", *(["FORCE"] if force else []))
        replica_id = self.node_id(replica)

        def done() -> RedisServer | None:
            if _text(self._command(replica, "ROLE")[0]) != "master":
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
