"""The operator verbs of ``fencekit`` as real subprocesses against a real Redis.

Each test runs ``python -m fencekit ...`` and checks what an operator sees
(the numbers in the human table, the documented ``--json`` fields, the exit
code) against the state read directly from Redis. Bulk operations are
checked for their cost by the Redis server's own command counts
(``INFO commandstats``), never by time.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import pty
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from tests.queue_helpers import eventually, new_server, qkey, running, stats, worker

import fencekit
from fencekit import Client, Task

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEKIT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    env.update(extra)
    return env


def fk(url: str | None, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m fencekit ARGS`` with ``FENCEKIT_REDIS_URL=url`` (None: not set)."""
    extra = dict(env)
    if url is not None:
        extra["FENCEKIT_REDIS_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "fencekit", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_env(**extra),
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def ok_json(done: subprocess.CompletedProcess[str], code: int = 0) -> Any:
    assert done.returncode == code, done.stdout + done.stderr
    return json.loads(done.stdout)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The stderr of a refused run: one line, no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def free_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def on_terminal(url: str, *args: str, answer: bytes = b"") -> tuple[int, str]:
    """``python -m fencekit ARGS`` with stdin, stdout and stderr on a pseudo-terminal: (exit code, output).

    ``answer`` is typed ahead (the terminal holds it until the command reads a line).
    """
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencekit", *args],
        stdin=slave, stdout=slave, stderr=slave, env=_env(FENCEKIT_REDIS_URL=url, COLUMNS="120"),
    )  # fmt: skip
    os.close(slave)
    if answer:
        os.write(master, answer)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the command closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    code = proc.wait(timeout=TIMEOUT)
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))


def envelope(jid: str, queue: str = "q", operation: str = "op", **params: Any) -> bytes:
    return orjson.dumps({"jid": jid, "queue": queue, "operation": operation, "params": params, "attempt": 0})


