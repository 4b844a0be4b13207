"""Plain annotations checked at the JSON level (fencekit.jobs._types), and the binder using them.

The first hour, item 6: ``nap.enqueue_sync("abc")`` for ``def nap(seconds: float)`` was
accepted and failed in the worker with a retried ``TypeError``.
"""

from __future__ import annotations

from typing import Any, Optional, TypedDict, Union

import pytest

from fencekit.errors import PayloadError
from fencekit.jobs._binding import Binder, Unbound
from fencekit.jobs._types import checks_of


class Point(TypedDict):
    x: int
    y: float


class Labels(TypedDict, total=False):
    name: str


def f(
    i: int,
    x: float,
    s: str,
    b: bool,
    n: None,
    li: list[int],
    d: dict[str, float],
    o: Optional[str],  # noqa: UP045
    u: Union[int, str],  # noqa: UP007
    p: int | None,
    t: Point,
    lab: Labels,
    anything: Any,
    nested: list[dict[str, list[int]]],
) -> None: ...


CASES: list[tuple[str, list[Any], list[Any]]] = [
    ("i", [0, -7, 10**20], [1.5, True, "1", None]),
    ("x", [1, 1.5, -0.0], ["1.5", False, None]),
    ("s", ["", "a"], [1, None, b"a"]),
    ("b", [True, False], [0, 1, None]),
    ("n", [None], [0, ""]),
    ("li", [[], [1, 2]], [[1, "2"], (1, 2), None, [True]]),
    ("d", [{}, {"a": 1, "b": 2.5}], [{"a": "x"}, {1: 1.0}, []]),
    ("o", [None, "a"], [1]),
    ("u", [1, "a"], [1.5, None]),
    ("p", [None, 3], ["3"]),
    ("t", [{"x": 1, "y": 2}, {"x": 1, "y": 2.5}], [{"x": 1}, {"x": "1", "y": 2}, {"x": 1, "y": 2, "z": 3}]),
    ("lab", [{}, {"name": "n"}], [{"name": 1}, {"other": "x"}]),
    ("nested", [[{"a": [1]}], []], [[{"a": ["1"]}], [{1: [1]}]]),
]


@pytest.mark.parametrize(("name", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_each_plain_annotation_takes_its_json_values_and_refuses_the_rest(
    name: str, good: list[Any], bad: list[Any]
) -> None:
    check, _ = checks_of(f)[name]
    assert all(check(v) for v in good), good
    assert not any(check(v) for v in bad), [v for v in bad if check(v)]


def test_what_is_not_plain_is_not_checked() -> None:
    assert "anything" not in checks_of(f)
    assert checks_of(lambda untyped: None) == {}

    def unresolved(x: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    assert checks_of(unresolved) == {}


def nap(seconds: float, *rest: int, label: str = "", **more: str) -> None: ...


def test_the_binder_refuses_a_mistyped_call_at_enqueue_naming_the_parameter() -> None:
    binder = Binder(nap)
    with pytest.raises(PayloadError, match=r"nap\(\): argument 'seconds' must be float, got str 'abc'"):
        binder.encode(("abc",), {})
    with pytest.raises(PayloadError, match=r"argument 'rest' must be a list of int, got list \[1, 'x'\]"):
        binder.encode((1.0, 1, "x"), {})
    with pytest.raises(PayloadError, match=r"argument 'extra' must be str, got int 5"):
        binder.encode((1.0,), {"extra": 5})
    assert binder.encode((1, 2, 3), {"label": "a", "extra": "e"}) == {
        "seconds": 1,
        "rest": [2, 3],
        "label": "a",
        "extra": "e",
    }


def test_a_mistyped_hand_made_task_is_unbound_on_the_worker_a_dead_letter_not_a_retry() -> None:
    binder = Binder(nap)
    with pytest.raises(Unbound, match=r"param 'seconds' must be float, got str 'abc'"):
        binder.decode({"seconds": "abc"})
    assert binder.decode({"seconds": 2}) == ([2], {})
