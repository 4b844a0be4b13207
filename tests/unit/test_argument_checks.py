"""Checks of arguments and of Redis replies that happen before any Redis call.

Each case is a wrong value a caller (or a broken Redis) can hand fencekit and
the one clear error it must get back: the tokens and lock handles, the APP
loader, the settings' checks, the web app and server, the histogram and the
shared board, and the systemd notify client.
"""

from __future__ import annotations

import math
import os
import re
import socket
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from fencekit.errors import ConfigError
from fencekit.jobs.histogram import DurationHistogram
from fencekit.pool import _sdnotify as sdnotify
from fencekit.pool._board import Board
from fencekit.primitives.tokens import FenceToken, LockHandle
from fencekit.runtime.app import App, load_app, load_worker_paths
from fencekit.runtime.hooks import check_hook, run_hooks
from fencekit.settings import PoolSettings, ServerSettings, resolve
from fencekit.web import create_app
from fencekit.web._pages import _ago
from fencekit.web._serve import WebServer, _is_loopback


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def starts(message: str) -> str:
    return f"^{re.escape(message)}"


def ends(message: str) -> str:
    return f"{re.escape(message)}$"


# -- tokens and lock handles -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "resource", "message"),
    [
        (True, "r", "token value must be an int, got bool"),
        ("7", "r", "token value must be an int, got str"),
        (0, "r", "token value must be >= 1, got 0"),
        (7, "", "token resource must be a non-empty str, got ''"),
        (7, None, "token resource must be a non-empty str, got None"),
    ],
)
def test_a_fence_token_refuses_what_redis_never_issues(value: Any, resource: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=exactly(message)):
        FenceToken(value, resource)


def test_a_lock_handle_refuses_parts_that_do_not_belong_together() -> None:
    token = FenceToken(5, "r")
    ttl = timedelta(seconds=1)
    with pytest.raises(ConfigError, match=exactly("resource must be a non-empty str, got ''")):
        LockHandle("", "me", token, ttl)
    with pytest.raises(ConfigError, match=exactly("owner_id must be a non-empty str, got ''")):
        LockHandle("r", "", token, ttl)
    with pytest.raises(ConfigError, match=exactly("token must be a FenceToken, got int")):
        LockHandle("r", "me", 5, ttl)  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=exactly("token of resource 'other' cannot belong to a handle of resource 'r'")
    ):
        LockHandle("r", "me", FenceToken(5, "other"), ttl)
    with pytest.raises(ConfigError, match=r"^ttl must be a positive timedelta, got datetime.timedelta\(0\)$"):
        LockHandle("r", "me", token, timedelta(0))
    assert int(LockHandle("r", "me", token, ttl).token) == 5


# -- the APP loader ------------------------------------------------------------------------