def commands(r: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT (``INFO commandstats``)."""
    info = r.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


LUA = Path(fencekit.__file__).parent / "_redis" / "lua"
SCRIPT_COMMANDS = {
    name.lower() for f in LUA.glob("*.lua") for name in re.findall(r"redis\.call\('(\w+)'", f.read_text())
}


def sent(calls: dict[str, int]) -> int:
    """How many commands clients sent: commandstats also counts those a script calls (its own)."""
    return sum(n for name, n in calls.items() if name not in SCRIPT_COMMANDS)


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


# -- the command itself --------------------------------------------------------------------


def test_version_prints_the_package_version() -> None:
    done = fk(None, "--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"fencekit {fencekit.__version__}")


def test_help_lists_every_command_and_an_unknown_one_is_usage() -> None:
    done = fk(None, "--help")
    assert done.returncode == 0
    for name in ("pool", "upgrade-keys", "enqueue", "queues", "consumers", "job", "cancel", "purge"):
        assert f"  {name} " in done.stdout, name
    assert "dead-letters" in done.stdout
    assert "failed" in done.stdout
    assert fk(None).returncode == 2
    done = fk(None, "frobnicate")
    assert done.returncode == 2
    assert "unknown command 'frobnicate'" in one_error_line(done)


def test_every_verb_takes_its_flags_from_the_settings_table() -> None:
    for verb in ("enqueue", "queues", "consumers", "job", "cancel", "purge", "dead-letters", "failed"):
        done = fk(None, verb, "--help")
        assert done.returncode == 0, verb
        done.stdout = " ".join(done.stdout.split())  # argparse wraps the help
        for text in ("env FENCEKIT_REDIS_URL", "env FENCEKIT_PREFIX", "--json", "Exit codes: 0 done"):
            assert text in done.stdout, (verb, text)
    assert "FENCEKIT_HEARTBEAT_TTL" in fk(None, "consumers", "--help").stdout
    assert "FENCEKIT_KEEP_RESULT" in fk(None, "enqueue", "--help").stdout


VERB_ARGS = [
    ("queues",),
    ("consumers",),
    ("job", "some-jid"),
    ("cancel", "some-jid"),
    ("purge", "q", "--yes"),
    ("dead-letters", "q"),
    ("dead-letters", "q", "--revive-all"),
    ("failed", "q", "--retry-all"),
    ("enqueue", "q", "op"),
]


@pytest.mark.parametrize("args", VERB_ARGS, ids=[" ".join(a[:2]) for a in VERB_ARGS])
def test_a_redis_that_is_down_is_one_line_and_exit_4(args: tuple[str, ...]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = fk(url, *args)
    assert done.returncode == 4, done.stdout + done.stderr
    line = one_error_line(done)
    assert line.startswith(f"fencekit {args[0]}: error: cannot use Redis at redis://127.0.0.1:"), line
    assert done.stdout == ""


@pytest.mark.parametrize("args", [("queues",), ("enqueue", "q", "op")], ids=["queues", "enqueue"])
def test_a_bad_url_or_prefix_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = fk(None, *args, "--redis-url", "bogus://x")
    assert done.returncode == 2
    assert "unsupported URL scheme 'bogus'" in one_error_line(done)
    done = fk("redis://:s3cret@127.0.0.1:1/0", *args, "--prefix", "bad prefix")
    assert done.returncode == 2
    assert "prefix" in one_error_line(done)
    done = fk(None, *args, FENCEKIT_REDIS_URL="redis://:s3cret@host:notaport/0")
    assert done.returncode == 2
    assert "s3cret" not in one_error_line(done)


def test_the_prefix_flag_and_variable_choose_the_keys(redis_url: str, r: redis.Redis) -> None:
    assert fk(redis_url, "enqueue", "emails", "send", "--prefix", "other").returncode == 0
    assert r.llen("other:{emails}:pending") == 1
    assert ok_json(fk(redis_url, "queues", "--json"))["queues"] == []
    (row,) = ok_json(fk(redis_url, "queues", "--json", FENCEKIT_PREFIX="other"))["queues"]
    assert (row["name"], row["pending"]) == ("emails", 1)


def test_a_verb_reads_only_its_own_settings_from_the_environment(redis_url: str) -> None:
    done = fk(redis_url, "consumers", "--json", FENCEKIT_HEARTBEAT_TTL="5", FENCEKIT_WEB_PORT="banana")
    assert ok_json(done) == {
        "consumers": [],
        "heartbeat_ttl": 5.0,
    }  # the server's web port is not its business
    done = fk(redis_url, "consumers", FENCEKIT_HEARTBEAT_TTL="soon")
    assert done.returncode == 2
    assert "heartbeat_ttl must be a valid float" in one_error_line(done)


# -- enqueue -------------------------------------------------------------------------------


def test_enqueue_prints_the_jid_of_a_task_with_its_params(redis_url: str, r: redis.Redis) -> None:
    done = fk(redis_url, "enqueue", "emails", "send", "--params", '{"to": "a@example.com"}')
    assert done.returncode == 0, done.stderr
    jid = done.stdout.strip()
    (raw,) = r.lrange(qkey("emails", "pending"), 0, -1)
    env = orjson.loads(raw)
    assert (env["jid"], env["operation"], env["params"]) == (jid, "send", {"to": "a@example.com"})
    assert done.stderr == ""  # the client's per-task log line does not reach the operator

    data = ok_json(fk(redis_url, "enqueue", "emails", "send", "--jid", "order-42", "--delay", "60", "--json"))
    assert data == {"jid": "order-42", "queue": "emails", "operation": "send", "created": True}
    assert r.zcard(qkey("emails", "scheduled")) == 1


def test_enqueue_with_a_held_unique_key_prints_the_holder(redis_url: str) -> None:
    first = fk(redis_url, "enqueue", "q", "op", "--unique-key", "k1").stdout.strip()
    done = fk(redis_url, "enqueue", "q", "op", "--unique-key", "k1", "--json")
    assert ok_json(done) == {"jid": first, "queue": "q", "operation": "op", "created": False}
    done = fk(redis_url, "enqueue", "q", "op", "--unique-key", "k1")
    assert (done.returncode, done.stdout.strip()) == (0, first)
    assert "is held by task" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--params", '{"to"'), "--params is not valid JSON"),
        (("--params", "[1, 2]"), "--params must be a JSON object"),
        (("--jid", "has space"), "jid must not contain ' ' (1 to 200 printable characters"),
        (("--delay", "-1"), "delay must be a number of seconds or a timedelta, from 0"),
    ],
    ids=["bad-json", "not-object", "bad-jid", "negative-delay"],
)
def test_enqueue_refuses_bad_input_with_exit_2(redis_url: str, args: tuple[str, ...], message: str) -> None:
    done = fk(redis_url, "enqueue", "q", "op", *args)
    assert done.returncode == 2
    assert message in one_error_line(done)
    assert fk(redis_url, "enqueue", "q").returncode == 2  # OPERATION missing
    assert fk(redis_url, "enqueue", "q", "op", "--file", "x.jsonl").returncode == 2  # both


def test_enqueue_from_a_file_sends_batches_and_skips_a_bad_line(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    lines = [json.dumps({"queue": "bulk", "operation": "op", "params": {"i": i}}) for i in range(10_000)]
    lines[4_999] = '{"queue": "bulk", "operation": '  # line 5000: broken JSON
    lines[6_999] = json.dumps({"queue": "bulk", "operation": "op", "delay": 3600, "jid": "later"})
    lines.insert(100, "")  # a blank line is not a task, and not an error
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    r.config_resetstat()
    done = fk(redis_url, "enqueue", "--file", str(path))
    calls = commands(r)
    assert done.returncode == 1, done.stderr
    assert f"{path}:5001: not valid JSON" in done.stderr  # the blank line counts as a line
    assert done.stdout.strip() == f"enqueued 9999 task(s) from {path}; 1 bad line(s) skipped"
    assert r.llen(qkey("bulk", "pending")) == 9_998
    assert r.zcard(qkey("bulk", "scheduled")) == 1
    assert stats(r, "bulk")["enqueued"] == 9_999
    # 10,001 lines in batches of 500: one enqueue script call per batch, two for the one with a delay
    assert calls.get("evalsha", 0) <= math.ceil(10_001 / 500) + 1, calls
    assert sent(calls) < 100, calls


def test_enqueue_from_a_file_reports_every_bad_line_in_json(redis_url: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"queue": "a", "operation": "op"}),
                "[1, 2]",
                json.dumps({"queue": "a", "operation": "op", "prams": {}}),
                json.dumps({"queue": "bad name", "operation": "op"}),
                json.dumps({"queue": "a", "operation": "op", "params": {"x": 1}, "jid": "j-5"}),
            ]
        )
    )
    data = ok_json(fk(redis_url, "enqueue", "--file", str(path), "--json", "--batch", "2"), code=1)
    assert (data["lines"], data["enqueued"], data["bad"]) == (5, 2, 3)
    assert [b["line"] for b in data["bad_lines"]] == [2, 3, 4]
    assert "must be a JSON object" in data["bad_lines"][0]["error"]
    assert "unknown field(s) 'prams'" in data["bad_lines"][1]["error"]
    assert "queue" in data["bad_lines"][2]["error"]
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps({"queue": "a", "operation": "op"}) + "\n")
    assert ok_json(fk(redis_url, "enqueue", "--file", str(clean), "--json"))["enqueued"] == 1
    assert fk(redis_url, "enqueue", "--file", str(tmp_path / "missing.jsonl")).returncode == 2


def test_enqueue_from_stdin_stops_on_ctrl_c_with_exit_130(redis_url: str, r: redis.Redis) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencekit", "enqueue", "--file", "-", "--batch", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(FENCEKIT_REDIS_URL=redis_url),
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"queue": "live", "operation": "op"}) + "\n")
        proc.stdin.flush()
        asyncio.run(
            eventually(lambda: r.llen(qkey("live", "pending")) == 1, timeout=60, what="the first line")
        )
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "1 task(s) enqueued before" in err
    assert "interrupted" in err
    assert "Traceback" not in err


# -- reading: queues, consumers, job ---------------------------------------------------------


async def test_queues_and_consumers_show_what_a_running_server_does(redis_url: str, r: redis.Redis) -> None:
    release = asyncio.Event()

    async def slow(payload: dict[str, Any]) -> None:
        await release.wait()

    async def boom(payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    server = new_server(redis_url, worker("work", "slow", slow), worker("work", "boom", boom, retry=False),
                        concurrency=2)  # fmt: skip
    async with Client(redis_url) as client, running(server):
        await client.enqueue_many([Task("work", "boom", {}), Task("other", "x", {})])
        await eventually(lambda: stats(r, "work")["failed"] == 1, what="the failure")
        await client.enqueue_many([Task("work", "slow", {"i": i}) for i in range(3)])
        await client.enqueue(Task("work", "slow", {}), delay=3600)
        await eventually(lambda: r.llen(qkey("work", "pending")) == 1, what="two running, one waiting")
        table = await asyncio.to_thread(fk, redis_url, "queues")
        wide = await asyncio.to_thread(fk, redis_url, "queues", "--wide")
        data = ok_json(await asyncio.to_thread(fk, redis_url, "queues", "--json"))
        people = await asyncio.to_thread(fk, redis_url, "consumers")
        who = ok_json(await asyncio.to_thread(fk, redis_url, "consumers", "--json"))
        release.set()
    assert table.returncode == 0
    header, *rows = [line.split() for line in table.stdout.splitlines() if line.strip() and "──" not in line]
    assert header == ["queue", "pending", "scheduled", "running", "dead", "letters", "processed", "failed",
                      "retried", "fenced", "out", "dead"]  # fmt: skip
    assert rows == [
        ["other", "1", "0", "0", "0", "0", "0", "0", "0", "0"],
        ["work", "1", "1", "2", "0", "0", "1", "0", "0", "0"],
    ]
    header, *rows = [line.split() for line in wide.stdout.splitlines() if line.strip() and "──" not in line]
    assert header[-6:] == ["enqueued", "purged", "revived", "expired", "deduped", "cancelled"]
    assert rows[1] == ["work", "1", "1", "2", "0", "0", "1", "0", "0", "0", "5", "0", "0", "0", "0", "0"]
    work = next(q for q in data["queues"] if q["name"] == "work")
    shown = ("pending", "scheduled", "running", "dead_letters", "failed", "enqueued")
    assert {k: work[k] for k in shown} == {
        "pending": 1, "scheduled": 1, "running": 2, "dead_letters": 0, "failed": 1, "enqueued": 5,
    }  # fmt: skip
    assert set(work) >= {"processed", "retried", "dead", "fenced_out", "purged", "revived", "cancelled"}
    assert data["totals"]["enqueued"] == 6
    assert data["totals"]["pending"] == 2

    (consumer,) = who["consumers"]
    assert consumer["id"] == server.consumer_id
    assert (consumer["pid"], consumer["concurrency"], consumer["in_flight"], consumer["alive"]) == (
        os.getpid(), 2, 2, True,
    )  # fmt: skip
    assert set(consumer["queues"]) == {"work"}
    assert consumer["beat_age"] < who["heartbeat_ttl"]
    assert set(consumer) == {"id", "kind", "host", "pid", "queues", "concurrency", "started", "beat_age",
                             "in_flight", "alive"}  # fmt: skip
    assert server.consumer_id in people.stdout
    assert f"/{os.getpid()}" in people.stdout
    assert people.stdout.split()[-1] == "yes"  # alive, the last column


async def test_job_shows_a_record_from_result_to_traceback(redis_url: str, r: redis.Redis) -> None:
    async def parse(payload: dict[str, Any]) -> Any:
        if payload.get("fail"):
            raise KeyError("lines")
        return {"moves": 42}

    server = new_server(redis_url, worker("pgn", "parse", parse, retry=False))
    async with Client(redis_url) as client, running(server):
        good = await client.enqueue(Task("pgn", "parse", {"id": 1}))
        bad = await client.enqueue(Task("pgn", "parse", {"fail": True}))
        await client.result(good, timeout=30)
        await eventually(lambda: stats(r, "pgn")["failed"] == 1, what="the failure")
    done = fk(redis_url, "job", good)
    assert done.returncode == 0
    assert "status     done" in done.stdout
    assert 'result     {"moves": 42}' in done.stdout
    data = ok_json(fk(redis_url, "job", good, "--json"))
    shown = ("found", "jid", "queue", "operation", "status", "attempt", "result", "params")
    assert {k: data[k] for k in shown} == {
        "found": True, "jid": good, "queue": "pgn", "operation": "parse", "status": "done", "attempt": 1,
        "result": {"moves": 42}, "params": {"id": 1},
    }  # fmt: skip
    assert data["token"] > 0
    # finished_at is on Redis's clock in ms, started_at read from the token in µs: equal to within 1 ms
    assert data["finished_at"] + 0.001 >= data["started_at"] >= data["enqueued_at"] > 0
    assert set(data) >= {"due_at", "progress", "error"}

    done = fk(redis_url, "job", bad, "--queue", "pgn")
    assert "status     failed" in done.stdout
    assert "error      KeyError: 'lines'" in done.stdout
    assert "Traceback (most recent call last)" in done.stdout
    error = ok_json(fk(redis_url, "job", bad, "--json"))["error"]
    assert error["type"] == "KeyError"
    assert "raise KeyError" in error["traceback"]

    missing = fk(redis_url, "job", "no-such-jid")
    assert missing.returncode == 1
    assert "no record of task no-such-jid" in one_error_line(missing)
    assert ok_json(fk(redis_url, "job", "no-such-jid", "--json"), code=1) == {
        "jid": "no-such-jid",
        "found": False,
    }
    assert fk(redis_url, "job", "bad jid").returncode == 2


# -- changing: cancel, purge ---------------------------------------------------------------


def test_cancel_a_waiting_task_then_again_is_not_done(redis_url: str, r: redis.Redis) -> None:
    jid = fk(redis_url, "enqueue", "q", "op").stdout.strip()
    done = fk(redis_url, "cancel", jid)
    assert (done.returncode, done.stdout.strip()) == (0, f"cancelled {jid}")
    assert r.llen(qkey("q", "pending")) == 0
    assert stats(r, "q")["cancelled"] == 1
    again = fk(redis_url, "cancel", jid, "--json")
    assert again.returncode == 1
    assert json.loads(again.stdout) == {"jid": jid, "cancelled": False, "status": "cancelled"}
    assert "it is cancelled already" in again.stderr
    unknown = fk(redis_url, "cancel", "nobody")
    assert unknown.returncode == 1
    assert "no such task" in one_error_line(unknown)


def test_purge_needs_yes_off_a_terminal_and_refuses_an_unknown_queue(redis_url: str, r: redis.Redis) -> None:
    for _ in range(3):
        fk(redis_url, "enqueue", "q", "op")
    refused = fk(redis_url, "purge", "q")
    assert refused.returncode == 2
    assert "pass --yes" in one_error_line(refused)
    assert r.llen(qkey("q", "pending")) == 3
    done = fk(redis_url, "purge", "q", "--yes")
    assert (done.returncode, done.stdout.strip()) == (0, "purged 3 waiting task(s) from q")
    assert ok_json(fk(redis_url, "purge", "q", "--yes", "--json")) == {"queue": "q", "purged": 0}
    assert stats(r, "q")["purged"] == 3
    typo = fk(redis_url, "purge", "qq", "--yes")
    assert typo.returncode == 1
    assert "no queue named 'qq' (known: q)" in one_error_line(typo)


def test_purge_asks_on_a_terminal_and_no_is_not_done(redis_url: str, r: redis.Redis) -> None:
    for _ in range(3):
        fk(redis_url, "enqueue", "q", "op")
    code, shown = on_terminal(redis_url, "purge", "q", answer=b"n\n")
    assert code == 1, shown
    assert "Drop the 3 task(s) waiting in 'q'? [y/N]" in shown
    assert "nothing purged" in shown
    assert r.llen(qkey("q", "pending")) == 3
    code, shown = on_terminal(redis_url, "purge", "q", answer=b"y\n")
    assert code == 0, shown
    assert "purged 3 waiting task(s) from q" in shown
    assert r.llen(qkey("q", "pending")) == 0


# -- dead letters ---------------------------------------------------------------------------


def _dead(r: redis.Redis, queue: str, n: int, *, start: int = 0, batch: int = 5_000) -> list[str]:
    """``n`` dead letters written in the documented layout (keys.py): valid envelopes, reason given."""
    ids = []
    for first in range(start, start + n, batch):
        pipe = r.pipeline(transaction=False)
        for i in range(first, min(first + batch, start + n)):
            dead_id = f"d{i:06d}"
            why = {"reason": f"unknown operation 'op' #{i}", "jid": f"j{i}", "at": 1_700_000_000_000 + i}
            pipe.hset(
                qkey(queue, "dead"),
                mapping={dead_id: envelope(f"j{i}", queue, i=i), f"{dead_id}:why": json.dumps(why)},
            )
            pipe.zadd(qkey(queue, "dead:index"), {dead_id: 1_700_000_000_000 + i})
            ids.append(dead_id)
        pipe.execute()
    r.sadd("fencekit:{registry}:queues", queue)
    return ids


async def test_a_malformed_payload_becomes_a_dead_letter_listed_and_revived(
    redis_url: str, r: redis.Redis
) -> None:
    async def nothing(payload: dict[str, Any]) -> None:
        return None

    server = new_server(redis_url, worker("poison", "x", nothing))
    async with running(server):
        r.lpush(qkey("poison", "pending"), b"{not json", envelope("j-ok", "poison", "nobody"))
        r.lpush(qkey("poison", "wake"), "1")
        await eventually(lambda: stats(r, "poison")["dead"] == 2, what="two dead letters")
    done = fk(redis_url, "dead-letters", "poison")
    assert done.returncode == 0
    assert "newest 2 of 2 dead letter(s)" in done.stdout
    assert "payload is not valid JSON" in done.stdout
    data = ok_json(fk(redis_url, "dead-letters", "poison", "--json", "--limit", "1"))
    assert data["queue"] == "poison"
    assert data["count"] == 2
    assert len(data["dead_letters"]) == 1
    (letter,) = data["dead_letters"]
    assert set(letter) == {"id", "jid", "reason", "at", "payload", "extra"}
    ids = {d["id"]: d for d in ok_json(fk(redis_url, "dead-letters", "poison", "--json"))["dead_letters"]}
    ok_id = next(i for i, d in ids.items() if d["jid"] == "j-ok")
    assert "no worker" in ids[ok_id]["reason"] or "nobody" in ids[ok_id]["reason"]
    revived = fk(redis_url, "dead-letters", "poison", "--revive", ok_id, "--json")
    assert ok_json(revived) == {"queue": "poison", "id": ok_id, "revived": True}
    assert r.lrange(qkey("poison", "pending"), 0, -1) == [envelope("j-ok", "poison", "nobody").decode()]
    gone = fk(redis_url, "dead-letters", "poison", "--revive", ok_id)
    assert gone.returncode == 1
    assert "no dead letter" in one_error_line(gone)
    assert fk(redis_url, "dead-letters", "poison", "--purge").returncode == 2  # off a terminal: --yes
    assert ok_json(fk(redis_url, "dead-letters", "poison", "--purge", "--yes", "--json"))["purged"] == 1
    assert r.exists(qkey("poison", "dead"), qkey("poison", "dead:index")) == 0
    assert stats(r, "poison")["dead"] == 2  # the counters stay
    assert fk(redis_url, "dead-letters", "nope").returncode == 1


def test_revive_all_of_20000_letters_takes_a_bounded_number_of_commands(
    redis_url: str, r: redis.Redis
) -> None:
    ids = _dead(r, "big", 20_000)
    r.hset(qkey("big", "dead"), mapping={"broken-1": b"{not json", "broken-2": b"[]"})  # no jid, no record
    r.zadd(qkey("big", "dead:index"), {"broken-1": 1, "broken-2": 2})  # the oldest two
    r.hset(qkey("big", "job:j5"), mapping={"state": "dead", "env": "x", "error": "{}", "finished": "1"})
    r.pexpire(qkey("big", "job:j5"), 600_000)
    r.config_resetstat()
    done = fk(redis_url, "dead-letters", "big", "--revive-all", "--json")
    calls = commands(r)
    assert ok_json(done) == {"queue": "big", "revived": 20_002}
    # one ZRANGE, then per batch of 1,000 one HMGET and one script call
    assert calls.get("evalsha", 0) + calls.get("eval", 0) <= 21 + 2, calls
    assert calls.get("hmget", 0) == 21, calls
    assert sent(calls) < 100, calls
    assert r.zcard(qkey("big", "dead:index")) == 0
    assert r.hlen(qkey("big", "dead")) == 0
    pending = r.lrange(qkey("big", "pending"), 0, -1)
    assert len(pending) == 20_002
    assert pending[-2:] == ["[]", "{not json"]  # the oldest letters are claimed first (RPOP) ...
    assert orjson.loads(pending[-3])["jid"] == "j0"  # ... as they were stored
    assert (stats(r, "big")["revived"], stats(r, "big")["enqueued"]) == (20_002, 20_002)
    record = r.hgetall(qkey("big", "job:j5"))
    assert record["state"] == "pending"
    assert "error" not in record
    assert r.pttl(qkey("big", "job:j5")) == -1
    assert len(ids) == 20_000
    human = fk(redis_url, "dead-letters", "big", "--revive-all")
    assert (human.returncode, human.stdout.strip()) == (0, "revived 0 dead letter(s) of big")
    _dead(r, "big", 3_000, start=20_000)
    code, shown = on_terminal(redis_url, "dead-letters", "big", "--revive-all", "--batch", "100")
    assert code == 0, shown  # the Rich bar on a terminal
    assert "revived 3000 dead letter(s) of big" in shown


# -- failures --------------------------------------------------------------------------------


def _failed(r: redis.Redis, queue: str, n: int) -> list[str]:
    """``n`` kept failures in the documented layout: a record with its envelope and error, indexed."""
    jids = []
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        jid = f"f{i}"
        error = {"type": "RuntimeError", "message": f"broken {i}", "traceback": "Traceback ...\nRuntimeError"}
        record = qkey(queue, f"job:{jid}")
        fields = {"state": "failed", "env": envelope(jid, queue, i=i).decode(), "error": json.dumps(error)}
        pipe.hset(record, mapping={**fields, "finished": str(1_700_000_000_000 + i)})
        pipe.lpush(qkey(queue, "failed"), record)
        jids.append(jid)
    pipe.sadd("fencekit:{registry}:queues", queue)
    pipe.execute()
    return jids


def test_failed_lists_retries_one_and_retries_all_in_batches(redis_url: str, r: redis.Redis) -> None:
    _failed(r, "fq", 3_000)
    done = fk(redis_url, "failed", "fq", "--limit", "5")
    assert done.returncode == 0
    assert "newest 5 of 3000 kept failure(s)" in done.stdout
    assert "RuntimeError: broken 2999" in done.stdout
    data = ok_json(fk(redis_url, "failed", "fq", "--json", "--limit", "2"))
    assert data["count"] == 3_000
    assert [f["jid"] for f in data["failed"]] == ["f2999", "f2998"]
    assert data["failed"][0]["status"] == "failed"
    assert data["failed"][0]["error"]["message"] == "broken 2999"
    shown = fk(redis_url, "failed", "fq", "--show", "f7")
    assert "error      RuntimeError: broken 7" in shown.stdout
    assert "traceback:" in shown.stdout

    assert ok_json(fk(redis_url, "failed", "fq", "--retry", "f0", "--json")) == {
        "queue": "fq",
        "jid": "f0",
        "retried": True,
    }
    again = fk(redis_url, "failed", "fq", "--retry", "f0")
    assert again.returncode == 1
    assert "not a kept failure" in one_error_line(again)

    r.config_resetstat()
    data = ok_json(fk(redis_url, "failed", "fq", "--retry-all", "--batch", "500", "--json"))
    calls = commands(r)
    assert data == {"queue": "fq", "retried": 2_999}
    assert calls.get("evalsha", 0) + calls.get("eval", 0) <= 6 + 2, calls  # one script call per batch
    assert calls.get("lrange", 0) == 1, calls
    assert sent(calls) < 50, calls  # (not counting the HGETs, pipelined per batch: scripts HGET too)
    assert r.llen(qkey("fq", "failed")) == 0
    assert r.llen(qkey("fq", "pending")) == 3_000
    assert orjson.loads(r.lindex(qkey("fq", "pending"), -1))["jid"] == "f0"  # retried first, claimed first
    assert orjson.loads(r.lindex(qkey("fq", "pending"), -2))["jid"] == "f1"  # then the oldest of the rest
    assert r.hget(qkey("fq", "job:f5"), "state") == "pending"
    assert stats(r, "fq")["revived"] == 3_000
    assert fk(redis_url, "failed", "fq").stdout.strip() == "no failed tasks kept in fq"


def test_retry_all_leaves_a_failure_whose_jid_lives_again_alone(redis_url: str, r: redis.Redis) -> None:
    _failed(r, "again", 3)
    r.hset(qkey("again", "job:f1"), "state", "pending")  # f1 was enqueued anew under its jid
    assert ok_json(fk(redis_url, "failed", "again", "--retry-all", "--json")) == {
        "queue": "again",
        "retried": 2,
    }
    assert sorted(orjson.loads(e)["jid"] for e in r.lrange(qkey("again", "pending"), 0, -1)) == ["f0", "f2"]
    assert r.llen(qkey("again", "failed")) == 0  # its stale index entry is dropped


def test_names_and_reasons_print_as_text_never_as_markup(redis_url: str, r: redis.Redis) -> None:
    queue = "[/x]q"  # a closing tag with no opening one: a crash if it were read as Rich markup
    r.hset(qkey(queue, "dead"), mapping={"d1": b"[bold]x", "d1:why": json.dumps({"reason": "[/bad] [red]r"})})
    r.zadd(qkey(queue, "dead:index"), {"d1": 1})
    r.sadd("fencekit:{registry}:queues", queue)
    done = fk(redis_url, "dead-letters", queue)
    assert done.returncode == 0, done.stderr
    assert f"{queue}: newest 1 of 1" in done.stdout
    assert "[/bad] [red]r" in done.stdout
    assert "[bold]x" in done.stdout
    assert f" {queue} " in fk(redis_url, "queues").stdout
