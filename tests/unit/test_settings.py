"""The settings table: one declaration per setting, and everything derived from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fencekit import Client, ConfigError, Pool, Server
from fencekit.pool._supervisor import Supervisor
from fencekit.pool.cli import build_parser
from fencekit.runtime.app import App
from fencekit.settings import (
    ClientSettings,
    PoolSettings,
    ServerSettings,
    defaults,
    describe,
    given,
    resolve,
    table,
)

README = Path(__file__).resolve().parents[2] / "README.md"


class Echo:
    queue = "settings"
    operation = "echo"

    @classmethod
    async def perform(cls, payload: dict) -> None:
        return None


def test_the_server_and_the_pool_share_one_default_per_setting() -> None:
    server, pool = defaults(ServerSettings), defaults(PoolSettings)
    for name, value in server.items():
        assert pool[name] == value, name
    assert server["grace"] == 10.0
    assert server["web_port"] == 3030
    assert server["heartbeat_ttl"] == 30.0
    assert server["prefix"] == "fencekit"


def test_every_pool_setting_is_a_flag_and_an_environment_variable() -> None:
    help_text = build_parser().format_help()
    for name, flag, env, _ in describe(PoolSettings):
        assert env == "FENCEKIT_" + name.upper()
        assert flag == "--" + name.replace("_", "-")
        if table(PoolSettings)[name].option.flag:
            assert flag in help_text, name
            assert env in " ".join(help_text.split()), name


def test_an_argument_wins_over_the_environment_which_wins_over_the_default() -> None:
    env = {"FENCEKIT_CONCURRENCY": "7", "FENCEKIT_GRACE": "2.5"}
    settings = resolve(ServerSettings, {"concurrency": 3}, environ=env)
    assert settings["concurrency"] == 3
    assert settings["grace"] == 2.5
    assert settings["heartbeat_ttl"] == 30.0
    assert given(ServerSettings, "grace", {}, env)
    assert not given(ServerSettings, "heartbeat_ttl", {}, env)


def test_server_client_and_pool_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCEKIT_PREFIX", "fromenv")
    monkeypatch.setenv("FENCEKIT_CONCURRENCY", "4")
    monkeypatch.setenv("FENCEKIT_PROCS", "3")
    assert Client().keys.prefix == "fromenv"
    server = Server()
    assert server.concurrency == 4
    assert server.keys.prefix == "fromenv"
    assert Pool([Echo]).settings["procs"] == 3
    assert Server(prefix="arg").keys.prefix == "arg"


def test_a_bad_value_names_the_setting_and_where_it_came_from() -> None:
    with pytest.raises(ConfigError, match=r"concurrency must be >= 1, got 0 \(argument\)"):
        resolve(ServerSettings, {"concurrency": 0})
    with pytest.raises(
        ConfigError, match=r"concurrency must be a valid int, got 'many' \(from FENCEKIT_CONCURRENCY\)"
    ):
        resolve(ServerSettings, {}, environ={"FENCEKIT_CONCURRENCY": "many"})
    with pytest.raises(ConfigError, match=r"grace must be a number, got True"):
        Server(grace=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"web_port must be a port from 0 to 65535"):
        Server(web_port=70000)
    with pytest.raises(ConfigError, match=r"unsupported URL scheme 'http'"):
        Client("http://example.com")


def test_an_unknown_setting_is_refused_with_the_closest_name() -> None:
    with pytest.raises(
        ConfigError, match=r"Server\(\) got an unknown setting 'concurency'; did you mean 'concurrency'"
    ):
        Server(concurency=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"Client\(\) got an unknown setting 'grace'"):
        Client(grace=1.0)  # type: ignore[call-arg]


def test_a_secret_comes_from_a_file_and_never_shows_in_an_error(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    settings = resolve(ServerSettings, {}, environ={"FENCEKIT_ADMIN_PASSWORD_FILE": str(secret)})
    assert settings["admin_password"] == "s3cret"
    with pytest.raises(ConfigError, match="FENCEKIT_ADMIN_PASSWORD_FILE") as missing:
        resolve(ServerSettings, {}, environ={"FENCEKIT_ADMIN_PASSWORD_FILE": str(tmp_path / "nope")})
    assert "s3cret" not in str(missing.value)
    with pytest.raises(ConfigError, match=r"redis_url") as bad:
        resolve(ClientSettings, {"redis_url": "redis://user:hunter2@host:notaport/0"})
    assert "hunter2" not in str(bad.value)


def test_off_and_none_turn_an_optional_setting_off() -> None:
    for text in ("off", "none", "-1", ""):
        assert resolve(ServerSettings, {}, environ={"FENCEKIT_WEB_PORT": text})["web_port"] is None
    assert resolve(PoolSettings, {}, environ={"FENCEKIT_HANG_TIMEOUT": "off"})["hang_timeout"] is None
    assert resolve(PoolSettings, {}, environ={"FENCEKIT_LOG_LEVEL": "debug"})["log_level"] == "DEBUG"


def test_a_child_checks_its_settings_again_and_ignores_the_environment() -> None:
    settings = resolve(PoolSettings, {"procs": 2, "concurrency": 5}, environ={})
    again = resolve(PoolSettings, dict(settings), environ={"FENCEKIT_CONCURRENCY": "9"})
    assert again == settings
    bad = dict(settings, grace=-1.0)
    with pytest.raises(ConfigError, match="grace must be >= 0"):
        resolve(PoolSettings, bad, environ={})


def test_a_new_pool_setting_is_one_declaration() -> None:
    """What the table derives: a kwarg of Pool, a flag, a variable and the child's copy, per setting."""
    pool = Pool([Echo], procs=1)
    supervisor = Supervisor(pool.settings, App([Echo]), spawn="exec", worker_paths=("x:y",))
    for name in table(PoolSettings):
        assert name in pool.settings
        assert name in supervisor.settings
    parser = build_parser()
    flags = {action.dest for action in parser._actions}
    assert set(table(PoolSettings)) <= flags


