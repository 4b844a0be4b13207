"""The rules of following a Sentinel-managed master, without I/O (fencekit._redis.sentinel.MasterView)."""

from __future__ import annotations

from fencekit._redis.sentinel import Change, MasterView

OLD = ("10.0.0.1", 6379)
NEW = ("10.0.0.2", 6379)


def reply(
    address: tuple[str, int], epoch: int, flags: str = "master", timeout_ms: int = 6000
) -> dict[bytes, bytes]:
    return {
        b"ip": address[0].encode(),
        b"port": str(address[1]).encode(),
        b"config-epoch": str(epoch).encode(),
        b"flags": flags.encode(),
        b"failover-timeout": str(timeout_ms).encode(),
    }


def view() -> MasterView:
    v = MasterView("mymaster")
    assert v.poll([reply(OLD, 0)], now=0.0) is None  # the first reading tells nothing
    assert v.address == OLD
    return v


def test_a_promotion_suspends_writes_until_the_switch_is_announced() -> None:
    v = view()
    change = v.event(
        "+failover-state-send-slaveof-noone",
        "slave 10.0.0.2:6379 10.0.0.2 6379 @ mymaster 10.0.0.1 6379",
        1.0,
    )
    assert change == Change("suspend", OLD, None)
    assert v.suspended(now=1.5)
    change = v.event("+switch-master", "mymaster 10.0.0.1 6379 10.0.0.2 6379", 2.0)
    assert change == Change("switch", OLD, NEW)
    assert v.address == NEW
    assert not v.suspended(now=2.0)


def test_an_aborted_failover_resumes_on_the_same_master() -> None:
    v = view()
    v.event(
        "+failover-state-send-slaveof-noone",
        "slave 10.0.0.2:6379 10.0.0.2 6379 @ mymaster 10.0.0.1 6379",
        1.0,
    )
    change = v.event("-failover-abort-slave-timeout", "master mymaster 10.0.0.1 6379", 2.0)
    assert change == Change("resume", OLD, OLD)
    assert not v.suspended(now=2.0)


def test_a_suspension_ends_with_the_failover_timeout() -> None:
    v = view()
    v.event("+failover-state-send-slaveof-noone", "slave x:1 x 1 @ mymaster 10.0.0.1 6379", 1.0)
    assert v.suspended(now=1.0 + 5.9)
    assert not v.suspended(now=1.0 + 6.1)  # the replies said failover-timeout 6000 ms


def test_another_masters_announcements_are_ignored() -> None:
    v = view()
    assert v.event("+switch-master", "othermaster 10.0.0.1 6379 10.0.0.2 6379", 1.0) is None
    assert (
        v.event("+failover-state-send-slaveof-noone", "slave x:1 x 1 @ othermaster 10.0.0.9 1", 1.0) is None
    )
    assert v.address == OLD
    assert not v.suspended(now=1.0)


def test_the_highest_config_epoch_wins_over_a_sentinel_that_lags() -> None:
    v = view()
    change = v.poll([reply(OLD, 0), reply(NEW, 1), reply(OLD, 0)], now=1.0)
    assert change == Change("switch", OLD, NEW)
    assert v.poll([reply(OLD, 0)], now=2.0) is None  # an older epoch never moves it back
    assert v.address == NEW


def test_a_poll_that_sees_a_failover_in_progress_suspends_and_one_that_does_not_resumes() -> None:
    v = view()
    assert v.poll([reply(OLD, 0, "master,failover_in_progress")], now=1.0) == Change("suspend", OLD, None)
    assert v.poll([reply(OLD, 0)], now=1.5) is None  # not every sentinel answered: keep waiting
    assert v.suspended(now=1.5)
    assert v.poll([reply(OLD, 0)] * 3, now=2.0, everyone=True) == Change("resume", OLD, OLD)


def test_garbage_replies_change_nothing() -> None:
    v = view()
    assert v.poll([{}, [b"ip"], {b"ip": b"x", b"port": b"notaport"}], now=1.0) is None
    assert v.event("+switch-master", "mymaster only three", 1.0) is None
    assert v.address == OLD
