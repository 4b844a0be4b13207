"""The RESP encoder, compiled and pure: known frames, round trips, equality, errors, leaks.

Every test that takes the ``resp`` fixture runs against both implementations.
A missing compiled module fails the run (it must not hide behind the
fallback) unless ``FENCEKIT_NO_EXT=1`` says the fallback is what is tested.
"""

from __future__ import annotations

import array
import enum
import gc
import importlib
import math
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from decimal import Decimal
from types import ModuleType
from typing import Any

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencekit import compiled
from fencekit._redis import _resp_py, resp
from fencekit.errors import EncodeError, FenceKitError

NO_EXT = os.environ.get("FENCEKIT_NO_EXT", "") not in ("", "0")
IMPLEMENTATIONS = ["python"] if NO_EXT else ["python", "compiled"]
SHA = "e0e1f9fabfc9d4800c877a703b823ac0578ff831"


def load_implementation(name: str) -> ModuleType:
    if name == "python":
        return _resp_py
    try:
        return importlib.import_module("fencekit._redis._resp")
    except ImportError as exc:
        pytest.fail(
            f"the compiled encoder fencekit._redis._resp is not built ({exc}). Build it with "
            "`FENCEKIT_REQUIRE_EXT=1 pip install -e . --no-build-isolation`, or set "
            "FENCEKIT_NO_EXT=1 to test only the pure-Python fallback.",
            pytrace=False,
        )


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    return load_implementation(request.param)


def parse_all(data: bytes) -> list[Any]:
    """Every RESP value in ``data``, parsed by hiredis; the data must end on a frame."""
    reader = hiredis.Reader()
    reader.feed(data)
    out = []
    while (value := reader.gets()) is not False:
        out.append(value)
    assert not reader.has_data(), "trailing bytes after the last frame"
    return out


def expected_bytes(arg: Any) -> bytes:
    """What Redis should receive for one argument (the documented framing rules)."""
    if isinstance(arg, (bytes, bytearray)):
        return bytes(arg)
    if isinstance(arg, memoryview):
        return arg.tobytes()
    if isinstance(arg, str):
        return arg.encode("utf-8")
    if isinstance(arg, int):
        return str(int(arg)).encode()
    if isinstance(arg, float):
        return repr(float(arg)).encode()
    raise AssertionError(arg)


# -- known frames ------------------------------------------------------------


def test_a_command_is_an_array_of_bulk_strings(impl: ModuleType) -> None:
    assert impl.pack_command(b"PING") == b"*1\r\n$4\r\nPING\r\n"
    assert impl.pack_command("SET", "key", b"") == b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$0\r\n\r\n"


@pytest.mark.parametrize(
    ("arg", "frame"),
    [
        (b"\x00\r\n", b"$3\r\n\x00\r\n\r\n"),
        (bytearray(b"ab"), b"$2\r\nab\r\n"),
        (memoryview(b"abc"), b"$3\r\nabc\r\n"),
        (memoryview(b"abcdef")[::2], b"$3\r\nace\r\n"),
        (memoryview(array.array("i", [1])), b"$4\r\n\x01\x00\x00\x00\r\n"),
        ("\u00e9\u20ac", b"$5\r\n\xc3\xa9\xe2\x82\xac\r\n"),
        ("", b"$0\r\n\r\n"),
        (0, b"$1\r\n0\r\n"),
        (-1, b"$2\r\n-1\r\n"),
        (2**63 - 1, b"$19\r\n9223372036854775807\r\n"),
        (-(2**63), b"$20\r\n-9223372036854775808\r\n"),
        (2**64, b"$20\r\n18446744073709551616\r\n"),
        (-(10**30), b"$32\r\n-1000000000000000000000000000000\r\n"),
        (1.0, b"$3\r\n1.0\r\n"),
        (0.1, b"$3\r\n0.1\r\n"),
        (-0.0, b"$4\r\n-0.0\r\n"),
        (1e100, b"$6\r\n1e+100\r\n"),
        (1.5e-7, b"$7\r\n1.5e-07\r\n"),
    ],
)
def test_each_argument_type_has_its_documented_frame(impl: ModuleType, arg: Any, frame: bytes) -> None:
    assert impl.pack_command(b"X", arg) == b"*2\r\n$1\r\nX\r\n" + frame


@pytest.mark.parametrize("size", [0, 1, 9, 10, 99, 100, 999, 1000, 65536])
def test_length_prefixes_are_exact_at_digit_boundaries(impl: ModuleType, size: int) -> None:
    data = b"x" * size
    assert impl.pack_command(data) == b"*1\r\n$%d\r\n%s\r\n" % (size, data)