APP_MODULE = textwrap.dedent(
    """
    class Echo:
        queue = "checks"
        operation = "echo"

        @classmethod
        async def perform(cls, payload):
            return payload

    WORKERS = [Echo]
    NONE = []
    NOT_A_LIST = 42
    TEXT = "Echo"

    def make():
        return [Echo]

    def broken():
        raise RuntimeError("no app today")

    def empty_app():
        from fencekit.runtime.app import App
        return App([])
    """
)


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"checks_app_{os.getpid()}_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text(APP_MODULE)
    (tmp_path / f"{name}_fails.py").write_text("raise ValueError('cannot import this one')\n")
    (tmp_path / f"{name}_missing_dep.py").write_text("import no_such_dependency_at_all\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_an_app_spec_is_a_module_and_an_attribute(app_module: str) -> None:
    for spec in ("no-colon", ":WORKERS", f"{app_module}:", 42):
        with pytest.raises(ConfigError, match=starts("APP must look like 'package.module:attribute', got ")):
            load_app(spec)  # type: ignore[arg-type]
    assert [w.__name__ for w in load_app(f"{app_module}:WORKERS").workers] == ["Echo"]  # type: ignore[attr-defined]
    assert [w.__name__ for w in load_app(f"{app_module}:make").workers] == ["Echo"]  # type: ignore[attr-defined]


def test_an_app_that_cannot_be_loaded_says_why(app_module: str) -> None:
    cases = {
        "no_such_module_here:WORKERS": "cannot import APP module 'no_such_module_here': no such module",
        f"{app_module}_missing_dep:W": (
            f"importing APP module '{app_module}_missing_dep' failed: No module named"
        ),
        f"{app_module}_fails:W": (
            f"importing APP module '{app_module}_fails' failed: ValueError: cannot import this one"
        ),
        f"{app_module}:MISSING": f"APP '{app_module}:MISSING': '{app_module}' has no attribute 'MISSING'",
        f"{app_module}:broken": f"APP '{app_module}:broken': calling it failed: RuntimeError: no app today",
        f"{app_module}:NONE": f"APP '{app_module}:NONE' names no workers",
        f"{app_module}:empty_app": f"APP '{app_module}:empty_app' names no workers",
        f"{app_module}:NOT_A_LIST": "must be a sequence of workers (or a callable returning one), got int",
        f"{app_module}:TEXT": "must be a sequence of workers (or a callable returning one), got str",
        f"{app_module}:Echo": "must be a sequence of workers (or a callable returning one), got type",
    }
    for spec, message in cases.items():
        with pytest.raises(ConfigError) as caught:
            load_app(spec)
        assert message in str(caught.value), (spec, str(caught.value))


def test_worker_paths_that_do_not_import_are_a_config_error(app_module: str) -> None:
    assert [w.__name__ for w in load_worker_paths([f"{app_module}:Echo"])] == ["Echo"]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=rf"^cannot import worker '{app_module}:Gone': AttributeError: "):
        load_worker_paths([f"{app_module}:Gone"])


def test_app_hooks_are_async_functions_of_nothing_or_the_client() -> None:
    async def one(client: object) -> None: ...

    async def two(a: object, b: object) -> None: ...

    async def keyword(*, client: object) -> None: ...

    with pytest.raises(ConfigError, match=r"^App\(on_startup=...\) takes a list of async functions, got "):
        App([], on_startup=one)  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=exactly("on_shutdown takes an async function, got <built-in function len>")
    ):
        App([], on_shutdown=[len])  # type: ignore[list-item]
    for hook in (two, keyword):
        with pytest.raises(ConfigError, match=r"hook .* must take no argument, or one: the Client$"):
            check_hook(hook, "on_startup")
    assert check_hook(one, "on_startup") is one


