"""The nodes of a :class:`~fencekit.testing.cluster.LocalCluster` (private): start, stop, topology.

See :mod:`fencekit.testing.cluster` for the harness as a whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry
from typing_extensions import Self

from fencekit._redis.process import Managed
from fencekit.testing import RedisServer, find_server_binary, free_port
from fencekit.testing._cluster_view import (
    _T,
    ADMIN_TIMEOUT,
    POLL_INTERVAL,
    Ranges,
    _describe,
    _Lost,
    _NodeView,
    _parse_info,
    _parse_nodes,
    _slot_ranges,
    _text,
)
from fencekit.testing.tls import Certificates

__all__ = ["ClusterNodes"]


class ClusterNodes(Managed):
    """``masters`` cluster-enabled servers (and ``replicas`` replicas each) joined into one Redis Cluster.

    The nodes, their start and stop, and what they say of the topology; the faults, resharding
    and clients are :class:`~fencekit.testing.cluster.LocalCluster`'s, which is what tests use.

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
        self.failovers_asked_again = 0  # manual failovers Redis dropped, asked again (failover())
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
                + " | ".join(f"{port}: {_describe(s, self._ids)}" for port, s in sorted(summaries.items()))
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
