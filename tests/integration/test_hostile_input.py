"""Hostile input (issue 6, item 4; I6, I7 of docs/design.md).

- ``fencekit.jobs.codec.decode`` fuzzed with hypothesis: it raises nothing but
  ``PayloadError``, whatever the bytes.
- Raw bytes pushed straight into a queue's pending list (garbage, huge, deeply
  nested JSON, wrong types, invalid UTF-8, valid JSON with wrong field types)
  while a real consumer runs: nothing crashes, every bad task ends as a dead
  letter with its reason, and the counters add up.
- ``Client(max_payload=...)`` refuses an oversize task with a clear ``PayloadError``.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.fault_helpers import PoolRunner, write_app
from tests.queue_helpers import eventually, inflight_count, new_server, qkey, running, stats

from fencekit import Client, PayloadError, Task
from fencekit.errors import ConfigError
from fencekit.jobs.codec import Envelope, decode, encode
from fencekit.testing import RedisServer, wait_until

# -- the codec -------------------------------------------------------------------------

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = ("jid", "queue", "operation", "params", "attempt", "enqueued_at")


def _decode_only_payload_errors(raw: bytes | str) -> None:
    try:
        env = decode(raw)
    except PayloadError as exc:
        reason = str(exc)
        assert reason  # a reason, never an empty message
        return
    assert isinstance(env, Envelope)
    assert isinstance(env.params, dict)
    assert isinstance(env.jid, str)
    assert env.jid
    assert type(env.attempt) is int
    assert env.attempt >= 0
    # what decode accepts, the consumer can encode again (next attempt, dead letter)
    env.next_attempt(env.attempt + 1)


@settings(max_examples=400)
@given(st.binary(max_size=2048))
def test_decode_of_any_bytes_raises_only_payload_error(raw: bytes) -> None:
    _decode_only_payload_errors(raw)


@settings(max_examples=300)
@given(st.text(max_size=512))
def test_decode_of_any_text_raises_only_payload_error(raw: str) -> None:
    _decode_only_payload_errors(raw)


@settings(max_examples=400)
@given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), json_values, max_size=8))
def test_decode_of_envelope_shaped_objects_with_any_field_types(obj: dict[str, Any]) -> None:
    _decode_only_payload_errors(json.dumps(obj).encode())


@settings(max_examples=200)
@given(json_values, st.integers(min_value=0, max_value=2**40))
def test_a_valid_envelope_round_trips(params: Any, attempt: int) -> None:
    params = {"p": params}
    raw = encode("j1", "q", "op", params, attempt, 1)
    env = decode(raw)
    assert (env.params, env.attempt) == (orjson.loads(orjson.dumps(params)), attempt)


@pytest.mark.parametrize("depth", [100, 300, 1000, 5000, 200_000])
def test_decode_of_deeply_nested_json_is_a_payload_error_or_a_value(depth: int) -> None:
    nested = b'{"jid":"j","queue":"q","operation":"o","params":{"x":' + b"[" * depth + b"]" * depth + b"}}"
    _decode_only_payload_errors(nested)


def test_enqueue_of_an_int_beyond_64_bits_is_a_payload_error() -> None:
    """src bug: check_params lets 2**64 through and orjson then raises TypeError."""
    with pytest.raises(PayloadError):
        Task("fuzz", "ok", {"x": 2**64}).envelope()


class AlwaysFails:
    queue = "deep"
    operation = "ok"
    retry_count = 1

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        raise RuntimeError("fails on purpose")


async def test_a_deeply_nested_task_that_fails_is_retried_or_dead_lettered_without_a_crash(
    redis_url: str,
) -> None:
    """src bug: decode accepts 300-deep params, the retry re-encodes them and orjson
    raises TypeError (recursion limit) inside the consumer."""
    r = redis.Redis.from_url(redis_url)
    server = new_server(redis_url, AlwaysFails)
    deep = b'{"jid":"deep","queue":"deep","operation":"ok","params":{"x":' + b"[" * 300 + b"]" * 300 + b"}}"
    try:
        async with running(server) as serving:
            r.lpush(qkey("deep", "pending"), deep)
            r.lpush(qkey("deep", "wake"), "1")
            await eventually(
                lambda: stats(r, "deep")["failed"] == 1, timeout=10, what="the deep task failed for good"
            )
            assert not serving.done()
            assert inflight_count(r, "deep") == 0
    finally:
        r.close()


def test_decode_of_a_huge_payload_does_not_crash() -> None:
    _decode_only_payload_errors(b'{"jid":"' + b"a" * (8 << 20) + b'"}')
    _decode_only_payload_errors(b"\xff" * (4 << 20))


# -- bad entries pushed straight into a queue -----------------------------------------------


def _good(n: int) -> bytes:
    return encode(f"good-{n}", "fuzz", "ok", {"n": n}, 0, 1)


BAD: dict[str, bytes] = {
    "garbage": b"\x00\x01garbage\xfe",
    "empty": b"",
    "invalid utf-8": b'{"jid":"\xff\xfe","queue":"fuzz","operation":"ok","params":{}}',
    "not an object": b"[1, 2, 3]",
    "a string": b'"hello"',
    "a number": b"42",
    "null": b"null",
    "deeply nested": b'{"jid":"d","queue":"fuzz","operation":"ok","params":'
    + b"[" * 100_000
    + b"]" * 100_000
    + b"}",
    "nested just under orjson's limit": (
        b'{"jid":"n","queue":"fuzz","operation":"ok","params":{"x":' + b"[" * 1000 + b"]" * 1000 + b"}}"
    ),
    "huge": b'{"jid":"h","queue":"fuzz","operation":"ok","params":{"x":"' + b"x" * (3 << 20) + b'"}',
    "jid is a number": b'{"jid":1,"queue":"fuzz","operation":"ok","params":{}}',
    "params is a list": b'{"jid":"p","queue":"fuzz","operation":"ok","params":[]}',
    "attempt negative": b'{"jid":"a","queue":"fuzz","operation":"ok","params":{},"attempt":-1}',
    "attempt a string": b'{"jid":"s","queue":"fuzz","operation":"ok","params":{},"attempt":"0"}',
    "attempt a float": b'{"jid":"f","queue":"fuzz","operation":"ok","params":{},"attempt":1.5}',
    "enqueued_at a string": b'{"jid":"e","queue":"fuzz","operation":"ok","params":{},"enqueued_at":"x"}',
    "missing params": b'{"jid":"m","queue":"fuzz","operation":"ok"}',
    "operation empty": b'{"jid":"o","queue":"fuzz","operation":"","params":{}}',
    "unknown operation": b'{"jid":"u","queue":"fuzz","operation":"rm -rf /","params":{}}',
    "python pickle": b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00\x8c\x07os.exit\x94.",
    "NaN literal": b'{"jid":"nan","queue":"fuzz","operation":"ok","params":{"x":NaN}}',
    "duplicate keys": b'{"jid":"dup","queue":"fuzz","operation":"ok","params":{},"params":7}',
}
# Valid JSON whose params nest deeper than enqueue allows (64 levels) is refused at decode
# too: a retry could not encode it again. So every entry above becomes a dead letter.
RUNS_ANYWAY: set[str] = set()


class Ok:
    queue = "fuzz"
    operation = "ok"
    seen: list[Any] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        cls.seen.append(payload)


async def test_bad_entries_in_a_queue_become_dead_letters_with_reasons(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    Ok.seen = []
    server = new_server(redis_url, Ok, concurrency=4)
    try:
        async with Client(redis_url) as client, running(server) as serving:
            await client.enqueue_many(Task("fuzz", "ok", {"n": i}) for i in range(5))
            for raw in BAD.values():
                r.lpush(qkey("fuzz", "pending"), raw)
            r.lpush(qkey("fuzz", "pending"), *[_good(i) for i in range(5)])
            r.lpush(qkey("fuzz", "wake"), "1")
            await eventually(
                lambda: r.llen(qkey("fuzz", "pending")) == 0 and inflight_count(r, "fuzz") == 0,
                timeout=20,
                what="queue drained",
            )
            settled = 10 + len(BAD)  # every task pushed, good or bad, processed or failed once
            await eventually(
                lambda: sum(stats(r, "fuzz")[k] for k in ("processed", "failed")) == settled, what="settled"
            )
            assert not serving.done()
            letters = await client.queue("fuzz").dead_letters(limit=100)
        s = stats(r, "fuzz")
    finally:
        r.close()
    bad = len(BAD) - len(RUNS_ANYWAY)
    assert len(letters) == bad, [(x.reason, x.raw[:40]) for x in letters]
    assert all(x.reason for x in letters)
    reasons = " | ".join(x.reason for x in letters)
    assert "malformed payload" in reasons
    assert "no worker registered for operation 'rm -rf /'" in reasons
    stored = {x.raw for x in letters}
    for name, raw in BAD.items():
        if name not in RUNS_ANYWAY:
            assert raw in stored, f"{name} was not kept as it came"
    # I6: counters add up. Only the 5 Client tasks were enqueued through the API.
    assert s["enqueued"] == 5
    assert s["processed"] == 5 + 5 + len(RUNS_ANYWAY)
    assert s["failed"] == bad
    assert s["dead"] == bad
    assert len(Ok.seen) == s["processed"]
    assert not [m for m in server.logger.list_handler.messages() if "Traceback" in m]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def fuzz_pool(
    tmp_path_factory: pytest.TempPathFactory, server_binary: str
) -> Iterator[tuple[RedisServer, PoolRunner]]:
    directory = tmp_path_factory.mktemp("fuzzpool")
    server = RedisServer(directory / "redis", binary=server_binary)
    server.start()
    write_app(directory)
    pool = PoolRunner(directory, server.url(), "--procs", "1", "--concurrency", "4")
    try:
        pool.wait_ready()
        yield server, pool
    finally:
        code = pool.stop()
        server.cleanup()
    out = pool.output()
    assert code == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert out.count("started child") == 1, "a child died on hostile input"


def _work_stats(r: redis.Redis) -> dict[str, int]:
    return stats(r, "work")


@settings(
    max_examples=15,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.text(alphabet=string.printable, max_size=200).map(str.encode),
            st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6).map(
                lambda d: json.dumps(d).encode()
            ),
            json_values.map(lambda v: json.dumps(v).encode()),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_fuzzed_raw_entries_pushed_into_a_pool_queue(
    fuzz_pool: tuple[RedisServer, PoolRunner], entries: list[bytes]
) -> None:
    server, pool = fuzz_pool
    with server.client() as r:
        before = _work_stats(r)
        dead_before = r.zcard(qkey("work", "dead:index"))
        r.lpush(qkey("work", "pending"), *entries)
        r.lpush(qkey("work", "wake"), "1")
        wait_until(
            lambda: r.llen(qkey("work", "pending")) == 0 and inflight_count(r, "work") == 0,
            20,
            interval=0.02,
            what="fuzzed entries consumed",
        )
        after = _work_stats(r)
        dead_after = r.zcard(qkey("work", "dead:index"))
    assert pool.proc.poll() is None
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("processed", "failed", "dead", "retried")}
    valid_runnable = 0
    for raw in entries:
        try:
            env = decode(raw)
        except PayloadError:
            continue
        if env.operation == "do" and env.queue == "work":
            valid_runnable += 1
    # Every entry ends exactly once: run, or failed (dead-lettered with a reason).
    assert delta["processed"] + delta["failed"] == len(entries) - valid_runnable + valid_runnable, delta
    assert delta["failed"] == delta["dead"] == dead_after - dead_before
    assert delta["processed"] >= valid_runnable - delta["retried"]


# -- the producer side ------------------------------------------------------------------------


async def test_client_max_payload_refuses_oversize_tasks_clearly(redis_url: str) -> None:
    async with Client(redis_url, max_payload=1024) as client:
        jid = await client.enqueue(Task("fuzz", "ok", {"x": "a" * 500}))
        assert jid
        with pytest.raises(PayloadError, match=r"bytes encoded, above max_payload=1024"):
            await client.enqueue(Task("fuzz", "ok", {"x": "a" * 2000}))
        with pytest.raises(PayloadError, match="above max_payload"):
            await client.enqueue_many([Task("fuzz", "ok", {}), Task("fuzz", "ok", {"x": "b" * 5000})])
        assert await client.queue("fuzz").length() == 1  # all-or-nothing: nothing of the batch was sent
    with pytest.raises(ConfigError, match="max_payload"):
        Client(redis_url, max_payload=10)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"x": float("nan")}, "not valid JSON"),
        ({"x": b"bytes"}, "bytes is not JSON"),
        ({1: "int key"}, "keys must be str"),
        ({"x": {1, 2}}, "set is not JSON"),
        (_deep := {"x": None}, None),
    ],
)
async def test_enqueue_refuses_params_that_are_not_plain_json(
    redis_url: str, params: dict[Any, Any], match: str | None
) -> None:
    async with Client(redis_url) as client:
        if match is None:
            deep: Any = "leaf"
            for _ in range(100):
                deep = [deep]
            with pytest.raises(PayloadError, match="nested deeper"):
                await client.enqueue(Task("fuzz", "ok", {"x": deep}))
        else:
            with pytest.raises(PayloadError, match=match):
                await client.enqueue(Task("fuzz", "ok", params))
        assert await client.queue("fuzz").length() == 0


def test_hostile_helpers_are_importable(tmp_path: Path) -> None:
    assert write_app(tmp_path).is_dir()
