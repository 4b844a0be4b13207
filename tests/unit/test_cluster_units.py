"""Redis Cluster without I/O: the URL, the slot map, the redirect errors and the routing rule.

The same rule (:func:`fencekit._redis.cluster.routing.route_steps`) drives the lean
``ClusterLink`` and redis-py's batches; here it is driven by a fake cluster of
plain dictionaries whose owners move, so each redirect path runs and the
bounds (redirects, TRYAGAIN) bind. The real cluster runs in
``tests/integration/test_cluster*.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

from fencekit._redis.cluster.routing import (
    HASH_SLOTS,
    MAX_REDIRECTS,
    REFRESH,
    TRYAGAIN_LIMIT,
    SlotMap,
    redirect_of,
    route_steps,
    slot_of,
)
from fencekit._redis.run import Redirected, TryAgain, translate_error, translate_reply
from fencekit._redis.url import parse_url, with_db
from fencekit.errors import ConfigError, StoreError

A, B, C = ("10.0.0.1", 7000), ("10.0.0.2", 7001), ("10.0.0.3", 7002)


# -- URLs -------------------------------------------------------------------------------


def test_a_cluster_url_names_its_seed_nodes_and_keeps_timeouts_by_default() -> None:
    target = parse_url("redis+cluster://u:secret@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002,h/")
    assert target.is_cluster
    assert not target.is_sentinel
    assert target.seeds == (("127.0.0.1", 7000), ("127.0.0.1", 7001), ("::1", 7002), ("h", 6379))
    assert (target.username, target.password, target.db) == ("u", "secret", 0)
    assert (target.socket_timeout, target.socket_connect_timeout) == (5.0, 2.0)
    assert "secret" not in target.redacted()
    assert "secret" not in repr(target)
    assert target.redacted() == "redis+cluster://u:***@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002,h:6379/"


def test_a_node_of_a_cluster_is_a_plain_target_with_the_urls_credentials_tls_and_timeouts() -> None:
    target = parse_url("rediss+cluster://:pw@a:1?ssl_cert_reqs=none&socket_timeout=0.5")
    node = target.node("10.1.1.1", 7005)
    assert (node.scheme, node.host, node.port, node.password) == ("rediss", "10.1.1.1", 7005, "pw")
    assert node.tls is not None
    assert node.tls.cert_reqs == "none"
    assert node.socket_timeout == 0.5
    assert not node.is_cluster
    assert parse_url("redis+cluster://a:1").node("b", 2).scheme == "redis"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://a:1/3", "only database 0"),
        ("redis+cluster://a:1?db=2", "only database 0"),
        ("redis+cluster:///", "no cluster nodes"),
        ("redis+cluster://a:99999", "bad port"),
        ("redis+cluster://a:1?ssl_cert_reqs=none", "rediss"),
        ("redis+cluster://a:1?sentinel_password=x", "sentinel_"),
        ("redis+cluster://a:1?nope=1", "unknown option"),
    ],
)
def test_bad_cluster_urls_are_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_url(url)


def test_database_zero_is_accepted_and_another_refused_on_a_cluster() -> None:
    assert parse_url("redis+cluster://a:1/0").db == 0
    assert parse_url("redis+cluster://a:1?db=0").db == 0
    with pytest.raises(ConfigError, match="only database 0"):
        with_db(parse_url("redis+cluster://a:1"), 1)


# -- the slot map and the redirect errors -----------------------------------------------


def test_slot_of_follows_the_hash_tag_like_the_servers() -> None:
    assert slot_of("fencekit:{work}:pending") == slot_of(b"x{work}y") == key_slot(b"work")
    assert 0 <= slot_of("no-tag") < 16384


def test_the_slot_map_names_the_owner_of_each_slot_and_refuses_an_unserved_one() -> None:
    reply = [[0, 5460, [b"10.0.0.1", 7000, b"id1"]], [5461, 10922, [b"", 7001, b"id2"], [b"r", 1]]]
    slots = SlotMap.from_reply(reply, asked=("10.0.0.9", 7009))
    assert slots.owner(0) == slots.owner(5460) == A
    assert slots.owner(5461) == ("10.0.0.9", 7001)  # no address announced: the node asked
    with pytest.raises(StoreError, match="no Redis Cluster node serves hash slot 10923"):
        slots.owner(10923)
    assert slots.primaries == {A, ("10.0.0.9", 7001)}
    with pytest.raises(StoreError, match="no slots"):
        SlotMap.from_reply([], asked=A)


def test_moved_ask_and_tryagain_become_errors_that_say_the_command_did_not_run() -> None:
    moved = translate_reply("MOVED 3999 10.0.0.2:7001")
    assert isinstance(moved, Redirected)
    assert isinstance(moved, StoreError)
    assert (moved.kind, moved.slot, moved.address) == ("MOVED", 3999, B)
    assert "redis+cluster://" in str(moved)  # a plain URL on a cluster node: the fix is named
    ask = translate_error(AskError("12 10.0.0.3:7002"))
    assert isinstance(ask, Redirected)
    assert (ask.kind, ask.address) == ("ASK", C)
    assert isinstance(translate_error(MovedError("1 10.0.0.1:7000")), Redirected)
    assert isinstance(translate_error(TryAgainError("Multiple keys request during rehashing")), TryAgain)
    assert redirect_of(MovedError("1 10.0.0.1:7000")) is not None
    assert redirect_of(StoreError("x")) is None
    assert redirect_of(b"OK") is None
    assert not isinstance(translate_reply("MOVED garbage"), Redirected)
    # the cluster is down (a failed primary not yet replaced): it did not run, so it is waited on
    assert isinstance(translate_reply("CLUSTERDOWN The cluster is down"), TryAgain)
    assert isinstance(redirect_of(ClusterDownError("The cluster is down")), TryAgain)


# -- the routing rule, driven by a fake cluster ------------------------------------------


class FakeCluster:
    """Slots owned by addresses; ``moves`` makes a node answer MOVED/ASK/TRYAGAIN a number of times."""

    def __init__(self, owners: dict[int, tuple[str, int]]) -> None:
        self.truth = dict(owners)  # who really serves each slot
        self.view = dict(owners)  # what the client's map says
        self.asks: dict[int, tuple[str, int]] = {}  # slot -> the importing node
        self.tryagain: dict[int, int] = {}  # slot -> TRYAGAIN replies left
        self.sent: list[tuple[tuple[str, int], int, bool]] = []  # (node, op, asking)
        self.refreshes = 0
        self.pauses = 0
        self.always_moved = False
        self.holes: dict[int, int] = {}  # slot -> map reads that still name no owner for it

    def owner(self, slot: int) -> tuple[str, int]:
        if self.refreshes < self.holes.get(slot, 0):  # read from a node amid a failover
            raise StoreError(f"no Redis Cluster node serves hash slot {slot} (cluster down or being set up?)")
        return self.view[slot]

    def reply(self, node: tuple[str, int], slot: int, op: int, asking: bool) -> Any:
        self.sent.append((node, op, asking))
        if self.always_moved:
            return translate_reply(f"MOVED {slot} {B[0]}:{B[1]}")
        if asking:
            return f"ran {op} on {node}"
        if self.tryagain.get(slot):
            self.tryagain[slot] -= 1
            return TryAgain("TRYAGAIN")
        if slot in self.asks and node == self.truth[slot]:
            to = self.asks[slot]
            return translate_reply(f"ASK {slot} {to[0]}:{to[1]}")
        if node != self.truth[slot]:
            to = self.truth[slot]
            return translate_reply(f"MOVED {slot} {to[0]}:{to[1]}")
        return f"ran {op} on {node}"

    def drive(self, slots: list[int]) -> list[Any]:
        steps = route_steps(slots, self.owner)
        request = next(steps)
        while True:
            if isinstance(request, list):
                answer: Any = [
                    [self.reply(node, slots[i], i, asking) for i in idx] for node, idx, asking in request
                ]
            elif request is REFRESH:
                self.refreshes += 1
                self.view = dict(self.truth)
                answer = None
            else:
                assert request > 0
                self.pauses += 1
                answer = None
            try:
                request = steps.send(answer)
            except StopIteration as done:
                return list(done.value)


def test_ops_go_to_their_owners_in_one_send_per_node_and_come_back_in_order() -> None:
    fake = FakeCluster({1: A, 2: B, 3: C})
    assert fake.drive([1, 2, 3, 1]) == [f"ran {i} on {n}" for i, n in enumerate([A, B, C, A])]
    assert sorted(fake.sent) == sorted([(A, 0, False), (A, 3, False), (B, 1, False), (C, 2, False)])
    assert fake.refreshes == fake.pauses == 0


def test_moved_reads_the_map_again_and_sends_only_the_moved_ops_to_the_new_owner() -> None:
    fake = FakeCluster({1: A, 2: B})
    fake.truth[1] = C  # slot 1 moved to C; the map still says A
    assert fake.drive([1, 2, 1]) == [f"ran 0 on {C}", f"ran 1 on {B}", f"ran 2 on {C}"]
    assert fake.refreshes == 1
    assert [s for s in fake.sent if s[0] == B] == [(B, 1, False)]  # never sent twice


def test_ask_sends_that_op_once_behind_asking_and_leaves_the_map_alone() -> None:
    fake = FakeCluster({1: A, 2: B})
    fake.asks[1] = C  # slot 1 is migrating from A to C
    assert fake.drive([1, 2]) == [f"ran 0 on {C}", f"ran 1 on {B}"]
    assert (C, 0, True) in fake.sent
    assert fake.refreshes == 0


def test_tryagain_pauses_and_sends_again_until_the_migration_lets_it_run() -> None:
    fake = FakeCluster({1: A})
    fake.tryagain[1] = 3
    assert fake.drive([1]) == [f"ran 0 on {A}"]
    assert fake.pauses == 3


def test_the_bounds_bind_an_endless_redirect_keeps_its_error_in_the_slot() -> None:
    fake = FakeCluster({1: A, 2: B})
    fake.always_moved = True
    (first, second) = fake.drive([1, 2])
    assert isinstance(first, Redirected)
    assert isinstance(second, Redirected)
    assert fake.refreshes == MAX_REDIRECTS
    fake = FakeCluster({1: A})
    fake.tryagain[1] = TRYAGAIN_LIMIT + 5
    (only,) = fake.drive([1])
    assert isinstance(only, TryAgain)
    assert fake.pauses == TRYAGAIN_LIMIT


def test_a_slot_the_map_names_no_owner_for_is_read_again_while_the_other_ops_go_on() -> None:
    """A map read from a node amid a failover may lack the slots of the old primary (the node heard
    "I am a replica now" before the new primary's claim): the op is not sent, the map is read
    again as for a MOVED, and the other ops are sent meanwhile (CI once saw every call of a queue
    fail for good on such a map: no MOVED ever came to refresh it)."""
    fake = FakeCluster({1: A, 2: B})
    fake.holes[1] = 2
    assert fake.drive([1, 2, 1]) == [f"ran 0 on {A}", f"ran 1 on {B}", f"ran 2 on {A}"]
    assert fake.refreshes == 2
    assert fake.sent.count((B, 1, False)) == 1  # sent once, in the first round


def test_a_lasting_hole_in_the_map_keeps_its_store_error_in_its_slot() -> None:
    fake = FakeCluster({1: A, 2: B})
    fake.holes[1] = 10**6
    first, second = fake.drive([1, 2])
    assert isinstance(first, StoreError)
    assert second == f"ran 1 on {B}"
    assert fake.refreshes == MAX_REDIRECTS


def test_a_slot_map_counts_the_slots_it_serves() -> None:
    full = SlotMap.from_reply([[0, 5460, [b"h", 1]], [5461, 16383, [b"h", 2]]], ("h", 0))
    assert (full.served, full.get(16383)) == (HASH_SLOTS, ("h", 2))
    part = SlotMap.from_reply([[0, 5460, [b"h", 1]]], ("h", 0))
    assert (part.served, part.get(5461)) == (5461, None)
    with pytest.raises(StoreError, match="no Redis Cluster node serves hash slot 5461"):
        part.owner(5461)
