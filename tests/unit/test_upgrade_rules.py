"""The I/O-free mapping rules of ``fencekit upgrade-keys`` (fencekit/upgrade/rules.py)."""

from __future__ import annotations

import pytest

from fencekit.errors import ConfigError
from fencekit.upgrade.rules import Move, Plan, idem_key_of, ours_shaped, scan_pattern, supported_version


def test_supported_versions_and_a_clear_refusal() -> None:
    assert supported_version("0.6") == "0.6"
    assert supported_version("0.6.1") == "0.6"
    assert supported_version("v0.1.0") == "0.1"
    with pytest.raises(ConfigError, match=r"supported: 0\.1, 0\.2, 0\.3, 0\.4, 0\.5, 0\.6"):
        supported_version("0.7")


def test_each_old_key_maps_to_ours() -> None:
    plan = Plan("fencekit", "fencekit")
    move = plan.move("idem", "fencekit:idem:job:abc")
    assert isinstance(move, Move)
    assert move.keys == (
        "fencekit:idem:job:abc",
        "fencekit:idem:job:abc:result",
        "fencekit:idem:{job:abc}",
        "fencekit:idem:{job:abc}:result",
    )
    lock = plan.move("lock", "fencekit:lock:res")
    assert isinstance(lock, Move)
    assert lock.keys == ("fencekit:lock:res", "fencekit:fence:seq:res", "fencekit:lock:{res}")
    seq = plan.move("seq", "fencekit:fence:seq:res")
    assert isinstance(seq, Move)
    assert seq.keys == ("fencekit:fence:seq:res", "fencekit:lock:{res}:seq")
    fence = plan.move("fence", "fencekit:fence:max:res")
    assert isinstance(fence, Move)
    assert fence.keys == ("fencekit:fence:max:res", "fencekit:fence:{res}")
    assert fence.deletable


def test_our_own_keys_are_never_taken_for_old_ones() -> None:
    plan = Plan("fencekit", "fencekit")
    assert plan.move("idem", "fencekit:idem:{k}") == "ours"
    assert plan.move("idem", "fencekit:idem:{k}:result", '{"a":1}') == "ours"
    assert plan.move("lock", "fencekit:lock:{r}") == "ours"
    assert plan.move("lock", "fencekit:lock:{r}:seq") == "ours"
    assert plan.move("lock", "fencekit:lock:{}x}") == "ours"  # our lock of resource "}x"
    # an old key whose name carries braces already sits at our name: left in place
    assert plan.move("idem", "fencekit:idem:{batch}:7") == "ours"
    # an old counter that could be our fence of resource "max:{x}" is carried (max) but never deleted
    ambiguous = plan.move("fence", "fencekit:fence:max:{x}")
    assert isinstance(ambiguous, Move)
    assert not ambiguous.deletable


def test_result_names_are_told_apart_by_value() -> None:
    assert idem_key_of("k", None) == "k"
    assert idem_key_of("k:result", '{"memo":1}') == "k"
    assert idem_key_of("k:result", "done") == "k:result"
    assert idem_key_of("k:result", "pending:o") == "k:result"
    assert idem_key_of("k:result", None) is None
    plan = Plan("fencekit", "fencekit")
    assert plan.needs_value("idem", "fencekit:idem:k:result")
    assert not plan.needs_value("idem", "fencekit:idem:k")


def test_shapes_and_patterns() -> None:
    assert ours_shaped("{a}")
    assert ours_shaped("x{a}y")
    assert ours_shaped("{}a}")
    assert not ours_shaped("a")
    assert not ours_shaped("a{}")
    assert not ours_shaped("{}a")
    assert scan_pattern("a*b", "lock") == r"a\*b:lock:*"


def test_other_prefixes_carry_braced_keys_and_refuse_overlaps() -> None:
    plan = Plan("legacy", "app")
    move = plan.move("idem", "legacy:idem:{k}")
    assert isinstance(move, Move)
    assert move.keys[2] == "app:idem:{k}"
    with pytest.raises(ConfigError, match="inside the old key space"):
        Plan("fencekit", "fencekit:lock")
    with pytest.raises(ConfigError, match="braces"):
        Plan("fencekit", "a{b}")
    assert plan.move("lock", "legacy:lock:") == "foreign"
