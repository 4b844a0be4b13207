"""The I/O-free mapping rules of ``fencekit upgrade-keys`` (fencekit.upgrade.rules)."""

from __future__ import annotations

import pytest

from fencekit.errors import ConfigError
from fencekit.upgrade.rules import Move, Plan, idem_key_of, ours_shaped, scan_pattern, supported_version


def test_supported_versions_and_a_clear_refusal() -> None:
    assert supported_version("0.6") == "0.6"
    assert supported_version("0.6.1") == "0.6"
    assert supported_version("v0.3") == "0.3"
    with pytest.raises(ConfigError, match=r"supported: 0\.1, 0\.2, 0\.3, 0\.4, 0\.5, 0\.6"):
        supported_version("0.7")


def test_old_names_map_to_our_tagged_names() -> None:
    plan = Plan("fencekit", "fencekit")
    move = plan.move("idem", "fencekit:idem:k")
    assert isinstance(move, Move)
    assert move.keys == (
        "fencekit:idem:k",
        "fencekit:idem:k:result",
        "fencekit:idem:{k}",
        "fencekit:idem:{k}:result",
    )
    lock = plan.move("lock", "fencekit:lock:r")
    assert isinstance(lock, Move)
    assert lock.keys == (
        "fencekit:lock:r",
        "fencekit:fence:seq:r",
        "fencekit:lock:{r}",
    )
    seq = plan.move("seq", "fencekit:fence:seq:r")
    assert isinstance(seq, Move)
    assert seq.keys == ("fencekit:fence:seq:r", "fencekit:lock:{r}:seq")
    fence = plan.move("fence", "fencekit:fence:max:r")
    assert isinstance(fence, Move)
    assert fence.keys == ("fencekit:fence:max:r", "fencekit:fence:{r}")


def test_our_own_keys_are_not_taken_for_old_ones() -> None:
    plan = Plan("fencekit", "fencekit")
    assert plan.move("idem", "fencekit:idem:{k}") == "ours"
    assert plan.move("lock", "fencekit:lock:{r}") == "ours"
    assert ours_shaped("{k}")
    assert ours_shaped("a{b}c")
    assert not ours_shaped("plain")
    # with different prefixes a braced old name is carried (it cannot be ours)
    other = Plan("legacy", "app")
    assert isinstance(other.move("idem", "legacy:idem:{k}"), Move)


def test_result_suffix_is_told_apart_by_value() -> None:
    assert idem_key_of("k", None) == "k"
    assert idem_key_of("k:result", '{"a": 1}') == "k"  # a memo
    assert idem_key_of("k:result", "done") == "k:result"  # a marker of the key "k:result"
    assert idem_key_of("k:result", None) is None  # vanished: decided next run
    plan = Plan("fencekit", "fencekit")
    assert plan.needs_value("idem", "fencekit:idem:k:result")
    assert not plan.needs_value("idem", "fencekit:idem:k")


def test_patterns_escape_the_prefix_and_bad_prefixes_are_refused() -> None:
    assert scan_pattern("a*b", "fence") == r"a\*b:fence:max:*"
    assert Plan("fencekit", "fencekit").move("idem", "other:idem:k") == "foreign"
    with pytest.raises(ConfigError, match="inside the old key space"):
        Plan("fencekit", "fencekit:lock:x")
    with pytest.raises(ConfigError):
        Plan("bad prefix", "fencekit")
