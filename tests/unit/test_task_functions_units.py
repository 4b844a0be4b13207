"""Task functions without Redis: binding a call to params and back, the decorator, the typing.

The typing test runs mypy --strict on one file that must fail (with the
listed errors, line by line) and one that must pass.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from fencekit import App, ConfigError, PayloadError
from fencekit.jobs._binding import Binder, Unbound
from fencekit.jobs.worker import WORKER_DEFAULTS, WorkerOptions, WorkerRegistry, inspect_worker
from fencekit.runtime.app import import_path


def everything(a: int, b: int = 2, /, c: int = 3, *rest: int, d: int, e: int = 5, **more: Any) -> Any:
    return (a, b, c, rest, d, e, more)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1,), {"d": 4}),
        ((1, 7), {"d": 4}),
        ((1, 7, 8), {"d": 4, "x": "y"}),
        ((1, 7, 8, 9, 10), {"d": 4, "e": 6}),
        ((1,), {"c": 9, "d": 4}),
    ],
)
def test_every_kind_of_parameter_round_trips_through_params(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    binder = Binder(everything)
    params = binder.encode(args, kwargs)
    back_args, back_kwargs = binder.decode(params)
    assert everything(*back_args, **back_kwargs) == everything(*args, **kwargs)


def test_params_are_named_by_parameter_and_only_given_arguments_are_stored() -> None:
    assert Binder(everything).encode((1, 7, 8, 9), {"d": 4, "x": "y"}) == {
        "a": 1,
        "b": 7,
        "c": 8,
        "rest": [9],
        "d": 4,
        "x": "y",
    }


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ((), {"d": 1}, "'a'"),
        ((1,), {}, "'d'"),
        ((1,), {"d": object()}, "argument 'd'"),
        ((1,), {"d": 1, "when": {1}}, "argument 'when'"),
        ((1,), {"d": 1, "rest": 2}, "'rest'"),
    ],
)
def test_a_bad_call_is_a_payload_error_naming_the_parameter(
    args: tuple[Any, ...], kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(PayloadError, match=named):
        Binder(everything).encode(args, kwargs)


def test_params_that_do_not_bind_are_unbound_naming_the_parameter() -> None:
    def f(to: str, *, subject: str = "") -> None: ...

    with pytest.raises(Unbound, match="missing param 'to'"):
        Binder(f).decode({"subject": "x"})
    with pytest.raises(Unbound, match="unknown param 'colour'"):
        Binder(f).decode({"to": "x", "colour": 1})
    with pytest.raises(Unbound, match=r"'rest'.*must be a list"):
        Binder(everything).decode({"a": 1, "d": 1, "rest": 3})


def test_the_worker_options_table_and_its_typed_dict_name_the_same_options() -> None:
    assert set(get_type_hints(WorkerOptions)) == set(WORKER_DEFAULTS)


def test_a_task_function_is_a_worker_with_a_binder_and_a_module_import_path() -> None:
    import tests.task_functions_app as tf

    spec = inspect_worker(tf.greet)
    assert (spec.queue, spec.operation, spec.name) == ("tf", "greet", "task greet")
    assert spec.call is not None
    assert spec.call.binder is not None
    assert not spec.call.sync
    assert inspect_worker(tf.shout).call.sync  # type: ignore[union-attr]
    assert import_path(tf.greet) == "tests.task_functions_app:greet"
    assert WorkerRegistry().get("tf", "greet") is None
    assert set(tf.app.workers) >= {tf.greet, tf.shout, tf.who}


def test_an_async_class_worker_has_no_invocation_and_a_sync_one_has_one() -> None:
    class Async:
        queue = "q"
        operation = "a"

        @classmethod
        async def perform(cls, payload: dict[str, Any]) -> None: ...

    class Sync:
        queue = "q"
        operation = "s"

        @classmethod
        def perform(cls, payload: dict[str, Any]) -> None: ...

    assert inspect_worker(Async).call is None
    call = inspect_worker(Sync).call
    assert call is not None
    assert call.sync
    assert call.binder is None


def test_an_app_without_workers_is_allowed_and_its_settings_are_checked_at_once() -> None:
    assert App().workers == ()
    with pytest.raises(ConfigError, match="keep_result"):
        App(keep_result=-1)


def test_a_task_function_given_to_the_app_explicitly_is_listed_once() -> None:
    app = App()

    @app.task
    async def f() -> None: ...

    again = App([f])
    assert again.workers == (f,)
    assert App([f]).workers.count(f) == 1
    assert app.workers == (f,)


def test_the_decorator_refuses_a_class_and_a_generator() -> None:
    app = App()
    with pytest.raises(ConfigError, match="takes a function"):
        app.task(int)

    def gen() -> Any:
        yield 1

    with pytest.raises(ConfigError, match="generator"):
        app.task(gen)


BAD = textwrap.dedent(
    """\
    from fencekit import App

    app = App()


    @app.task(queue="emails", retry_count=5, timeout=30)
    async def send_email(to: str, *, subject: str = "") -> str:
        return to


    @app.task
    def add(x: int, y: int = 0) -> int:
        return x + y


    async def main() -> None:
        await send_email.enqueue(42)
        await send_email.enqueue()
        await send_email.enqueue("a@b.c", subjet="hi")
        n: int = await send_email.run("a@b.c")
        await send_email.options(delay=5).enqueue("a@b.c", subject=1)
        s: str = await add.run(1)
        app.task(retries=3)(add)
        send_email.enqueue_sync(42)
    """
)

GOOD = textwrap.dedent(
    """\
    from fencekit import App, AsyncTaskFunction, SyncTaskFunction, Task

    app = App()


    @app.task(queue="emails", retry_count=5, timeout=30, keep_result=60.0, retry=True, keep_failed=False)
    async def send_email(to: str, *, subject: str = "") -> str:
        return to


    @app.task
    def add(x: int, y: int = 0) -> int:
        return x + y


    async def main() -> None:
        jid: str = await send_email.enqueue("a@b.c", subject="hi")
        result: str = await send_email.run("a@b.c")
        later: str = await send_email.options(delay=5, keep_result=60).enqueue(to="a@b.c")
        total: int = await add.run(1, y=2)
        direct: int = add(1)
        mail: str = await send_email("a@b.c")
        task: Task = add.build(1)
        f: AsyncTaskFunction[[str], str] = send_email
        g: SyncTaskFunction[[int, int], int] = add
        print(jid, result, later, total, direct, mail, task, f, g)


    def view() -> str:
        jid: str = send_email.enqueue_sync("a@b.c", subject="hi")
        return jid + add.options(delay=5).enqueue_sync(1, y=2)
    """
)


def test_mypy_strict_rejects_wrong_calls_of_enqueue_and_run_and_accepts_right_ones(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / "good.py").write_text(GOOD)

    def mypy(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--strict",
                "--no-incremental",
                "--cache-dir",
                str(tmp_path / ".c"),
                name,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=110,
        )

    good = mypy("good.py")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = mypy("bad.py")
    errors = [line for line in bad.stdout.splitlines() if ": error:" in line]
    assert bad.returncode == 1
    expected = [
        (
            "bad.py:17:",
            'Argument 1 to "enqueue" of "TaskFunction" has incompatible type "int"; expected "str"',
        ),
        ("bad.py:18:", 'Missing positional argument "to" in call to "enqueue"'),
        ("bad.py:19:", 'Unexpected keyword argument "subjet" for "enqueue"'),
        (
            "bad.py:20:",
            'Incompatible types in assignment (expression has type "str", variable has type "int")',
        ),
        (
            "bad.py:21:",
            'Argument "subject" to "enqueue" of "TaskCall" has incompatible type "int"; expected "str"',
        ),
        (
            "bad.py:22:",
            'Incompatible types in assignment (expression has type "int", variable has type "str")',
        ),
        ("bad.py:23:", 'Unexpected keyword argument "retries" for overloaded function "task"'),
        (
            "bad.py:24:",
            'Argument 1 to "enqueue_sync" of "TaskFunction" has incompatible type "int"; expected "str"',
        ),
    ]
    assert len(errors) == len(expected), bad.stdout
    for line, (where, what) in zip(errors, expected):
        assert line.startswith(where), line
        assert what in line, line
