"""Canonical JSON and idempotency keys: golden vectors, properties, refusals."""

from __future__ import annotations

import datetime
import decimal
import enum
import hashlib
import json
import math
import uuid
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencekit.errors import CanonicalizeError
from fencekit.primitives.canonical import canonicalize, dumps_json, idempotency_key, loads_json

# Golden vectors: canonical JSON and keys computed with the published fencekit
# 0.6.1 wheel (PYTHONPATH=<unpacked wheel> python -c "from fencekit import
# canonicalize, idempotency_key; ..."), hard-coded here so that our keys stay
# byte-for-byte those of the published releases.
GOLDEN: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "analysis",
        {"game_ids": ["abc", "def"], "engine": "sf16"},
        '{"engine":"sf16","game_ids":["abc","def"]}',
        "analysis:3e292d69dea31502d95dc56e0d86f198d7f7f2b2485aac670d2190f4d8d2a14f",
    ),
    (
        "analysis",
        {},
        "{}",
        "analysis:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
    ),
    (
        "analysis",
        {"a": 1, "b": 1.0},
        '{"a":1,"b":1.0}',
        "analysis:386f210ad07c6df906a0d5d0b05f01a9ad19bf1da1ba515fb01eb4afd012278a",
    ),
    (
        "analysis",
        {"a": 1.0, "b": 1},
        '{"a":1.0,"b":1}',
        "analysis:e88f180ac4892b48447f5bd4649a675502aabb5579a7063de96103c5c64e5a87",
    ),
    (
        "jobs",
        {"b": [3, 2, {"z": None, "y": True, "x": False}], "a": "é✓\u2028"},
        '{"a":"\\u00e9\\u2713\\u2028","b":[3,2,{"x":false,"y":true,"z":null}]}',
        "jobs:b4ad25ad6b2a8f49153071670f26c62b93dbe3c539979c9b6df46f1582b03b8d",
    ),
    (
        "jobs",
        {"t": (1, 2), "n": -0.0, "big": 10**30, "f": 1e100, "g": 0.1, "s": 1e-7},
        '{"big":1000000000000000000000000000000,"f":1e+100,"g":0.1,"n":-0.0,"s":1e-07,"t":[1,2]}',
        "jobs:2e51caf18dc0fa06c3f0fe089289d9d8a5c120826d0d374aea616ad48eb1db1b",
    ),
    (
        "jobs",
        {"nested": {"b": {"d": 1, "c": 2}, "a": []}},
        '{"nested":{"a":[],"b":{"c":2,"d":1}}}',
        "jobs:db8da011e82a186f4e1d1696726cda5d8035ee1d183b23232c90716b9d801c97",
    ),
    (
        "jobs",
        {"emoji": "😀", "ctrl": '\x00\n\t"\\'},
        '{"ctrl":"\\u0000\\n\\t\\"\\\\","emoji":"\\ud83d\\ude00"}',
        "jobs:aed72be5cb83377f412a60ab70a61dae25b82e1c52d3b85db33c4998994e3b27",
    ),
    (
        "email.send",
        {"B": 1, "a": 2, "é": 3, "Z": 4, "": 5, "10": 6, "9": 7},
        '{"":5,"10":6,"9":7,"B":1,"Z":4,"a":2,"\\u00e9":3}',
        "email.send:3ba3cbc32f28f4e8198a4c16a2d8534199df4d711b45a53ba2b15169e658e91c",
    ),
]


@pytest.mark.parametrize(("namespace", "payload", "canonical", "key"), GOLDEN)
def test_keys_match_the_published_fencekit(
    namespace: str, payload: dict[str, Any], canonical: str, key: str
) -> None:
    assert canonicalize(payload) == canonical
    assert idempotency_key(payload, namespace=namespace) == key


def test_the_seed_example_key_is_the_published_one() -> None:
    key = idempotency_key({"game_ids": ["abc", "def"], "engine": "sf16"}, namespace="analysis")
    assert key == GOLDEN[0][3]


def test_other_mapping_and_sequence_types_canonicalize_like_dict_and_list() -> None:
    assert canonicalize(OrderedDict([("b", 1), ("a", 2)])) == '{"a":2,"b":1}'
    assert canonicalize(MappingProxyType({"a": (1, [2, (3,)])})) == '{"a":[1,[2,[3]]]}'
    assert canonicalize({"r": range(3)}) == '{"r":[0,1,2]}'


def test_subclasses_of_json_types_are_reduced_to_their_base_value() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        def __str__(self) -> str:
            return "something else"

    assert canonicalize({Name("k"): Name("v"), "level": Level.HIGH}) == '{"k":"v","level":3}'


# -- properties --------------------------------------------------------------------

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)
payloads = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


def reference(value: Any) -> str:
    """The rule of the seed, spelled with json.dumps alone."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def reordered(value: Any, rnd: Any) -> Any:
    """The same value with every mapping's insertion order shuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reordered(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [reordered(v, rnd) for v in value]
    return value


@given(payloads)
def test_canonical_form_is_the_json_dumps_rule(payload: dict[str, Any]) -> None:
    assert canonicalize(payload) == reference(payload)
    digest = hashlib.sha256(reference(payload).encode("utf-8")).hexdigest()
    assert idempotency_key(payload, namespace="ns") == f"ns:{digest}"


@given(payloads, st.randoms(use_true_random=False))
def test_key_is_stable_under_dict_reordering(payload: dict[str, Any], rnd: Any) -> None:
    shuffled = reordered(payload, rnd)
    assert idempotency_key(shuffled, namespace="ns") == idempotency_key(payload, namespace="ns")