def test_subclasses_are_framed_by_their_base_type(impl: ModuleType) -> None:
    class Color(enum.IntEnum):
        RED = 7

    class Text(str):
        def __str__(self) -> str:
            return "wrong"

    class Blob(bytes):
        def __bytes__(self) -> bytes:
            return b"wrong"

    class Number(float):
        def __repr__(self) -> str:
            return "wrong"

    frame = impl.pack_command(Color.RED, Text("ok"), Blob(b"raw"), Number(2.5))
    assert parse_all(frame) == [[b"7", b"ok", b"raw", b"2.5"]]


def test_evalsha_frames_sha_numkeys_keys_then_args(impl: ModuleType) -> None:
    frame = impl.pack_evalsha(SHA, ("k1", "k2"), (1, b"x"))
    assert frame == (
        b"*7\r\n$7\r\nEVALSHA\r\n$40\r\n" + SHA.encode() + b"\r\n$1\r\n2\r\n"
        b"$2\r\nk1\r\n$2\r\nk2\r\n$1\r\n1\r\n$1\r\nx\r\n"
    )
    assert impl.pack_evalsha(SHA.encode(), (), ()) == (
        b"*3\r\n$7\r\nEVALSHA\r\n$40\r\n" + SHA.encode() + b"\r\n$1\r\n0\r\n"
    )


def test_evalsha_counts_many_keys(impl: ModuleType) -> None:
    keys = [f"k{i}" for i in range(128)]
    assert parse_all(impl.pack_evalsha(SHA, keys, [])) == [
        [b"EVALSHA", SHA.encode(), b"128", *(k.encode() for k in keys)]
    ]


def test_evalsha_works_past_the_prefix_cache_limit(impl: ModuleType) -> None:
    for n in range(1100):
        sha = f"{n:040x}"
        assert parse_all(impl.pack_evalsha(sha, ["k"], [n])) == [
            [b"EVALSHA", sha.encode(), b"1", b"k", str(n).encode()]
        ]


def test_commands_are_framed_back_to_back(impl: ModuleType) -> None:
    frame = impl.pack_commands([("PING",), ["GET", b"k"], (b"INCRBY", "n", 5)])
    assert frame == (
        b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*3\r\n$6\r\nINCRBY\r\n$1\r\nn\r\n$1\r\n5\r\n"
    )
    assert impl.pack_commands([]) == b""
    assert impl.pack_commands(("ECHO", str(i)) for i in range(3)) == b"".join(
        impl.pack_command("ECHO", str(i)) for i in range(3)
    )


def test_keys_and_args_may_be_any_iterable(impl: ModuleType) -> None:
    expected = impl.pack_evalsha(SHA, ("a", "b"), (1, 2))
    assert impl.pack_evalsha(SHA, ["a", "b"], [1, 2]) == expected
    assert impl.pack_evalsha(SHA, iter(["a", "b"]), (x for x in (1, 2))) == expected


# -- bad input: always EncodeError, naming type and position ------------------


class Opaque:
    pass


def released_view() -> memoryview:
    view = memoryview(b"abc")
    view.release()
    return view


BAD_ARGS: list[tuple[Callable[[], Any], str]] = [
    (lambda: True, "bool"),
    (lambda: False, "bool"),
    (lambda: None, "NoneType"),
    (lambda: [b"x"], "list"),
    (lambda: {"a": 1}, "dict"),
    (lambda: Opaque(), "Opaque"),
    (lambda: 1j, "complex"),
    (lambda: Decimal("1.5"), "Decimal"),
    (lambda: "ok\ud800", "UTF-8"),
    (lambda: math.nan, "non-finite float nan"),
    (lambda: math.inf, "non-finite float inf"),
    (lambda: -math.inf, "non-finite float -inf"),
    (released_view, "memoryview"),
]


@pytest.mark.parametrize(("make", "named"), BAD_ARGS)
def test_a_bad_argument_is_an_encode_error_naming_type_and_position(
    impl: ModuleType, make: Callable[[], Any], named: str
) -> None:
    bad = make()
    cases: list[tuple[Callable[[], bytes], str]] = [
        (lambda: impl.pack_command("SET", "k", bad), "args[2]"),
        (lambda: impl.pack_evalsha(SHA, ("k", bad), ()), "keys[1]"),
        (lambda: impl.pack_evalsha(SHA, ("k",), (1, 2, bad)), "args[2]"),
        (lambda: impl.pack_commands([("PING",), ("SET", bad)]), "commands[1][1]"),
    ]
    for encode, position in cases:
        with pytest.raises(EncodeError) as caught:
            encode()
        assert str(caught.value).startswith(f"{position}: ")
        assert named in str(caught.value)