def test_the_settings_page_lists_every_setting_with_its_default() -> None:
    rows = {}
    for line in (README.parent / "docs" / "reference" / "settings.md").read_text().splitlines():
        match = re.match(r"\| `(\w+)`(?:, `(\w+)`)? \| ([^|]+) \|", line)
        if match:
            for name in match.group(1, 2):
                if name:
                    rows[name] = match.group(3).strip().strip("`").split(" (")[0]  # "604800 (7 days)"
    for name, setting in table(PoolSettings).items():
        if not setting.option.flag:
            continue
        assert name in rows, f"the settings page's table lacks {name}"
        default = setting.option.default
        if callable(default) or default is None:
            continue
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert rows[name] == shown, f"the page says {name} defaults to {rows[name]}, the table says {shown}"


def test_every_test_the_docs_name_exists() -> None:
    """A claim ("Failure behaviour" and every guide) names its test: a renamed or deleted test must not
    leave it dangling."""
    tests_dir = README.parent / "tests" / "integration"
    named: list[tuple[str, str, str]] = []
    for page in [README, *sorted((README.parent / "docs").rglob("*.md"))]:
        current = ""
        pattern = r"`(?:tests/integration/)?(test_\w+\.py)(?:::(test_\w+))?`|`::(test_\w+)`"
        for match in re.finditer(pattern, page.read_text()):
            current = match.group(1) or current  # "`::test_x`" continues the file named before
            name = match.group(2) or match.group(3)
            if name:
                named.append((page.name, current, name))
    assert len(named) > 40, named
    for page_name, file, name in named:
        assert file, f"{page_name} names ::{name} before naming its file"
        source = (tests_dir / file).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.MULTILINE), (
            f"{page_name} names {file}::{name}"
        )


def test_a_switch_is_a_flag_without_a_value_and_a_yes_or_no_in_the_environment() -> None:
    """``burst``: ``--burst``, ``FENCEKIT_BURST=1/true/yes/on`` or ``0/false/no/off``, ``burst=True``."""
    from fencekit.pool.cli import _explicit

    assert defaults(PoolSettings)["burst"] is False
    assert _explicit(build_parser().parse_args(["app:x", "--burst"])) == {"burst": True}
    assert _explicit(build_parser().parse_args(["app:x"])) == {}
    for text, value in (("1", True), ("yes", True), ("ON", True), ("0", False), ("off", False), ("", False)):
        assert resolve(ServerSettings, {}, environ={"FENCEKIT_BURST": text})["burst"] is value, text
    with pytest.raises(ConfigError, match=r"burst must be one of 1, true.*\(from FENCEKIT_BURST\)"):
        resolve(ServerSettings, {}, environ={"FENCEKIT_BURST": "maybe"})
    with pytest.raises(ConfigError, match="burst must be True or False, got 1 \\(argument\\)"):
        resolve(ServerSettings, {"burst": 1})
    assert Server(burst=True, burst_timeout=5).settings["burst_timeout"] == 5.0
    assert Pool([Echo], procs=1, burst=True).settings["burst"] is True
    with pytest.raises(ConfigError, match="burst_timeout must be positive"):
        resolve(PoolSettings, {"burst_timeout": 0.0})