@given(payloads)
def test_canonical_form_is_ascii_and_parses_back_to_the_payload(payload: dict[str, Any]) -> None:
    text = canonicalize(payload)
    assert text.isascii()
    assert json.loads(text) == payload


@given(st.integers(min_value=-(2**60), max_value=2**60))
def test_int_and_float_of_equal_value_give_different_keys(n: int) -> None:
    as_int = idempotency_key({"v": n}, namespace="ns")
    as_float = idempotency_key({"v": float(n)}, namespace="ns")
    assert as_int != as_float
    assert canonicalize({"v": n}) == f'{{"v":{n}}}'


@given(payloads, payloads)
def test_different_payloads_give_different_keys(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert (idempotency_key(a, namespace="ns") == idempotency_key(b, namespace="ns")) == (
        reference(a) == reference(b)
    )


@given(payloads)
def test_dumps_json_round_trips_through_loads_json(payload: dict[str, Any]) -> None:
    assert loads_json(dumps_json(payload)) == payload
    assert loads_json(dumps_json(payload).encode()) == payload


# -- refusals ----------------------------------------------------------------------

UNSUPPORTED = [
    pytest.param(math.nan, "non-finite", id="nan"),
    pytest.param(math.inf, "non-finite", id="inf"),
    pytest.param(-math.inf, "non-finite", id="-inf"),
    pytest.param(b"raw", "bytes", id="bytes"),
    pytest.param(bytearray(b"raw"), "bytearray", id="bytearray"),
    pytest.param({1, 2}, "set", id="set"),
    pytest.param(frozenset(), "frozenset", id="frozenset"),
    pytest.param(datetime.datetime(2024, 1, 1), "ISO-8601", id="datetime"),
    pytest.param(datetime.date(2024, 1, 1), "ISO-8601", id="date"),
    pytest.param(decimal.Decimal("1.5"), "Decimal", id="decimal"),
    pytest.param(uuid.UUID(int=1), "UUID", id="uuid"),
    pytest.param(object(), "object", id="object"),
    pytest.param(1 + 2j, "complex", id="complex"),
]


@pytest.mark.parametrize(("value", "mentions"), UNSUPPORTED)
def test_values_without_an_exact_json_form_are_refused(value: object, mentions: str) -> None:
    with pytest.raises(CanonicalizeError, match=mentions) as top:
        canonicalize({"v": value})
    assert "payload['v']" in str(top.value)
    with pytest.raises(CanonicalizeError, match=r"payload\['outer'\]\[1\]\['v'\]"):
        canonicalize({"outer": [0, {"v": value}]})
    with pytest.raises(CanonicalizeError):
        dumps_json([value])


@given(st.sampled_from([math.nan, math.inf, -math.inf]), payloads)
def test_non_finite_floats_are_refused_anywhere(bad: float, payload: dict[str, Any]) -> None:
    with pytest.raises(CanonicalizeError, match="non-finite"):
        canonicalize({**payload, "\x00bad": [payload, {"deep": bad}]})


@pytest.mark.parametrize("key", [1, 1.5, True, None, (1, 2), b"k"], ids=repr)
def test_non_str_mapping_keys_are_refused(key: object) -> None:
    with pytest.raises(CanonicalizeError, match="keys must be str"):
        canonicalize({key: 1})  # type: ignore[dict-item]
    with pytest.raises(CanonicalizeError, match="keys must be str"):
        canonicalize({"nested": {key: 1}})


@pytest.mark.parametrize("payload", [[1, 2], "text", None, 3, (("a", 1),)], ids=repr)
def test_top_level_must_be_a_mapping(payload: object) -> None:
    with pytest.raises(CanonicalizeError, match="must be a mapping"):
        canonicalize(payload)  # type: ignore[arg-type]
    with pytest.raises(CanonicalizeError, match="must be a mapping"):
        idempotency_key(payload, namespace="ns")  # type: ignore[arg-type]


def test_a_payload_that_contains_itself_is_refused() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(CanonicalizeError, match="nested too deeply"):
        canonicalize(loop)


def test_canonicalize_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^payload\['v'\]: non-finite float nan has no JSON form") as caught:
        canonicalize({"v": math.nan})
    assert type(caught.value) is CanonicalizeError


# -- namespaces --------------------------------------------------------------------


@pytest.mark.parametrize("namespace", ["analysis", "email.send", "a-b_c", "ünï", "x" * 200])
def test_valid_namespaces_prefix_the_key(namespace: str) -> None:
    key = idempotency_key({}, namespace=namespace)
    assert key == f"{namespace}:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


@pytest.mark.parametrize(
    ("namespace", "message"),
    [
        ("", "non-empty"),
        (None, "non-empty"),
        (1, "non-empty"),
        (b"ns", "non-empty"),
        ("a:b", "':' or whitespace"),
        (":", "':' or whitespace"),
        ("a b", "':' or whitespace"),
        ("a\tb", "':' or whitespace"),
        ("ab\n", "':' or whitespace"),
        ("\u00a0ab", "':' or whitespace"),
    ],
    ids=repr,
)
def test_invalid_namespaces_are_refused(namespace: object, message: str) -> None:
    with pytest.raises(CanonicalizeError, match=message):
        idempotency_key({}, namespace=namespace)  # type: ignore[arg-type]


def test_namespace_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        idempotency_key({}, "ns")  # type: ignore[misc]
