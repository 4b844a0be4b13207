"""The pure parts of the job queue: envelope codec, Task, worker validation,
retry policy, URL parsing, and the static side of I5 (one hash tag per script call)."""

from __future__ import annotations

import datetime
import inspect
import math
import re
import sys
import time
import uuid
from typing import Any

import orjson
import pytest

from fencekit import ConfigError, PayloadError, RetryPolicy, Server, Task
from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace, job_resource
from fencekit._redis.url import parse_url
from fencekit.jobs.codec import decode, encode
from fencekit.jobs.worker import WorkerRegistry, inspect_worker

# -- codec --------------------------------------------------------------------------------


def test_an_envelope_round_trips_through_the_codec() -> None:
    raw = encode("j1", "emails", "send", {"to": "a@b", "n": [1, 2.5, None, True]}, 2, 1234)
    env = decode(raw)
    assert (env.jid, env.queue, env.operation, env.attempt, env.enqueued_at) == (
        "j1",
        "emails",
        "send",
        2,
        1234,
    )
    assert env.params == {"to": "a@b", "n": [1, 2.5, None, True]}
    assert decode(env.encode()) == env
    assert orjson.loads(env.next_attempt(3))["attempt"] == 3


def test_an_envelope_without_timeout_or_expiry_is_encoded_as_before() -> None:
    raw = encode("j1", "q", "op", {}, 0, 5)
    assert list(orjson.loads(raw)) == ["jid", "queue", "operation", "params", "attempt", "enqueued_at"]
    env = decode(raw)
    assert (env.timeout, env.expires_at) == (None, None)


def test_timeout_and_expiry_round_trip_and_survive_a_retry() -> None:
    env = decode(encode("j1", "q", "op", {}, 0, 5, timeout=2.5, expires_at=99))
    assert (env.timeout, env.expires_at) == (2.5, 99)
    again = decode(env.next_attempt(1))
    assert (again.attempt, again.timeout, again.expires_at) == (1, 2.5, 99)


def test_a_trace_context_round_trips_and_survives_a_retry() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    env = decode(encode("j1", "q", "op", {}, 0, 5, trace=parent))
    assert env.trace == parent
    assert decode(env.next_attempt(1)).trace == parent
    assert decode(Task("q", "op").envelope(trace=parent)).trace == parent
    assert decode(encode("j1", "q", "op", {}, 0, 5)).trace is None


def test_a_task_s_timeout_and_expiry_reach_its_envelope() -> None:
    before = time.time_ns() // 1_000_000
    env = decode(
        Task(
            "q", "op", timeout=datetime.timedelta(seconds=3), expires=datetime.timedelta(seconds=10)
        ).envelope()
    )
    after = time.time_ns() // 1_000_000
    assert env.timeout == 3.0
    assert env.expires_at is not None
    assert before + 10_000 <= env.expires_at <= after + 10_000
    at = datetime.datetime(2031, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)
    assert decode(Task("q", "op", expires=at).envelope()).expires_at == round(at.timestamp() * 1000)
    back = Task.from_envelope(decode(Task("q", "op", timeout=1, expires=at).envelope()))
    assert (back.timeout, back.expires) == (1.0, at)


