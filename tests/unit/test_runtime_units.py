"""Rules without I/O: the consumer's outbox, the registry record, the lease, hooks, restart back-off."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import pytest

from fencekit import Client, ConfigError
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit.consume._outbox import AckClaim, Outbox, Settle
from fencekit.jobs._registry import ConsumerRecord, consumer_id, lease_ok
from fencekit.pool._children import MAX_BACKOFF, Child, ChildState, restart_delay
from fencekit.runtime.app import App
from fencekit.runtime.hooks import check_hook, run_hooks

KEYS = KeySpace()


def _outbox(queues: Sequence[str] = ("a", "b")) -> Outbox:
    def ack_claim(
        queue: str,
        want: int,
        acks: Sequence[int],
        recorded: Sequence[scripts.RecordedAck],
        writes: Sequence[scripts.StagedWrite] = (),
    ) -> scripts.Call:
        qk = KEYS.queue(queue)
        return scripts.ack_claim(
            pending=qk.pending,
            inflight=qk.inflight("c"),
            token_counter=qk.token_counter,
            stats=qk.stats,
            wake=qk.wake,
            want=want,
            acks=acks,
            recorded=recorded,
            finished=qk.finished,
            channel=qk.done_channel,
            keep_finished=10,
            writes=writes,
        )

    return Outbox(queues, ack_claim)


def _settle_call(queue: str) -> scripts.Call:
    qk = KEYS.queue(queue)
    return scripts.purge(
        pending=qk.pending, stats=qk.stats, record_prefix=""
    )  # any call: the outbox does not read it


# -- the outbox -----------------------------------------------------------------------


def test_a_turn_sends_settles_first_then_one_ack_claim_per_queue_in_order() -> None:
    box = _outbox()
    box.ack("b", 11, "jb")
    box.settle("a", 7, _settle_call("a"), "ja")
    box.ack("a", 5, "j5")
    turn = box.take("a", 3)
    assert [type(i) for i in turn.items] == [Settle, AckClaim, AckClaim]
    assert [(i.queue, i.acks, i.want) for i in turn.items[1:]] == [("a", [5], 3), ("b", [11], 0)]
    assert turn.calls[1].args == (3, 1, 5)  # want, how many plain acks, the acks
    assert turn.claims
    assert turn.settles
    assert not box  # everything went into the turn
    assert box.jid("a", 5) == "j5"  # until its reply comes back


def test_a_failed_turn_is_restored_acks_first_and_goes_out_again() -> None:
    box = _outbox()
    box.ack("a", 1, "j1")
    first = box.take(None, 0)
    box.ack("a", 2, "j2")
    box.restore(first)
    again = box.take(None, 0)
    (item,) = again.items
    assert isinstance(item, AckClaim)
    assert item.acks == [1, 2]
    assert not again.claims


def test_staged_writes_ride_their_queues_ack_claim_and_are_restored_with_its_acks() -> None:
    box = _outbox()
    w1 = scripts.StagedWrite(1, "fencekit:fence:{a}:job:j1", "{a}:out", "v1")
    w2 = scripts.StagedWrite(2, "fencekit:fence:{a}:job:j2", "{a}:out", 7)
    box.ack("a", 1, "j1", None, [w1])
    box.ack("b", 9, "j9")
    first = box.take(None, 0)
    item, other = first.items
    assert isinstance(item, AckClaim)
    assert isinstance(other, AckClaim)
    assert (item.acks, item.writes, other.writes) == ([1], [w1], [])
    call = first.calls[0]
    assert call.args[1] == "1 1"  # one plain ack, one write: the write's token and value come last
    assert call.args[-2:] == (1, "v1")
    assert call.keys[-2:] == (w1.fence, w1.target)
    assert first.calls[1].args == (0, 1, 9)  # a queue without writes: the call as before
    box.ack("a", 2, "j2", None, [w2])
    box.restore(first)
    (again, _) = box.take(None, 0).items
    assert isinstance(again, AckClaim)
    assert (again.acks, again.writes) == ([1, 2], [w1, w2])


def test_an_idle_turn_carries_nothing() -> None:
    turn = _outbox().take(None, 5)
    assert turn.items == []
    assert turn.calls == []
    assert not turn.claims


def test_the_outbox_knows_which_deliveries_wait_in_it_or_in_a_turn() -> None:
    box = _outbox()
    box.ack("a", 1, None)
    box.settle("a", 2, _settle_call("a"), None)
    turn = box.take(None, 0)
    box.ack("a", 3, None)
    assert turn.tokens("a") == {1, 2}
    assert box.waiting("a") == {3}
    assert turn.tokens("b") == set()
    assert box.done("a", 1) is None
    assert box.jid("a", 1) is None


def test_recorded_acks_travel_with_their_record_and_survive_a_failed_turn() -> None:
    box = _outbox()
    qk = KEYS.queue("a")
    rec = scripts.RecordedAck(qk.job("j2"), 2, "j2", b'"ok"', 5000, b"")
    box.ack("a", 1, "j1")
    box.ack("a", 2, "j2", rec)
    box.ack("a", 3, "j3")
    first = box.take(None, 0)
    call = first.calls[0]
    assert call.args[:5] == (0, 2, 1, 3, qk.done_channel)  # plain acks first, then the channel
    assert call.args[5:] == (10, 2, "j2", b'"ok"', 5000, b"", "", "")  # keep_finished, the record's 7
    assert call.keys[5:] == (qk.finished, qk.job("j2"))
    assert first.tokens("a") == {1, 2, 3}
    box.restore(first)
    again = box.take(None, 0)
    assert again.calls[0].args == call.args  # the record went out again with its ack
    for token in (1, 2, 3):
        box.done("a", token)
    box.ack("a", 2, "j2")  # the same token acked plain now: no stale record rides along
    assert box.take(None, 0).calls[0].args == (0, 1, 2)


def test_a_claim_from_a_queue_without_acks_is_its_own_ack_claim() -> None:
    box = _outbox()
    turn = box.take("b", 4)
    (item,) = turn.items
    assert isinstance(item, AckClaim)
    assert (item.queue, item.acks, item.want) == ("b", [], 4)
    assert not turn.settles


# -- the registry ---------------------------------------------------------------------


def test_consumer_ids_are_never_reused() -> None:
    ids = {consumer_id("child0") for _ in range(100)}
    assert len(ids) == 100
    assert all(":child0:" in i for i in ids)


def test_a_consumer_record_round_trips_and_odd_records_never_raise() -> None:
    record = ConsumerRecord.new("c1", ["emails", "reports"], 4, "pool-child", slot=1, supervisor=99)
    assert ConsumerRecord.from_json("c1", record.to_json()) == record
    for raw in (None, b"", b"not json", b"[1, 2]", b'{"queues": "emails"}', b'{"pid": "12", "queues": [1]}'):
        odd = ConsumerRecord.from_json("c2", raw)
        assert odd.id == "c2"
        assert odd.queues is None
        assert odd.pid is None
    mixed = ConsumerRecord.from_json("c3", b'{"queues": ["ok", "bad name", "{tag}"]}')
    assert mixed.queues == ("ok",)  # invalid names dropped, not trusted


def test_the_lease_holds_for_half_the_ttl() -> None:
    assert lease_ok(100.0, 10.0, now=104.9)
    assert not lease_ok(100.0, 10.0, now=105.0)
    assert not lease_ok(0.0, 30.0, now=1000.0)


# -- hooks ----------------------------------------------------------------------------


async def test_a_hook_takes_no_argument_or_the_client() -> None:
    seen: list[object] = []

    async def bare() -> None:
        seen.append("bare")

    async def with_client(client: Client) -> None:
        seen.append(client)

    client = Client()
    await run_hooks([check_hook(bare, "on_startup"), check_hook(with_client, "on_startup")], client)
    assert seen == ["bare", client]


def test_a_hook_that_is_not_async_or_wants_more_is_refused() -> None:
    def sync() -> None:
        return None

    async def two(a: object, b: object) -> None:
        return None

    async def keyword(*, client: object) -> None:
        return None

    with pytest.raises(ConfigError, match="on_startup takes an async function"):
        check_hook(sync, "on_startup")
    with pytest.raises(ConfigError, match="must take no argument, or one: the Client"):
        check_hook(two, "on_shutdown")
    with pytest.raises(ConfigError, match="must take no argument, or one: the Client"):
        check_hook(keyword, "on_shutdown")
    with pytest.raises(ConfigError, match=r"App\(on_pool_startup=...\) takes a list"):
        App([], on_pool_startup="seed")  # type: ignore[arg-type]


def test_an_app_checks_its_hooks_when_built() -> None:
    async def seed(client: Client) -> None:
        return None

    app = App([object()], on_pool_startup=[seed])
    assert app.on_pool_startup == (seed,)
    assert inspect.iscoroutinefunction(app.on_pool_startup[0])
    with pytest.raises(ConfigError, match="on_startup takes an async function"):
        App([object()], on_startup=[print])  # type: ignore[list-item]


# -- the supervisor's back-off --------------------------------------------------------


def test_a_slot_that_keeps_dying_at_start_waits_longer_each_time() -> None:
    child = Child(0)
    delays = [restart_delay(child, lived=0.2, expected=False) for _ in range(12)]
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert delays[-1] == MAX_BACKOFF
    assert child.quick_deaths == 12
    assert restart_delay(child, lived=60.0, expected=False) == 0.0
    assert child.quick_deaths == 0


def test_an_expected_exit_restarts_at_once() -> None:
    child = Child(0, quick_deaths=5)
    assert restart_delay(child, lived=0.1, expected=True) == 0.0
    assert child.quick_deaths == 0


def test_child_states_say_who_beats_and_who_is_trusted() -> None:
    assert {s for s in ChildState if s.beating} == {
        ChildState.REGISTERING,
        ChildState.STARTING,
        ChildState.SERVING,
        ChildState.REPLACING,
    }
    assert not ChildState.HUNG.beating  # a hung child's beats stop, so peers may reap it
    assert ChildState.HUNG.alive
    assert not ChildState.HUNG.trusted
    assert not ChildState.EXITED.alive
