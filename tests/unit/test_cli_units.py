"""The operator command's parts that need no Redis: line parsing, flags from the settings table,
exit codes, time formats, and the verbs' module sizes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fencekit.cli import verbs
from fencekit.cli.base import Exit, build_parser
from fencekit.cli.enqueue import task_of
from fencekit.cli.output import age, when
from fencekit.runtime.exits import ExitCode
from fencekit.settings import ServerSettings, table


def test_a_line_becomes_a_task_with_every_field_and_its_delay() -> None:
    task, delay = task_of(
        {
            "queue": "emails", "operation": "send", "params": {"to": "a"}, "jid": "j-1", "delay": 2.5,
            "timeout": 30, "expires": 60, "keep_result": 10, "unique_key": "k", "unique_for": 5,
        },
        max_payload=65536,
        keep_result=0,
    )  # fmt: skip
    assert (task.queue, task.operation, task.params, task.jid, delay) == (
        "emails",
        "send",
        {"to": "a"},
        "j-1",
        2.5,
    )
    assert (task.timeout, task.expires, task.keep_result, task.unique_key, task.unique_for) == (
        30,
        60,
        10,
        "k",
        5,
    )
    bare, no_delay = task_of({"queue": "q", "operation": "op"}, max_payload=65536, keep_result=0)
    assert bare.params == {}
    assert bare.jid  # a new jid, filled in by the validation
    assert no_delay == 0.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1], "a line must be a JSON object"),
        ({"queue": "q"}, "operation must be a string"),
        ({"queue": "q", "operation": "op", "prams": {}}, "unknown field(s) 'prams'"),
        ({"queue": "q", "operation": "op", "params": [1]}, "params must be a JSON object"),
        ({"queue": "q", "operation": "op", "delay": -1}, "delay must be a number of seconds"),
        ({"queue": "q", "operation": "op", "delay": True}, "delay must be a number of seconds"),
        ({"queue": "a b", "operation": "op"}, "queue"),
        ({"queue": "q", "operation": "op", "jid": "a b"}, "jid must not contain ' '"),
        ({"queue": "q", "operation": "op", "params": {"big": "x" * 2000}}, "above max_payload"),
    ],
)
def test_a_bad_line_says_why(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):  # a PayloadError is a ValueError
        task_of(data, max_payload=1000, keep_result=0)


def test_every_verb_derives_its_settings_flags_from_the_table() -> None:
    rows = table(ServerSettings)
    for name, verb in verbs().items():
        parser = build_parser(verb, f"fencekit {name}")
        text = parser.format_help()
        for setting in ("redis_url", "prefix", *verb.settings):
            assert rows[setting].flag in text, (name, setting)
            assert rows[setting].env in " ".join(text.split()), (name, setting)


def test_the_exit_codes_are_the_pool_s_where_they_mean_the_same() -> None:
    assert (Exit.OK, Exit.USAGE, Exit.REDIS) == (ExitCode.OK, ExitCode.USAGE, ExitCode.REDIS)
    assert (Exit.NOT_DONE, Exit.INTERRUPTED) == (1, 130)


def test_times_and_ages_read_at_a_glance() -> None:
    assert when(0) == "1970-01-01 00:00:00Z"
    assert when(None) == age(None) == "-"
    assert [age(s) for s in (0.42, 12, 303, 7800)] == ["0.4s", "12s", "5m03s", "2h10m"]


def test_each_module_of_the_command_stays_small() -> None:
    for path in Path(verbs.__code__.co_filename).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path
