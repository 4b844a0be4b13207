"""A real Redis Cluster of private servers, for tests.

:class:`LocalCluster` starts ``masters`` (default 3) ``redis-server
--cluster-enabled yes`` processes on free loopback ports (each with its own
cluster-bus port), joins them with ``CLUSTER MEET``, splits the 16384 hash
slots between them with ``CLUSTER ADDSLOTSRANGE`` (Redis 7+), and waits until
every node reports ``cluster_state:ok``. No replicas: it exists to prove that
fencekit's scripts keep their keys in one slot (I5 of docs/design.md), not to test
failover.

::

    with LocalCluster() as cluster:
        client = cluster.client(decode_responses=True)   # redis.RedisCluster
        ...
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from typing_extensions import Self

from fencekit._redis.process import Managed
from fencekit.testing import RedisServer, find_server_binary, free_port

__all__ = ["HASH_SLOTS", "LocalCluster"]

HASH_SLOTS = 16384


def _slot_ranges(count: int) -> list[tuple[int, int]]:
    """``count`` contiguous, inclusive slot ranges covering 0..16383."""
    bounds = [HASH_SLOTS * i // count for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]


class LocalCluster(Managed):
    """``masters`` cluster-enabled servers joined into one Redis Cluster."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        masters: int = 3,
        host: str = "127.0.0.1",
        binary: str | None = None,
        flavor: str | None = None,
        node_timeout_ms: int = 5000,
    ) -> None:
        if masters < 1:
            raise ValueError(f"masters must be >= 1, got {masters}")
        super().__init__(directory, "fencekit-cluster-")
        self.host = host
        self.binary = binary or find_server_binary(flavor)
        self.nodes: list[RedisServer] = []
        self.bus_ports: list[int] = []
        for index in range(masters):
            bus_port = free_port(host)
            port = free_port(host)
            while port == bus_port:
                port = free_port(host)
            node = RedisServer(
                self.directory / f"node-{index}",
                port=port,
                host=host,
                binary=self.binary,
                config={
                    "cluster-enabled": "yes",
                    "cluster-config-file": f"nodes-{port}.conf",
                    "cluster-node-timeout": str(node_timeout_ms),
                    "cluster-port": str(bus_port),
                },
            )
            self.nodes.append(node)
            self.bus_ports.append(bus_port)

    # lifecycle ------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Self:
        """Start the nodes, join them, assign the slots and wait for ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.start(timeout=max(1.0, deadline - time.monotonic()))
            first = self.nodes[0]
            with first.client() as admin:
                for node, bus_port in zip(self.nodes[1:], self.bus_ports[1:], strict=True):
                    admin.execute_command("CLUSTER MEET", node.host, node.port, bus_port)
            for node, (low, high) in zip(self.nodes, _slot_ranges(len(self.nodes)), strict=True):
                with node.client() as client:
                    client.execute_command("CLUSTER ADDSLOTSRANGE", low, high)
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _node_ready(self, node: RedisServer) -> bool:
        with node.client(socket_timeout=2.0) as client:
            info = client.execute_command("CLUSTER INFO")
        if isinstance(info, dict):  # redis-py parses the reply into a dict
            fields = {str(k): str(v) for k, v in info.items()}
        else:
            raw = info.decode() if isinstance(info, bytes) else str(info)
            fields = dict(line.split(":", 1) for line in raw.splitlines() if ":" in line)
        return (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_known_nodes") == str(len(self.nodes))
            and fields.get("cluster_slots_assigned") == str(HASH_SLOTS)
        )

    def _wait_ready(self, deadline: float) -> None:
        while True:
            if all(self._node_ready(node) for node in self.nodes):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"Redis Cluster on ports {[n.port for n in self.nodes]} did not reach cluster_state:ok"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every node (SIGKILL: nothing to keep)."""
        for node in self.nodes:
            node.kill()

    def cleanup(self) -> None:
        """Stop the nodes and remove the directories this object created."""
        for node in self.nodes:
            node.cleanup()
        super().cleanup()

    # access ---------------------------------------------------------------
    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(node.host, node.port) for node in self.nodes]

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        """A synchronous ``redis.RedisCluster`` that discovers the slots from node 0."""
        first = self.nodes[0]
        return redis.RedisCluster(host=first.host, port=first.port, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.RedisCluster:
        """An asyncio ``redis.asyncio.RedisCluster`` (it initializes on first use)."""
        first = self.nodes[0]
        return redis.asyncio.RedisCluster(host=first.host, port=first.port, **kwargs)

    def __repr__(self) -> str:
        return f"LocalCluster(ports={[n.port for n in self.nodes]})"
