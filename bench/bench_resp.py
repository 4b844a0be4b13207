"""RESP encoder micro-benchmarks: compiled ``fencekit._redis._resp`` vs pure ``fencekit._redis._resp_py``.

Run::

    pytest bench/bench_resp.py --benchmark-columns=mean,median,ops

Each ``benchmark.group`` holds the two implementations of one workload side by
side: ``pack_evalsha`` of an ack+claim call with K = 1, 16 and 128
acknowledgement-sized arguments (24-byte ids) and a plain ``pack_command``.
At the end the compiled/pure speed-up of every group is printed. Nothing
here asserts on timings.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from fencekit._redis import _resp_py

SHA = "e0e1f9fabfc9d4800c877a703b823ac0578ff831"
KEYS = (
    "fencekit:{emails}:pending",
    "fencekit:{emails}:inflight:host1-4242-1",
    "fencekit:{emails}:fence",
    "fencekit:{emails}:stats",
    "fencekit:{emails}:wake",
)

_means: dict[str, dict[str, float]] = {}


def _implementations() -> dict[str, ModuleType]:
    found = {"python": _resp_py}
    try:
        found["compiled"] = importlib.import_module("fencekit._redis._resp")
    except ImportError:
        pass
    return found


IMPLEMENTATIONS = _implementations()


def ack_args(k: int) -> tuple[Any, ...]:
    """``want`` then ``k`` 24-byte job ids, the shape of an ack+claim call."""
    return (k, *(f"{i:024d}".encode() for i in range(k)))


@pytest.fixture(scope="module", autouse=True)
def _print_ratios(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["", "compiled vs pure RESP encoder (mean time, pure / compiled):"]
    for group, means in sorted(_means.items()):
        if "python" in means and "compiled" in means:
            ratio = means["python"] / means["compiled"]
            lines.append(
                f"  {group:<24} python {means['python'] * 1e6:8.2f} us"
                f"   compiled {means['compiled'] * 1e6:8.2f} us   x{ratio:5.1f}"
            )
    if len(lines) > 2:
        write = reporter.write_line if reporter is not None else print
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            for line in lines:
                write(line)


def _bench(benchmark: Any, group: str, impl: str, fn: Callable[[], bytes]) -> None:
    benchmark.group = group
    benchmark.extra_info["implementation"] = impl
    assert fn() == fn()  # warm the SHA prefix cache; same output every time
    benchmark(fn)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        _means.setdefault(group, {})[impl] = stats.stats.mean


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("k", [1, 16, 128])
def test_pack_evalsha(benchmark: Any, impl: str, k: int) -> None:
    pack_evalsha = IMPLEMENTATIONS[impl].pack_evalsha
    args = ack_args(k)
    _bench(benchmark, f"pack_evalsha K={k}", impl, lambda: pack_evalsha(SHA, KEYS, args))


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
def test_pack_command(benchmark: Any, impl: str) -> None:
    pack_command = IMPLEMENTATIONS[impl].pack_command
    _bench(
        benchmark,
        "pack_command SET",
        impl,
        lambda: pack_command(b"SET", "fencekit:{emails}:job:42", b"x" * 64, b"PX", 30000),
    )


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
def test_pack_commands_pipeline_of_16(benchmark: Any, impl: str) -> None:
    pack_commands = IMPLEMENTATIONS[impl].pack_commands
    commands = [(b"EVALSHA", SHA, 5, *KEYS, *ack_args(1)) for _ in range(16)]
    _bench(benchmark, "pack_commands x16", impl, lambda: pack_commands(commands))