@pytest.mark.parametrize(
    ("encode", "message"),
    [
        (lambda m: m.pack_command(), "args: cannot encode an empty command"),
        (lambda m: m.pack_commands([("PING",), ()]), "commands[1]: cannot encode an empty command"),
        (lambda m: m.pack_commands("PING"), "commands must be a sequence of arguments, not str"),
        (lambda m: m.pack_commands(5), "commands must be a sequence of arguments, not int"),
        (
            lambda m: m.pack_commands([("PING",), "GET"]),
            "commands[1] must be a sequence of arguments, not str",
        ),
        (lambda m: m.pack_evalsha(SHA, "key", ()), "keys must be a sequence of arguments, not str"),
        (
            lambda m: m.pack_evalsha(SHA, (), b"arg"),
            "args must be a sequence of arguments, not bytes",
        ),
        (lambda m: m.pack_evalsha(SHA, None, ()), "keys must be a sequence of arguments, not NoneType"),
        (lambda m: m.pack_evalsha(1, (), ()), "sha: cannot encode a int (expected str or bytes)"),
        (
            lambda m: m.pack_evalsha(bytearray(b"x"), (), ()),
            "sha: cannot encode a bytearray (expected str or bytes)",
        ),
        (
            lambda m: m.pack_evalsha("\udc00", (), ()),
            "sha: str is not encodable as UTF-8 (surrogates not allowed at index 0)",
        ),
    ],
)
def test_malformed_commands_are_encode_errors(
    impl: ModuleType, encode: Callable[[ModuleType], bytes], message: str
) -> None:
    with pytest.raises(EncodeError) as caught:
        encode(impl)
    assert str(caught.value) == message


def test_encode_error_is_a_type_error_and_a_fencekit_error(impl: ModuleType) -> None:
    reason = r"^args\[0\]: cannot encode a object \(expected bytes, "
    with pytest.raises(TypeError, match=reason) as as_type_error:  # what Python code catches
        impl.pack_command(object())
    with pytest.raises(FenceKitError, match=reason) as as_fencekit_error:  # what fencekit users catch
        impl.pack_command(object())
    assert type(as_type_error.value) is type(as_fencekit_error.value) is EncodeError


# -- generated inputs --------------------------------------------------------

good_args = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=32),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=False, allow_infinity=False),
    st.binary(max_size=16).map(bytearray),
    st.binary(max_size=16).map(lambda b: memoryview(b)),
)
bad_args = st.one_of(
    st.booleans(),
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf, "\ud800x", 1j, ()]),
)
any_args = st.one_of(good_args, good_args, good_args, bad_args)
commands = st.lists(good_args, min_size=1, max_size=8)
shas = st.one_of(st.text(min_size=1, max_size=40), st.binary(min_size=1, max_size=40))