GOOD = {"jid": "j", "queue": "q", "operation": "op", "params": {}, "attempt": 0, "enqueued_at": 0}


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'"a string"', "JSON object"),
        (orjson.dumps({k: v for k, v in GOOD.items() if k != "jid"}), "'jid'"),
        (orjson.dumps({k: v for k, v in GOOD.items() if k != "operation"}), "'operation'"),
        (orjson.dumps({k: v for k, v in GOOD.items() if k != "params"}), "'params'"),
        (orjson.dumps(GOOD | {"jid": 5}), "jid"),
        (orjson.dumps(GOOD | {"jid": ""}), "jid"),
        (orjson.dumps(GOOD | {"queue": None}), "queue"),
        (orjson.dumps(GOOD | {"operation": ["x"]}), "operation"),
        (orjson.dumps(GOOD | {"params": [1]}), "params"),
        (orjson.dumps(GOOD | {"params": None}), "params"),
        (orjson.dumps(GOOD | {"attempt": -1}), "attempt"),
        (orjson.dumps(GOOD | {"attempt": "1"}), "attempt"),
        (orjson.dumps(GOOD | {"attempt": True}), "attempt"),
        (orjson.dumps(GOOD | {"attempt": 1.0}), "attempt"),
        (orjson.dumps(GOOD | {"enqueued_at": "now"}), "enqueued_at"),
        (orjson.dumps(GOOD | {"timeout": 0}), "timeout"),
        (orjson.dumps(GOOD | {"timeout": -1.5}), "timeout"),
        (orjson.dumps(GOOD | {"timeout": "5"}), "timeout"),
        (orjson.dumps(GOOD | {"timeout": True}), "timeout"),
        (orjson.dumps(GOOD | {"expires_at": 1.5}), "expires_at"),
        (orjson.dumps(GOOD | {"expires_at": "tomorrow"}), "expires_at"),
        (orjson.dumps(GOOD | {"trace": 5}), "'trace'"),
        (orjson.dumps(GOOD | {"trace": ""}), "'trace'"),
        (orjson.dumps(GOOD | {"trace": "x" * 513}), "'trace'"),
    ],
)
def test_decoding_a_bad_envelope_raises_payload_error_naming_what_is_wrong(raw: bytes, words: str) -> None:
    with pytest.raises(PayloadError, match=re.escape(words)):
        decode(raw)


@pytest.mark.parametrize("absent", ["attempt", "enqueued_at"])
def test_an_optional_field_is_kept_when_a_defaulted_field_is_absent(absent: str) -> None:
    # Six fields, one of them optional: the count of fields alone would call it a plain envelope.
    fields = {k: v for k, v in GOOD.items() if k != absent}
    env = decode(orjson.dumps(fields | {"timeout": 2.5}))
    assert env.timeout == 2.5
    env = decode(orjson.dumps(fields | {"keep": 7000}))
    assert (env.keep, env.timeout, env.expires_at) == (7000, None, None)


def test_an_envelope_whose_only_optional_field_is_keep_decodes_it_and_checks_it() -> None:
    env = decode(orjson.dumps(GOOD | {"keep": 3_600_000}))
    assert (env.keep, env.timeout, env.expires_at, env.trace) == (3_600_000, None, None, None)
    assert decode(env.encode()) == env
    for bad in (0, -5, 1.5, "3600", True):
        with pytest.raises(PayloadError, match="'keep'"):
            decode(orjson.dumps(GOOD | {"keep": bad}))


# -- Task ---------------------------------------------------------------------------------


def test_a_task_without_jid_gets_a_uuid7_at_enqueue() -> None:
    task = Task(queue="emails", operation="send_email", params={"to": "user@example.com"})
    assert task.jid is None
    assert task.attempt == 0
    env = orjson.loads(task.envelope())
    assert env["jid"] == task.jid
    parsed = uuid.UUID(task.jid)
    assert parsed.version == 7
    # The first 48 bits are the Unix time in ms.
    assert abs((parsed.int >> 80) - time.time() * 1000) < 5_000


def test_generated_jids_are_time_sortable() -> None:
    jids = []
    for i in range(300):
        task = Task(queue="q", operation="op")
        task.envelope()
        jids.append(task.jid)
        if i % 100 == 0:
            time.sleep(0.002)
    assert sorted(jids) == jids
    assert len(set(jids)) == len(jids)


def test_an_explicit_jid_is_kept() -> None:
    task = Task("q", "op", {}, jid="my-jid")
    assert orjson.loads(task.envelope())["jid"] == "my-jid"


@pytest.mark.parametrize(
    "task",
    [
        Task("", "op"),
        Task("has space", "op"),
        Task("brace{", "op"),
        Task("q", ""),
        Task("q", "op", params=[1]),  # type: ignore[arg-type]
        Task("q", "op", attempt=-1),
        Task("q", "op", attempt=True),
        Task("q", "op", jid=""),
        Task("q", "op", params={"when": datetime.datetime(2024, 1, 1)}),
        Task("q", "op", params={"x": math.nan}),
        Task("q", "op", params={"x": math.inf}),
        Task("q", "op", params={"x": {1, 2}}),
        Task("q", "op", params={"x": b"bytes"}),
        Task("q", "op", params={1: "int key"}),  # type: ignore[dict-item]
    ],
    ids=repr,
)
def test_an_invalid_task_is_refused_before_anything_is_sent(task: Task) -> None:
    with pytest.raises((PayloadError, ConfigError)):
        task.envelope()


