"""The exception tree of ``fencekit.errors``, as its docstring draws it, and who may raise outside it.

Every exception fencekit raises is a :class:`~fencekit.errors.FenceKitError`
(``docs/design.md``, "Errors"); some are also the built-in error a caller
would catch without knowing fencekit (``ValueError``, ``TypeError``,
``RuntimeError``). The last tests walk every module of the package for
exception classes defined outside the tree; the test helpers of
``fencekit.testing`` are the one documented exception.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import math
import pkgutil
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import fencekit
from fencekit import current_job, errors
from fencekit._redis import resp
from fencekit._redis.url import parse_url
from fencekit.errors import (
    SCRIPT_ERRORS,
    CanonicalizeError,
    ConfigError,
    CrossSlotWrite,
    DrainTimeout,
    DurabilityError,
    EncodeError,
    FencedOutError,
    FenceKitError,
    IdempotencyNotOwned,
    IdempotencyResultMissing,
    Interrupted,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    LockNotAcquired,
    LockNotOwned,
    NoCurrentJob,
    OutboxUnavailable,
    PayloadError,
    StoreError,
    script_error,
)
from fencekit.jobs.codec import decode
from fencekit.primitives.canonical import canonicalize

LUA_DIR = Path(errors.__file__).parent / "_redis" / "lua"

#: The direct bases of each class, as the tree in the module docstring draws it.
TREE: dict[type[BaseException], tuple[type[BaseException], ...]] = {
    FenceKitError: (Exception,),
    LockNotAcquired: (FenceKitError,),
    LockNotOwned: (FenceKitError,),
    IdempotencyNotOwned: (FenceKitError,),
    IdempotencyResultMissing: (FenceKitError,),
    FencedOutError: (FenceKitError,),
    Interrupted: (FenceKitError,),
    OutboxUnavailable: (FenceKitError,),
    CanonicalizeError: (FenceKitError, ValueError),
    ConfigError: (FenceKitError, ValueError),
    CrossSlotWrite: (ConfigError,),
    PayloadError: (FenceKitError, ValueError),
    EncodeError: (FenceKitError, TypeError),
    StoreError: (FenceKitError,),
    DurabilityError: (StoreError,),
    NoCurrentJob: (FenceKitError, RuntimeError),
    JobNotFound: (FenceKitError, LookupError),
    JobFailed: (FenceKitError,),
    JobCancelled: (FenceKitError,),
    JobExpired: (JobCancelled,),
    DrainTimeout: (FenceKitError,),
}

#: Modules that run a program when imported (``python -m ...``): read, never imported.
ENTRY_POINTS = ("fencekit.pool._exec_child",)


def exception_classes(module: ModuleType) -> list[type[BaseException]]:
    """The exception classes ``module`` defines itself (not the ones it imports)."""
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
    ]


def is_entry_point(name: str) -> bool:
    return name.endswith(".__main__") or name in ENTRY_POINTS


def is_testing(name: str) -> bool:
    return name == "fencekit.testing" or name.startswith(("fencekit.testing.", "fencekit.testing_"))


def quiet_import(name: str) -> ModuleType:
    """Import ``name`` without its deprecation warning, and leave no trace of a deprecated shim.

    A shim of an old path (``fencekit.jobs.codec`` ...) warns once per process when
    imported; it is dropped again so that a later import still warns.
    """
    fresh = name not in sys.modules
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    moved = [w for w in caught if w.category is DeprecationWarning and " has moved to " in str(w.message)]
    for other in (w for w in caught if w not in moved):  # anything else warns as it would have
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    if fresh and moved:
        del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and getattr(sys.modules[parent], child, None) is module:
            delattr(sys.modules[parent], child)
    return module


def package_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(fencekit.__path__, "fencekit.")]
    assert "fencekit.errors" in names, names  # the walk works ...
    assert "fencekit.consume._consumer" in names, names  # ... and goes into subpackages
    return names


# -- the tree ---------------------------------------------------------------------------


def test_every_class_of_the_errors_module_is_exported_and_is_a_fencekit_error() -> None:
    exported = [getattr(errors, name) for name in errors.__all__]
    classes = [obj for obj in exported if inspect.isclass(obj)]
    assert classes, errors.__all__
    for cls in classes:
        assert issubclass(cls, FenceKitError), cls
    assert set(exception_classes(errors)) == set(classes)  # none defined but left unexported


def test_each_class_has_exactly_the_bases_the_documented_tree_gives_it() -> None:
    assert set(TREE) == set(exception_classes(errors))
    for cls, bases in TREE.items():
        assert cls.__bases__ == bases, cls
    # the drawing in the docstring: each class under its parent, a built-in base beside it
    names = {cls.__name__ for cls in TREE}
    drawn: dict[str, tuple[int, list[str]]] = {}  # name -> (column, the words after it)
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^([\s│├└─]*)(\w+)(.*)$", line)
        if match and match.group(2) in names:
            drawn.setdefault(match.group(2), (len(match.group(1)), match.group(3).split()))
    assert set(drawn) == names
    for cls, bases in TREE.items():
        column, words = drawn[cls.__name__]
        parents = [b for b in bases if issubclass(b, FenceKitError)]
        if parents:
            assert column == drawn[parents[0].__name__][0] + 4, cls
        builtins = [b for b in bases if b not in parents and b is not Exception]
        if builtins:
            assert words[0] == f"({builtins[0].__name__})", cls
        else:
            assert not words[0].startswith("("), cls


def _pack_an_object() -> None:
    resp.pack_command(object())


def _canonicalize_nan() -> None:
    canonicalize({"v": math.nan})


@pytest.mark.parametrize(
    ("fail", "cls", "builtin", "reason"),
    [
        (lambda: parse_url("http://x"), ConfigError, ValueError, "unsupported URL scheme 'http'"),
        (lambda: decode(b"x"), PayloadError, ValueError, "payload is not valid JSON"),
        (_canonicalize_nan, CanonicalizeError, ValueError, r"payload\['v'\]: non-finite float nan"),
        (_pack_an_object, EncodeError, TypeError, r"args\[0\]: cannot encode a object"),
        (
            current_job,
            NoCurrentJob,
            RuntimeError,
            re.escape("current_job() was called outside a running job"),
        ),
    ],
    ids=["ConfigError", "PayloadError", "CanonicalizeError", "EncodeError", "NoCurrentJob"],
)
def test_the_documented_extra_bases_catch_what_the_code_raises_as_the_builtin_too(
    fail: Callable[[], object], cls: type[FenceKitError], builtin: type[Exception], reason: str
) -> None:
    with pytest.raises(builtin, match=f"^{reason}") as caught:  # a caller who never heard of fencekit
        fail()
    assert type(caught.value) is cls
    with pytest.raises(FenceKitError, match=f"^{reason}"):  # a caller who catches fencekit's root
        fail()
    others = {ValueError, TypeError, RuntimeError} - {builtin}
    assert not any(isinstance(caught.value, other) for other in others)


def test_the_other_errors_are_no_builtin_error_but_exception() -> None:
    def only_ours(cls: type[BaseException]) -> bool:  # the tree gives it no builtin base, up to the root
        return cls is FenceKitError or all(issubclass(b, FenceKitError) and only_ours(b) for b in TREE[cls])

    plain = [cls for cls in TREE if only_ours(cls)]
    assert StoreError in plain
    assert LockNotOwned in plain
    for cls in plain:
        assert not issubclass(cls, (ValueError, TypeError, RuntimeError, LookupError, OSError)), cls


def test_a_durability_error_is_a_store_error_carrying_how_many_replicas_confirmed() -> None:
    with pytest.raises(StoreError, match=r"^1 of 2 replicas confirmed$") as caught:
        raise DurabilityError("1 of 2 replicas confirmed", confirmed=1)
    assert isinstance(caught.value, DurabilityError)
    assert caught.value.confirmed == 1
    assert DurabilityError("none yet").confirmed == 0
    assert caught.value.args == ("1 of 2 replicas confirmed",)


# -- script error prefixes ---------------------------------------------------------------


@pytest.mark.parametrize(("prefix", "cls"), sorted(SCRIPT_ERRORS.items()))
def test_script_error_maps_each_prefix_to_its_class_with_the_rest_as_message(
    prefix: str, cls: type[FenceKitError]
) -> None:
    mapped = script_error(f"{prefix} delivery 42 is no longer current")
    assert type(mapped) is cls
    assert str(mapped) == "delivery 42 is no longer current"
    bare = script_error(prefix)  # nothing after the prefix: the prefix is the message
    assert type(bare) is cls
    assert str(bare) == prefix


@pytest.mark.parametrize(
    "message",
    [
        "",
        "ERR unknown command",
        "WRONGTYPE Operation",
        "FENCEDX y",
        "fenced lower case",
        " FENCED leading space",
    ],
)
def test_script_error_returns_none_for_replies_that_are_not_ours(message: str) -> None:
    assert script_error(message) is None


def test_every_prefix_a_lua_script_replies_with_is_mapped() -> None:
    emitted = {
        match
        for path in LUA_DIR.glob("*.lua")
        for match in re.findall(r"error_reply\(\s*['\"]([A-Z]+)[ '\"]", path.read_text())
    }
    assert emitted, f"no error_reply in {LUA_DIR}"
    assert emitted <= set(SCRIPT_ERRORS), emitted - set(SCRIPT_ERRORS)


# -- exports -----------------------------------------------------------------------------


def test_the_package_exports_every_exception_class_of_the_errors_module() -> None:
    for cls in exception_classes(errors):
        assert cls.__name__ in fencekit.__all__, cls
        assert getattr(fencekit, cls.__name__) is cls


# -- nothing outside the tree --------------------------------------------------------------


def helper_exceptions() -> set[type[BaseException]]:
    """Exception classes of fencekit outside the tree that ``fencekit.testing*`` hands to its users."""
    return {
        obj
        for name in package_modules()
        if is_testing(name)
        for obj in vars(quiet_import(name)).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and not issubclass(obj, FenceKitError)
        and obj.__module__.startswith("fencekit")
    }


def test_no_module_of_the_package_defines_an_exception_outside_the_tree() -> None:
    helpers = helper_exceptions()  # e.g. ServerBinaryMissing, defined in fencekit._redis.process
    outside: list[str] = []
    for name in package_modules():
        if is_testing(name) or is_entry_point(name):
            continue
        for cls in exception_classes(quiet_import(name)):
            if not issubclass(cls, FenceKitError) and cls not in helpers:
                outside.append(f"{name}.{cls.__qualname__}")
    assert outside == []


def test_the_entry_point_modules_define_no_classes_at_all() -> None:
    """They run a program when imported, so the walk above reads them instead."""
    entries = [name for name in package_modules() if is_entry_point(name)]
    assert "fencekit.pool.__main__" in entries, entries
    assert "fencekit.pool._exec_child" in entries, entries
    for name in entries:
        spec = importlib.util.find_spec(name)
        assert spec is not None, name
        assert spec.origin is not None, name
        tree = ast.parse(Path(spec.origin).read_text())
        assert not [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)], name


def test_the_testing_helpers_exceptions_outside_the_tree_are_runtime_errors() -> None:
    """``fencekit.testing`` may raise its own errors (a missing server binary); they are RuntimeErrors."""
    helpers = helper_exceptions()
    assert helpers, "fencekit.testing hands out no exception of its own"
    for cls in helpers:
        assert issubclass(cls, RuntimeError), cls


def test_error_replies_become_store_errors_that_say_what_redis_meant() -> None:
    from fencekit._redis.run import translate_reply

    oom_in_script = "command not allowed when used memory > 'maxmemory'. script: abc, on @user_script:30."
    for message in ("OOM command not allowed when used memory > 'maxmemory'.", oom_in_script):
        error = translate_reply(message)
        assert type(error) is StoreError
        assert str(error) == f"Redis is out of memory (OOM: over maxmemory, writes refused): {message}"
    readonly = translate_reply("READONLY You can't write against a read only replica.")
    assert str(readonly).startswith("Redis is a read-only replica now (failover?): READONLY")
    other = translate_reply("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert str(other) == "ResponseError: WRONGTYPE Operation against a key holding the wrong kind of value"