def outcome(encode: Callable[..., bytes], *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", encode(*args))
    except EncodeError as exc:
        return ("error", str(exc))


@given(args=commands)
def test_a_command_parses_back_to_its_arguments(args: list[Any]) -> None:
    for name in IMPLEMENTATIONS:
        frame = load_implementation(name).pack_command(*args)
        assert parse_all(frame) == [[expected_bytes(a) for a in args]]


@given(cmds=st.lists(commands, max_size=6))
def test_a_pipeline_parses_back_to_its_commands(cmds: list[list[Any]]) -> None:
    for name in IMPLEMENTATIONS:
        frame = load_implementation(name).pack_commands(cmds)
        assert parse_all(frame) == [[expected_bytes(a) for a in c] for c in cmds]


@given(sha=shas, keys=st.lists(good_args, max_size=8), args=st.lists(good_args, max_size=140))
def test_evalsha_parses_back_to_sha_numkeys_keys_args(
    sha: str | bytes, keys: list[Any], args: list[Any]
) -> None:
    for name in IMPLEMENTATIONS:
        frame = load_implementation(name).pack_evalsha(sha, keys, args)
        assert parse_all(frame) == [
            [
                b"EVALSHA",
                expected_bytes(sha),
                str(len(keys)).encode(),
                *map(expected_bytes, keys),
                *map(expected_bytes, args),
            ]
        ]


@settings(max_examples=300)
@given(args=st.lists(any_args, max_size=10), keys=st.lists(any_args, max_size=4), sha=shas)
def test_the_implementation_matches_the_specification_byte_for_byte(
    args: list[Any], keys: list[Any], sha: str | bytes
) -> None:
    # Same bytes for good input, same EncodeError message for bad input.
    cmds = [args, keys, args[:1]]
    for name in IMPLEMENTATIONS:
        impl = load_implementation(name)
        assert outcome(impl.pack_command, *args) == outcome(_resp_py.pack_command, *args)
        assert outcome(impl.pack_evalsha, sha, keys, args) == outcome(_resp_py.pack_evalsha, sha, keys, args)
        assert outcome(impl.pack_commands, cmds) == outcome(_resp_py.pack_commands, cmds)


# -- leaks -------------------------------------------------------------------


def _workload(impl: ModuleType) -> Iterator[Callable[[], object]]:
    keys = ("fencekit:{q}:pending", "fencekit:{q}:inflight:c1")
    args = (16, b"0123456789abcdef01234567", "text-\u00e9", 2**80, 1.25, memoryview(b"mv"))
    bad = (1, Opaque())
    yield lambda: impl.pack_evalsha(SHA, keys, args)
    yield lambda: impl.pack_command(b"SET", *args)
    yield lambda: impl.pack_commands([keys, args])

    def fails() -> object:
        try:
            impl.pack_evalsha(SHA, keys, bad)
        except EncodeError as exc:
            return exc
        raise AssertionError("no EncodeError")

    yield fails


def test_repeated_calls_leak_no_references(impl: ModuleType) -> None:
    keys = ("fencekit:{q}:pending",)
    big, text, blob, number = 2**80, "t\u00e9xt", b"x" * 24, 1.25
    view, opaque, sha = memoryview(b"abc"), Opaque(), SHA
    watched = [keys, big, text, blob, number, view, opaque, sha]
    args = (big, text, blob, number, view)
    impl.pack_evalsha(sha, keys, args)
    before = [sys.getrefcount(obj) for obj in watched]
    for _ in range(100_000):
        impl.pack_evalsha(sha, keys, args)
        impl.pack_command(*args)
        try:
            impl.pack_command(opaque)
        except EncodeError:
            pass
    assert [sys.getrefcount(obj) for obj in watched] == before


def test_repeated_calls_do_not_grow_memory(impl: ModuleType) -> None:
    # 100k calls for the extension; tracemalloc makes the pure module slow, 20k do.
    rounds = 25_000 if impl is not _resp_py else 5_000
    work = list(_workload(impl))
    for fn in work:  # warm caches (the SHA prefix, str UTF-8 buffers)
        fn()
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(rounds):
            for fn in work:
                fn()
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end - start < 64 * 1024, f"{end - start} bytes still allocated after the calls"


# -- the facade --------------------------------------------------------------


def test_the_facade_uses_the_compiled_encoder_unless_told_not_to() -> None:
    if NO_EXT:
        assert resp.IMPLEMENTATION == "python"
        assert resp.pack_evalsha is _resp_py.pack_evalsha
    else:
        native = load_implementation("compiled")
        assert resp.IMPLEMENTATION == "compiled"
        assert resp.pack_evalsha is native.pack_evalsha
        assert resp.pack_command is native.pack_command
        assert resp.pack_commands is native.pack_commands
    assert compiled.RESP_IMPLEMENTATION == resp.IMPLEMENTATION
    assert compiled.ACCELERATED is (resp.IMPLEMENTATION == "compiled")


def test_fencekit_no_ext_selects_the_fallback_at_import_time() -> None:
    code = (
        "from fencekit import compiled; from fencekit._redis import resp, _resp_py;"
        "assert resp.pack_evalsha is _resp_py.pack_evalsha;"
        "print(compiled.RESP_IMPLEMENTATION, compiled.describe()['resp_encoder'])"
    )
    env = {**os.environ, "FENCEKIT_NO_EXT": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "python python (disabled by FENCEKIT_NO_EXT)"


def test_describe_names_every_hot_path_component() -> None:
    info = compiled.describe()
    assert set(info) == {"resp_encoder", "reply_parser", "event_loop"}
    assert info["reply_parser"].startswith("hiredis ")
    assert info["resp_encoder"].startswith(compiled.RESP_IMPLEMENTATION)