def test_a_task_above_max_payload_is_refused() -> None:
    with pytest.raises(PayloadError, match="max_payload"):
        Task("q", "op", {"blob": "x" * 2000}).envelope(max_payload=1000)


def test_deeply_nested_params_are_refused() -> None:
    params: dict[str, Any] = {}
    node = params
    for _ in range(100):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(PayloadError, match="deeper"):
        Task("q", "op", params).envelope()


# -- retry policy -------------------------------------------------------------------------


@pytest.mark.parametrize(("attempt", "seconds"), [(0, 1.0), (1, 1.5), (2, 2.25), (5, 1.5**5)])
def test_the_retry_delay_is_one_second_times_one_point_five_to_the_attempt(
    attempt: int, seconds: float
) -> None:
    assert RetryPolicy().delay(attempt) == pytest.approx(seconds)


def test_a_task_runs_at_most_one_plus_retry_count_times() -> None:
    for retry_count in range(4):
        policy = RetryPolicy(True, retry_count)
        runs, attempt = 1, 0
        while (following := policy.next_attempt(attempt)) is not None:
            assert following == attempt + 1
            attempt = following
            runs += 1
        assert runs == 1 + retry_count


def test_retry_false_ignores_retry_count() -> None:
    assert RetryPolicy(False, 5).next_attempt(0) is None
    assert RetryPolicy().retry is True
    assert RetryPolicy().retry_count == 1


# -- worker validation -------------------------------------------------------------------


def make_worker(**attrs: Any) -> type:
    async def perform(cls: type, payload: dict[str, Any]) -> None:
        return None

    namespace: dict[str, Any] = {"queue": "emails", "operation": "send", "perform": classmethod(perform)}
    namespace.update(attrs)
    namespace = {k: v for k, v in namespace.items() if v is not _MISSING}
    return type("BadWorker", (), namespace)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


