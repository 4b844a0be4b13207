"""A real Sentinel deployment of private servers, for failover tests.

:class:`LocalSentinel` starts a master, ``replicas`` (default 1) replicas and
``sentinels`` (default 3) ``redis-server --sentinel`` processes on free
loopback ports, waits until every sentinel sees the master, every replica and
every other sentinel, and offers the two ways a master goes away:

- :meth:`LocalSentinel.failover` -- ``SENTINEL FAILOVER`` (a planned switch:
  the old master is demoted to a replica of the new one);
- :meth:`LocalSentinel.kill_master` -- SIGKILL of the current master (a
  crash: the sentinels notice after ``down_after_ms`` and promote a replica).

::

    with LocalSentinel() as cluster:
        url = cluster.url                     # redis+sentinel://.../mymaster
        old = cluster.master_address()
        cluster.failover()                    # returns the new master's address
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
from typing_extensions import Self

from fencekit._redis.process import Managed
from fencekit.testing import RedisServer, find_server_binary

__all__ = ["LocalSentinel"]

Address = tuple[str, int]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LocalSentinel(Managed):
    """A master, its replicas and a quorum of sentinels on loopback."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        master_name: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 6000,
        host: str = "127.0.0.1",
        binary: str | None = None,
        flavor: str | None = None,
        appendonly: bool = False,
        config: dict[str, Any] | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"a failover needs at least one replica, got {replicas}")
        if sentinels < 1:
            raise ValueError(f"sentinels must be >= 1, got {sentinels}")
        super().__init__(directory, "fencekit-sentinel-")
        self.master_name = master_name
        self.host = host
        self.binary = binary or find_server_binary(flavor)
        self.quorum = quorum if quorum is not None else sentinels // 2 + 1
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        extra = dict(config or {})
        extra.setdefault("repl-diskless-sync-delay", 0)  # replicas sync at once, not after 5 s
        master = RedisServer(
            self.directory / "node-0", host=host, binary=self.binary, appendonly=appendonly, config=extra
        )
        self.nodes: list[RedisServer] = [master]
        for index in range(1, replicas + 1):
            self.nodes.append(
                RedisServer(
                    self.directory / f"node-{index}",
                    host=host,
                    binary=self.binary,
                    appendonly=appendonly,
                    config={**extra, "replicaof": f"{host} {master.port}"},
                )
            )
        self.sentinels: list[RedisServer] = []
        for index in range(sentinels):
            self.sentinels.append(
                RedisServer(
                    self.directory / f"sentinel-{index}", host=host, binary=self.binary, sentinel=True
                )
            )
        self._initial_master: Address = (host, master.port)

    # lifecycle ------------------------------------------------------------
    def _write_sentinel_conf(self, sentinel: RedisServer) -> None:
        host, port = self._initial_master
        name = self.master_name
        lines = [
            f"port {sentinel.port}",
            f"bind {sentinel.host}",
            f"dir {sentinel.directory}",
            f"sentinel monitor {name} {host} {port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        conf = sentinel.directory / f"sentinel-{sentinel.port}.conf"
        conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 30.0) -> Self:
        """Start every process and wait until the sentinels agree on the topology."""
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.start(timeout=max(1.0, deadline - time.monotonic()))
            self._wait(lambda: self._replicas_in_sync(self._initial_master), deadline, "replicas in sync")
            for sentinel in self.sentinels:
                self._write_sentinel_conf(sentinel)
                sentinel.start(timeout=max(1.0, deadline - time.monotonic()))
            self._wait(self._sentinels_agree, deadline, "sentinels to agree")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGKILL every process (nothing to keep)."""
        for proc in (*self.sentinels, *self.nodes):
            proc.kill()

    def cleanup(self) -> None:
        """Stop everything and remove the directories this object created."""
        for proc in (*self.sentinels, *self.nodes):
            proc.cleanup()
        super().cleanup()

    # topology -------------------------------------------------------------
    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL naming every sentinel (short timeouts for tests)."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master_name}?socket_timeout=1&socket_connect_timeout=1"

    def node_at(self, address: Address) -> RedisServer:
        """The :class:`RedisServer` listening at ``address``."""
        for node in self.nodes:
            if (node.host, node.port) == tuple(address):
                return node
        raise KeyError(f"no node at {address}")

    def _sentinel_client(self, sentinel: RedisServer) -> redis.Redis:
        return redis.Redis(
            host=sentinel.host, port=sentinel.port, socket_timeout=1.0, socket_connect_timeout=1.0
        )

    def master_address(self, sentinel_index: int | None = None) -> Address:
        """The master as the sentinels name it (the first one that answers, or one given)."""
        candidates = self.sentinels if sentinel_index is None else [self.sentinels[sentinel_index]]
        last: Exception | None = None
        for sentinel in candidates:
            if not sentinel.is_running:
                continue
            try:
                with self._sentinel_client(sentinel) as client:
                    host, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.master_name)
                return (_text(host), int(port))
            except (redis.RedisError, OSError, TypeError, ValueError) as exc:
                last = exc
        raise RuntimeError(f"no sentinel names master {self.master_name!r}: {last}")

    def master(self) -> RedisServer:
        """The :class:`RedisServer` the sentinels currently name master."""
        return self.node_at(self.master_address())

    def replicas(self) -> list[RedisServer]:
        """Every node but the current master."""
        current = self.master_address()
        return [n for n in self.nodes if (n.host, n.port) != current]

    def role(self, node: RedisServer) -> str:
        """``master`` or ``slave`` as the node itself says (``down`` if it does not answer)."""
        try:
            with node.client(socket_timeout=1.0, socket_connect_timeout=1.0) as client:
                return _text(client.execute_command("ROLE")[0])
        except (redis.RedisError, OSError):
            return "down"

    def _replicas_in_sync(self, master: Address) -> bool:
        for node in self.nodes:
            if (node.host, node.port) == master:
                continue
            try:
                with node.client(socket_timeout=1.0) as client:
                    info = client.info("replication")
            except (redis.RedisError, OSError):
                return False
            if info.get("role") != "slave" or info.get("master_link_status") != "up":
                return False
            if int(info.get("master_port", 0)) != master[1]:
                return False
        return True

    def _sentinels_agree(self) -> bool:
        master = self._initial_master
        running_replicas = len(self.nodes) - 1
        for sentinel in self.sentinels:
            try:
                with self._sentinel_client(sentinel) as client:
                    state = client.execute_command("SENTINEL MASTER", self.master_name)
            except (redis.RedisError, OSError):
                return False
            if isinstance(state, list):
                state = {_text(state[i]): state[i + 1] for i in range(0, len(state), 2)}
            fields = {_text(k): _text(v) for k, v in dict(state).items()}
            if (fields.get("ip"), int(fields.get("port", 0))) != master:
                return False
            if int(fields.get("num-slaves", 0)) < running_replicas:
                return False
            if int(fields.get("num-other-sentinels", 0)) < len(self.sentinels) - 1:
                return False
            if "s_down" in fields.get("flags", "") or "o_down" in fields.get("flags", ""):
                return False
        return True

    def _wait(self, predicate: Any, deadline: float, what: str) -> None:
        while not predicate():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"sentinel set-up: timed out waiting for {what}")
            time.sleep(0.05)

    # faults -----------------------------------------------------------------
    def wait_for_new_master(self, old: Address, timeout: float = 30.0) -> Address:
        """Wait until every running sentinel names a master other than ``old``, which says it is master."""
        deadline = time.monotonic() + timeout

        def switched() -> Address | None:
            seen = set()
            for index, sentinel in enumerate(self.sentinels):
                if not sentinel.is_running:
                    continue
                try:
                    seen.add(self.master_address(index))
                except RuntimeError:
                    return None
            if len(seen) != 1:
                return None
            (new,) = seen
            if new == old or self.role(self.node_at(new)) != "master":
                return None
            return new

        while True:
            new = switched()
            if new is not None:
                return new
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no new master after {timeout}s (old {old})")
            time.sleep(0.05)

    def failover(self, timeout: float = 30.0, *, wait: bool = True) -> Address:
        """``SENTINEL FAILOVER``; returns the new master once every sentinel names it.

        With ``wait=False`` it returns the old master's address right after the
        command was accepted.
        """
        old = self.master_address()
        deadline = time.monotonic() + timeout
        while True:  # a sentinel refuses while it is not ready ("NOGOODSLAVE", "INPROG")
            try:
                with self._sentinel_client(self.sentinels[0]) as client:
                    client.execute_command("SENTINEL FAILOVER", self.master_name)
                break
            except redis.ResponseError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
        if not wait:
            return old
        return self.wait_for_new_master(old, max(1.0, deadline - time.monotonic()))

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master; returns its :class:`RedisServer` (to restart it later)."""
        node = self.master()
        node.kill()
        return node

    def wait_demoted(self, node: RedisServer, timeout: float = 30.0) -> None:
        """Wait until ``node`` is a replica with its link to the new master up."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with node.client(socket_timeout=1.0) as client:
                    info = client.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") == "up":
                    return
            except (redis.RedisError, OSError):
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{node!r} did not rejoin as a replica")
            time.sleep(0.05)

    def __repr__(self) -> str:
        return (
            f"LocalSentinel(nodes={[n.port for n in self.nodes]}, "
            f"sentinels={[s.port for s in self.sentinels]})"
        )