async def test_a_hook_whose_signature_cannot_be_read_is_called_bare() -> None:
    calls: list[str] = []

    class NoSignature:
        """An awaitable callable whose signature inspect refuses to read."""

        @property
        def __signature__(self) -> object:
            raise ValueError("no signature")

        async def __call__(self) -> None:
            calls.append("called")

    await run_hooks([NoSignature()], client=None)  # type: ignore[list-item, arg-type]
    assert calls == ["called"]


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("link", "hiredis", "link must be 'lean' or 'redis-py', got 'hiredis' (argument)"),
        ("admin_username", "", "admin_username must not be an empty string (argument)"),
        ("admin_password", 12345, "admin_password must be a str (argument)"),  # a secret: no value shown
        ("concurrency", 2.5, "concurrency must be an int, got 2.5 (argument)"),
        ("prefix", 7, "prefix must be a str, got int (argument)"),
        ("redis_url", None, "redis_url must be set (argument)"),
    ],
)
def test_a_server_setting_of_the_wrong_kind_is_refused_by_name(
    setting: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(ServerSettings, {setting: value}, environ={})
    assert str(caught.value) == message


def test_pool_settings_check_the_log_level_and_take_a_path_for_the_data_dir(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^log_level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        resolve(PoolSettings, {"log_level": "chatty"}, environ={})
    settings = resolve(PoolSettings, {"data_dir": tmp_path, "log_level": "debug"}, environ={})
    assert settings["data_dir"] == str(tmp_path)
    assert settings["log_level"] == "DEBUG"


# -- the web app and its server ---------------------------------------------------------------


class NoSource:
    """An admin source that is never asked anything: the checks come first."""


def test_the_web_app_checks_its_refresh_and_credentials() -> None:
    for refresh in (0, 1.5, True):
        with pytest.raises(ConfigError, match=r"^refresh must be an int >= 1 \(seconds\), got "):
            create_app(NoSource(), refresh=refresh)  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=exactly("admin_username and admin_password must not be empty strings")
    ):
        create_app(NoSource(), admin_username="", admin_password="pw")  # type: ignore[arg-type]
    assert isinstance(create_app(NoSource(), admin_username="a", admin_password="b"), Starlette)  # type: ignore[arg-type]


def test_the_web_server_checks_its_port_and_knows_loopback_hosts() -> None:
    app = create_app(NoSource())  # type: ignore[arg-type]
    for port in (-1, 65536, "8080", None):
        with pytest.raises(ConfigError, match=starts("port must be an int from 0 to 65535, got ")):
            WebServer(app, "127.0.0.1", port)  # type: ignore[arg-type]
    assert WebServer(app, "::1", 0).url == "http://[::1]:0"
    assert _is_loopback("localhost")
    assert _is_loopback("127.0.0.2")
    assert _is_loopback("[::1]")
    assert not _is_loopback("0.0.0.0")
    assert not _is_loopback("example.com")


async def test_the_web_server_serves_on_ipv6_loopback_and_a_second_start_is_a_no_op() -> None:
    import httpx

    server = WebServer(create_app(NoSource()), "::1", 0)  # type: ignore[arg-type]
    await server.start()
    try:
        await server.start()  # already running: nothing happens
        async with httpx.AsyncClient() as client:
            response = await client.get(server.url + "/live")
        assert response.status_code == 200
    finally:
        await server.stop()
    assert not server.running


def test_the_dashboard_says_how_long_ago_in_words() -> None:
    assert _ago(None) == "never"
    assert _ago(0.2) == "just now"
    assert _ago(5) == "5.0 s ago"
    assert _ago(125) == "2 min 5 s ago"
    assert _ago(3 * 3600 + 120) == "3 h 2 min ago"
    assert _ago(50 * 3600) == "2 d 2 h ago"


# -- histograms, the shared board ---------------------------------------------------------------


def test_a_histogram_checks_its_buckets_and_counts() -> None:
    for buckets in ([], [-1.0, 1.0], [math.inf]):
        with pytest.raises(ConfigError, match=starts("buckets must be non-negative and not empty, got ")):
            DurationHistogram(buckets)
    with pytest.raises(ConfigError, match=exactly("expected 3 counts, got 2")):
        DurationHistogram.from_counts([1, 2], 0.5, buckets=[0.1, 1.0])
    with pytest.raises(ConfigError, match=exactly("cannot add histograms with different buckets")):
        _ = DurationHistogram([0.1]) + DurationHistogram([0.2])
    slow = DurationHistogram([0.1, 1.0])
    slow.observe(5.0)  # past the last bound: only the +Inf bucket has it
    assert slow.quantile_bound(0.5) == math.inf


def test_the_board_refuses_a_slot_it_does_not_have() -> None:
    board = Board(2)
    try:
        board.reset_slot(1, 0.0)
        with pytest.raises(IndexError, match=r"^slot 2 out of range 0\.\.1$"):
            board.read_slot(2)
    finally:
        os.close(board.fd)


# -- systemd notify ---------------------------------------------------------------------------------


def test_notify_reaches_an_abstract_socket_and_survives_a_missing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"fencekit-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        listener.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("READY=1", "STATUS=checking")
        assert listener.recv(256) == b"READY=1\nSTATUS=checking"
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/fencekit-notify.sock")
    assert sdnotify.notify("READY=1") is False


def test_a_watchdog_interval_that_is_not_a_number_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    assert sdnotify.watchdog_interval() == 2.0