@pytest.mark.parametrize(
    ("attrs", "attribute"),
    [
        ({"retry": 1}, "retry"),
        ({"retry": "yes"}, "retry"),
        ({"retry": None}, "retry"),
        ({"retry_count": 1.0}, "retry_count"),
        ({"retry_count": "3"}, "retry_count"),
        ({"retry_count": -1}, "retry_count"),
        ({"retry_count": True}, "retry_count"),
        ({"retry_count": None}, "retry_count"),
        ({"queue": _MISSING}, "queue"),
        ({"queue": ""}, "queue"),
        ({"queue": 5}, "queue"),
        ({"queue": "two words"}, "queue"),
        ({"operation": _MISSING}, "operation"),
        ({"operation": ""}, "operation"),
        ({"perform": _MISSING}, "perform"),
        ({"perform": "not callable"}, "perform"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, dict) else ",".join(f"{k}={v[k]!r}"[:40] for k in v),
)
def test_add_workers_rejects_bad_settings_naming_worker_and_attribute(
    attrs: dict[str, Any], attribute: str
) -> None:
    server = Server(redis_url="redis://127.0.0.1:1/0", web_port=0)
    worker = make_worker(**attrs)
    with pytest.raises(ConfigError) as info:
        server.add_workers(worker)
    message = str(info.value)
    assert message.startswith(f"worker BadWorker: attribute {attribute!r}"), message
    assert len(server.registry) == 0


def test_a_sync_perform_on_an_instance_is_accepted_and_runs_in_the_consumers_threads() -> None:
    class SyncWorker:
        queue = "q"
        operation = "op"

        def perform(self, payload: dict[str, Any]) -> None:
            return None

    registry = WorkerRegistry()
    registry.add([SyncWorker()])
    spec = registry.get("q", "op")
    assert spec is not None
    assert spec.call is not None
    assert spec.call.sync


def test_a_class_whose_perform_is_an_unbound_instance_method_is_rejected() -> None:
    """Registered as a class, ``perform(self, payload)`` would get the payload as ``self``
    and fail every task at run time; add_workers should say so up front."""

    class NeedsInstance:
        queue = "q"
        operation = "op"

        async def perform(self, payload: dict[str, Any]) -> None:
            return None

    with pytest.raises(ConfigError, match=r"NeedsInstance.*perform"):
        WorkerRegistry().add([NeedsInstance])
    WorkerRegistry().add([NeedsInstance()])  # the instance form is fine


def test_a_bad_worker_in_a_batch_registers_none_of_them() -> None:
    registry = WorkerRegistry()
    good = make_worker(operation="good")
    with pytest.raises(ConfigError):
        registry.add([good, make_worker(retry="no")])
    assert len(registry) == 0
    assert registry.get("emails", "good") is None


def test_the_same_operation_on_different_queues_resolves_to_each_worker() -> None:
    emails = make_worker(queue="emails", operation="send")
    sms = make_worker(queue="sms", operation="send", retry=False)
    registry = WorkerRegistry()
    registry.add([emails, sms])
    assert registry.get("emails", "send").source is emails  # type: ignore[union-attr]
    assert registry.get("sms", "send").source is sms  # type: ignore[union-attr]
    assert registry.policy("sms", "send") == RetryPolicy(False, 1)
    assert registry.policy("emails", "send") == RetryPolicy(True, 1)
    assert registry.queues == ["emails", "sms"]


def test_two_workers_for_one_queue_and_operation_are_refused() -> None:
    with pytest.raises(ConfigError, match="already"):
        WorkerRegistry().add([make_worker(), make_worker()])


def test_the_default_policy_applies_to_an_unknown_worker() -> None:
    assert WorkerRegistry().policy("q", "nobody") == RetryPolicy(True, 1)


def test_worker_instances_and_classes_are_both_accepted() -> None:
    class SendEmailWorker:
        queue = "emails"
        operation = "send_email"

        @classmethod
        async def perform(cls, payload: dict[str, Any]) -> None:
            return None

    class Stateful:
        queue = "emails"
        operation = "stateful"
        retry_count = 5

        def __init__(self) -> None:
            self.seen: list[dict[str, Any]] = []

        async def perform(self, payload: dict[str, Any]) -> None:
            self.seen.append(payload)

    instance = Stateful()
    assert inspect_worker(SendEmailWorker).policy == RetryPolicy(True, 1)
    spec = inspect_worker(instance)
    assert spec.policy == RetryPolicy(True, 5)
    assert spec.perform.__self__ is instance  # type: ignore[attr-defined]


# -- URL parsing --------------------------------------------------------------------------


def test_a_sentinel_url_parses_as_the_seed_grammar_says() -> None:
    t = parse_url("redis+sentinel://sentinel-0:26379,sentinel-1:26380,sentinel-2/mymaster")
    assert t.is_sentinel
    assert t.sentinels == (("sentinel-0", 26379), ("sentinel-1", 26380), ("sentinel-2", 26379))
    assert t.master_name == "mymaster"
    assert t.db == 0
    assert t.socket_timeout == 5
    assert t.socket_connect_timeout == 2
    assert t.username is None
    assert t.password is None


def test_sentinel_credentials_come_from_the_query_and_master_ones_from_the_url() -> None:
    t = parse_url(
        "redis+sentinel://alice:s3cret@h1:1,h2:2/m?db=3&sentinel_username=sent&sentinel_password=sp"
        "&socket_timeout=0.5&socket_connect_timeout=0.25"
    )
    assert (t.username, t.password) == ("alice", "s3cret")
    assert (t.sentinel_username, t.sentinel_password) == ("sent", "sp")
    assert t.db == 3
    assert t.socket_timeout == 0.5
    assert t.socket_connect_timeout == 0.25
    assert "s3cret" not in t.redacted()
    assert "s3cret" not in repr(t)
    kwargs = t.connection_kwargs()
    assert kwargs["password"] == "s3cret"
    assert kwargs["db"] == 3


def test_a_password_only_sentinel_url_authenticates_the_master() -> None:
    t = parse_url("redis+sentinel://:pw@h/m")
    assert t.username is None
    assert t.password == "pw"


def test_plain_urls_keep_no_timeout_by_default() -> None:
    t = parse_url("redis://localhost:6379")
    assert (t.host, t.port, t.db) == ("localhost", 6379, 0)
    assert t.socket_timeout is None
    assert t.socket_connect_timeout is None
    assert parse_url("redis://h/4").db == 4
    assert parse_url("redis://h?socket_timeout=0.2").socket_timeout == 0.2


def test_unix_and_rediss_urls_parse() -> None:
    u = parse_url("unix:///tmp/redis.sock?db=2")
    assert u.path == "/tmp/redis.sock"
    assert u.db == 2
    s = parse_url("rediss://:pw@host:6380/1?ssl_cert_reqs=none")
    assert s.tls
    assert s.port == 6380
    assert s.db == 1
    assert s.password == "pw"
    assert s.tls is not None
    assert s.tls.cert_reqs == "none"


@pytest.mark.parametrize(
    ("word", "checks"),
    [("yes", True), ("1", True), ("TRUE", True), ("on", True), ("no", False), ("0", False), ("false", False)],
)
def test_one_url_gives_one_tls_configuration_to_both_kinds_of_connection(word: str, checks: bool) -> None:
    """``ssl_check_hostname=yes`` once meant False for redis-py and True for the hot path."""
    target = parse_url(f"rediss://redis.example:6380/0?ssl_check_hostname={word}")
    assert target.tls is not None
    assert target.tls.check_hostname is checks
    assert target.connection_kwargs()["ssl_check_hostname"] is checks
    assert target.tls.context(target.redacted()).check_hostname is checks


def test_tls_options_are_checked_when_the_url_is_parsed() -> None:
    with pytest.raises(ConfigError, match="ssl_check_hostname must be true or false"):
        parse_url("rediss://h/0?ssl_check_hostname=maybe")
    with pytest.raises(ConfigError, match="ssl_cert_reqs must be none, optional or required"):
        parse_url("rediss://h/0?ssl_cert_reqs=sometimes")
    relaxed = parse_url("rediss://h/0?ssl_cert_reqs=none")
    assert relaxed.tls is not None
    assert relaxed.tls.verifies_hostname is False  # no certificate check, so no host-name check either
    assert relaxed.connection_kwargs()["ssl_check_hostname"] is False


def test_building_clients_emits_no_deprecation_warning() -> None:
    """redis-py >= 6 deprecates ``retry_on_timeout``; under ``filterwarnings=error``
    every ``Client(...)``/``Server(...)`` then fails (store.py passes it)."""
    import warnings

    from fencekit import Client
    from fencekit._redis.clients import async_client, sync_client

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sync_client("redis://127.0.0.1:1/0").close()
        async_client("redis://127.0.0.1:1/0")
        Client(redis_url="redis://127.0.0.1:1/0")
        Server(redis_url="redis://127.0.0.1:1/0", web_port=0)


def test_every_client_built_from_a_url_has_retries_off() -> None:
    kwargs = parse_url("redis://h").connection_kwargs()
    assert kwargs["retry"].get_retries() == 0
    assert not kwargs.get("retry_on_timeout")


@pytest.mark.parametrize(
    "url",
    [
        "localhost:6379",
        "http://localhost",
        "redis+sentinel:///mymaster",
        "redis+sentinel://h1,h2/",
        "redis://h?bogus=1",
        "redis://h?sentinel_password=x",
        "redis://h?ssl_cert_reqs=none",
        "redis://h?db=x",
        "redis://h/1?db=2",
        "redis://h:99999",
        "redis://h?socket_timeout=-1",
        "redis://h?socket_timeout=abc",
        "unix://relative.sock",
    ],
)
def test_a_bad_url_raises_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        parse_url(url)


# -- I5, statically: every script call keeps its keys under one hash tag --------------------


def hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes (the first non-empty ``{...}``, else the key)."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def every_call(keys: KeySpace, queue: str) -> dict[str, scripts.Call]:
    qk = keys.queue(queue)
    inflight = qk.inflight("host:1:server:abc")
    job_fence = keys.fence(job_resource(queue, "jid-1"))
    bk = keys.batch(f"batch-of-{queue}")
    return {
        "batch_open": scripts.batch_open(
            meta=bk.meta, children=bk.children, callbacks=b"{}", armed=True, parent="", jids=["j1", "j2"]
        ),
        "batch_add": scripts.batch_add(meta=bk.meta, children=bk.children, jids=["j3"]),
        "batch_arm": scripts.batch_arm(meta=bk.meta),
        "batch_note": scripts.batch_note(meta=bk.meta, children=bk.children, notes=[("j1", "s")]),
        "batch_done": scripts.batch_done(meta=bk.meta, children=bk.children, keep_ms=1000),
        "checkpoint": scripts.checkpoint(
            inflight=inflight,
            fence=job_fence,
            state=qk.state("jid-1"),
            stats=qk.stats,
            token=2,
            value=b"{}",
            ttl_ms=1000,
            record=qk.job("jid-1"),
            progress=b"{}",
        ),
        "dep_wait": scripts.dep_wait(
            waiting=qk.waiting(),
            stats=qk.stats,
            record=qk.job("j1"),
            jid="j1",
            entry=b"{}",
            envelope=b"{}",
            keep_ms=1000,
        ),
        "dep_release": scripts.dep_release(
            waiting=qk.waiting(),
            pending=qk.pending,
            wake=qk.wake,
            record=qk.job("j1"),
            jid="j1",
            envelope=b"{}",
        ),
        "dep_cancel": scripts.dep_cancel(
            waiting=qk.waiting(),
            stats=qk.stats,
            record=qk.job("j1"),
            finished=qk.finished,
            jid="j1",
            reason=b"{}",
            keep_finished=10,
            done=qk.done_channel,
        ),
        "enqueue": scripts.enqueue(
            pending=qk.pending,
            scheduled=qk.scheduled,
            stats=qk.stats,
            wake=qk.wake,
            delay_ms=0,
            envelopes=[b"{}"],
        ),
        "enqueue_tracked": scripts.enqueue_tracked(
            pending=qk.pending,
            scheduled=qk.scheduled,
            stats=qk.stats,
            wake=qk.wake,
            delay_ms=0,
            keep_ms=1000,
            envelopes=[b"{}"],
            records=[qk.job("j")],
        ),
        "outbox_forget": scripts.outbox_forget(markers=[qk.relayed("j")]),
        "outbox_push": scripts.outbox_push(
            pending=qk.pending,
            scheduled=qk.scheduled,
            stats=qk.stats,
            wake=qk.wake,
            marker_ms=1000,
            tasks=[(qk.job("j"), qk.relayed("j"), 0, 1000, b"{}")],
        ),
        "enqueue_debounce": scripts.enqueue_debounce(
            scheduled=qk.scheduled,
            stats=qk.stats,
            record=qk.job("j"),
            debounce=qk.debounce("doc-1"),
            window_ms=2000,
            max_ms=0,
            envelope=b"{}",
            jid="j",
            record_prefix=qk.job(""),
            keep_ms=1000,
        ),
        "enqueue_unique": scripts.enqueue_unique(
            pending=qk.pending,
            scheduled=qk.scheduled,
            stats=qk.stats,
            wake=qk.wake,
            record=qk.job("j"),
            unique=qk.unique("order-42"),
            delay_ms=0,
            keep_ms=1000,
            envelope=b"{}",
            jid="j",
            record_prefix=qk.job(""),
            unique_for_ms=0,
        ),
        "ack_claim": scripts.ack_claim(
            pending=qk.pending,
            inflight=inflight,
            token_counter=qk.token_counter,
            stats=qk.stats,
            wake=qk.wake,
            want=1,
            acks=[1],
            recorded=[scripts.RecordedAck(qk.job("j"), 2, "j", b"1", 1000, b"")],
            finished=qk.finished,
            channel=qk.done_channel,
            keep_finished=10,
        ),
        "retry": scripts.retry(
            inflight=inflight,
            scheduled=qk.scheduled,
            stats=qk.stats,
            token=1,
            delay_ms=1,
            envelope=b"{}",
            record=qk.job("j"),
            error=b"{}",
        ),
        "requeue": scripts.requeue(
            inflight=inflight,
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            fence=job_fence,
            token=1,
            envelope=b"{}",
            counter="",
            fence_ttl_ms=1000,
            record=qk.job("j"),
        ),
        "fail": scripts.fail(
            inflight=inflight,
            stats=qk.stats,
            dead=qk.dead,
            dead_index=qk.dead_index,
            token=1,
            record=b"",
            dead_id="d",
            keep_dead=10,
            job=scripts.JobRecordKeys(qk.job("j"), qk.finished, qk.failed, qk.done_channel, "j"),
            error=b"{}",
            keep_failed=10,
            keep_finished=10,
        ),
        "drop": scripts.drop(
            inflight=inflight,
            stats=qk.stats,
            token=1,
            counter="expired",
            job=scripts.JobRecordKeys(qk.job("j"), qk.finished, qk.failed, qk.done_channel, "j"),
            keep_finished=10,
        ),
        "job_info": scripts.job_info(record=qk.job("j"), inflight=[inflight, qk.inflight("c2")], jid="j"),
        "cancel": scripts.cancel(
            record=qk.job("j"),
            pending=qk.pending,
            scheduled=qk.scheduled,
            stats=qk.stats,
            finished=qk.finished,
            inflight=[inflight],
            jid="j",
            channel=qk.cancel_channel,
            keep_finished=10,
            done=qk.done_channel,
        ),
        "run_now": scripts.run_now(
            scheduled=qk.scheduled, pending=qk.pending, wake=qk.wake, record=qk.job("j"), jid="j"
        ),
        "job_progress": scripts.job_progress(inflight=inflight, record=qk.job("j"), token=1, progress=b"{}"),
        "failed_retry": scripts.failed_retry(
            failed=qk.failed,
            record=qk.job("j"),
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            envelope=b"{}",
            keep_ms=0,
        ),
        "job_set": scripts.job_set(
            inflight=inflight, fence=job_fence, target=f"{{{queue}}}:result", token=1, value="v"
        ),
        "job_set_many": scripts.job_set_many(
            [
                (inflight, job_fence, f"{{{queue}}}:result", 1, "v"),
                (inflight, job_fence, f"{{{queue}}}:other", 2, "w"),
            ]
        ),
        "schedule": scripts.schedule(scheduled=qk.scheduled, pending=qk.pending, wake=qk.wake, limit=10),
        "pending_read": scripts.pending_read(pending=qk.pending, envelopes=True),
        "purge": scripts.purge(pending=qk.pending, stats=qk.stats, record_prefix=qk.job("")),
        "periodic_enqueue": scripts.periodic_enqueue(
            last=qk.cron_last("beat"),
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            floor_ms=0,
            keep_ms=1000,
            collapse=True,
            ticks=[(1000, b"{}", qk.job("cron:beat:1000")), (2000, b"{}", qk.job("cron:beat:2000"))],
        ),
        "history_sample": scripts.history_sample(
            stats=qk.stats,
            pending=qk.pending,
            last=qk.history_last,
            minutes=qk.history_minutes,
            hours=qk.history_hours,
            now_ms=None,
            back_ms=100,
            minute_tier=(60, 2880),
            hour_tier=(3600, 2160),
            durations="",
        ),
        "dead_revive": scripts.dead_revive(
            dead=qk.dead,
            dead_index=qk.dead_index,
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            dead_id="d",
            envelope=b"",
            record=qk.job("j"),
        ),
        "dead_revive_many": scripts.dead_revive_many(
            dead=qk.dead,
            dead_index=qk.dead_index,
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            letters=[("d1", qk.job("j1")), ("d2", None), ("d3", qk.job("j3"))],
        ),
        "dead_purge": scripts.dead_purge(dead=qk.dead, dead_index=qk.dead_index),
        "failed_retry_many": scripts.failed_retry_many(
            failed=qk.failed,
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            retries=[(qk.job("j1"), b"{}", 0), (qk.job("j2"), b"{}", 1000)],
        ),
        "heartbeat": scripts.heartbeat(
            consumers=keys.consumers,
            beats=keys.beats,
            store=keys.store,
            new_store_id="s",
            entries=[("c", b"{}")],
        ),
        "drain_probe": scripts.drain_probe(
            pending=qk.pending, scheduled=qk.scheduled, stats=qk.stats, inflight=[qk.inflight("c1")]
        ),
        "has_work": scripts.has_work([qk.pending]),
        "backlog": scripts.backlog(pending=qk.pending, scheduled=qk.scheduled),
        "dead_drop": scripts.dead_drop(dead=qk.dead, dead_index=qk.dead_index, dead_id="d1"),
        "record_drop": scripts.record_drop(index=qk.failed, record=qk.job("j")),
        "expired": scripts.expired(beats=keys.beats, ttl_ms=1000, limit=10),
        "forget": scripts.forget(consumers=keys.consumers, beats=keys.beats, consumer_id="c", ttl_ms=0),
        "fence_set": scripts.fence_set(
            fence=job_fence, target=f"{{{queue}}}:result", token=1, value="v", fence_ttl_ms=0
        ),
    }


def is_primitive(name: str) -> bool:
    """Lock / fence / idempotency scripts: their keys come from the caller's resource.

    ``upgrade_move`` too: it moves one old key to our name for it (two slots by nature: the
    upgrade command is not for Cluster), tested by ``test_upgrade_keys.py``.
    """
    return (name.startswith(("lock_", "idem_", "fence_")) and name != "fence_set") or name == "upgrade_move"


def test_every_queue_script_has_a_builder_checked_here() -> None:
    queue_scripts = [n for n in scripts.script_names() if not is_primitive(n)]
    assert sorted(every_call(KeySpace(), "q")) == queue_scripts


@pytest.mark.parametrize("queue", ["emails", "q:with:colons", "a-b_c.d"])
def test_every_script_call_uses_one_hash_tag(queue: str) -> None:
    keys = KeySpace()
    for name, call in every_call(keys, queue).items():
        tags = {hash_tag(k) for k in call.keys}
        assert len(tags) == 1, f"{name} spans hash tags {tags}"
        assert all(k.startswith(("fencekit:", "{")) for k in call.keys), name


def test_queue_keys_follow_the_documented_layout_and_spread_over_slots() -> None:
    keys = KeySpace()
    qk = keys.queue("emails")
    assert qk.pending == "fencekit:{emails}:pending"
    assert qk.inflight("c1") == "fencekit:{emails}:inflight:c1"
    assert hash_tag(keys.queue("a").pending) != hash_tag(keys.queue("b").pending)
    assert hash_tag(keys.consumers) == hash_tag(keys.beats) == "registry"


def test_every_script_header_lists_as_many_keys_as_its_builder_passes() -> None:
    for name, call in every_call(KeySpace(), "q").items():
        declared = {int(n) for n in re.findall(r"^--\s*KEYS\[(\d+)\]", call.script.source, re.MULTILINE)}
        assert declared == set(range(1, len(declared) + 1)), name
        ranged = re.findall(r"^--\s*KEYS\[(\d+)\.\.", call.script.source, re.MULTILINE)
        if ranged:  # KEYS[k..]: as many as the call has, after the numbered ones
            assert ranged == [str(len(declared) + 1)], name
            assert len(call.keys) > len(declared), name
        else:
            assert len(call.keys) == len(declared), name
        assert "Reply" in call.script.source, name


def test_every_queue_builder_in_fencekit_lua_is_covered() -> None:
    helpers = {"call", "load", "script_names", "_read", "_expand", "dataclass"}
    builders = {
        name
        for name, fn in inspect.getmembers(scripts, inspect.isfunction)
        if fn.__module__.startswith("fencekit._redis.scripts.")
        and name not in helpers
        and not name.startswith("_")
    }
    assert {b for b in builders if not is_primitive(b)} == set(every_call(KeySpace(), "q"))


def test_a_jid_is_printable_characters_without_whitespace_quote_or_backslash_over_every_code_point() -> None:
    """is_jid's scans equal its definition, for each character Python knows; jid_error names it."""
    from fencekit._redis.keys import MAX_JID, is_jid, jid_error

    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        usable = ch.isprintable() and not ch.isspace() and ch not in '"\\'
        assert is_jid(f"a{ch}b") == usable, hex(code)
        assert (jid_error(f"a{ch}b") is None) == usable, hex(code)
        if not usable:
            assert f"must not contain {ch!r}" in str(jid_error(f"a{ch}b")), hex(code)
    assert is_jid("order-42:€")
    assert is_jid("x" * MAX_JID)
    assert not is_jid("x" * (MAX_JID + 1))
    assert not is_jid("")
    assert not is_jid(42)
