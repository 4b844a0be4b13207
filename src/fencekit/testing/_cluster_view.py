"""What the cluster harness reads from its nodes (private): slot ranges, CLUSTER NODES, INFO.

Pure parsing, used by :mod:`fencekit.testing._cluster_nodes` and :mod:`fencekit.testing.cluster`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

HASH_SLOTS = 16384
POLL_INTERVAL = 0.05
ADMIN_TIMEOUT = 2.0  # seconds: a paused node must not hang the harness
MIGRATE_TIMEOUT_MS = 5000
# Redis drops a manual failover that has not completed in 5 s (CLUSTER_MF_TIMEOUT): the replica
# stays a replica and says nothing. A master or replica starved of CPU that long (a loaded CI
# host) lets one time out; the harness asks again once this many seconds have passed.
MANUAL_FAILOVER_RETRY = 6.0
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


def _describe(summary: Iterable[tuple[str, str, str | None, Ranges]], ids: dict[int, str]) -> str:
    """One line per view of the cluster, ports for node ids (``ids``: port -> node id)."""
    ports = {node_id: port for port, node_id in ids.items()}
    parts = []
    for node_id, role, master, ranges in summary:
        of = f" of {ports.get(master, master)}" if master else ""
        slots = ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in ranges)
        parts.append(f"{ports.get(node_id, node_id)}={role}{of}{' ' + slots if slots else ''}")
    return " ".join(parts)
