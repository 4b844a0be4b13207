"""``fencekit.integrations.celery.idempotent_task`` in a real Celery worker, on real brokers.

The worker is ``python -m celery -A fk_celery_app worker`` (prefork pool,
two children, ``acks_late``, ``task_reject_on_worker_lost``, prefetch 1),
started by the test from an app module written into the module's tmp dir
(``celery_app_template.py``). The broker is the machine's RabbitMQ on
127.0.0.1:5672, in a vhost of this module's own (deleted at the end); one
scenario runs again on a Redis broker. The guard, the lock, the fence gate
and the result backend use a private Redis of this module. The bodies
record every run in files, so run counts do not come from Redis.

Children are SIGKILLed (redelivery and reclaim) and SIGSTOPped past their
lease (a stale body's fenced write refused, its mark withheld). Every wait
is bounded; the worker's whole process group is stopped at the end, also
when a test fails. The first tests need no worker: they call the decorated
functions in this process against the session's Redis.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, states
from celery.exceptions import Retry
from celery.result import AsyncResult
from tests.docs_blocks import block_with
from tests.servers import check_flavor

from fencekit import DistributedLock, FenceGate, IdempotencyGuard
from fencekit.errors import ConfigError, FencedOutError, LockNotOwned, NoCurrentJob
from fencekit.integrations.celery import current_lock, current_token, idempotent_task
from fencekit.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).with_name("celery_app_template.py")
RABBIT = ("127.0.0.1", 5672)
WAIT_S = 30.0  # the bound of every wait on the worker
pytestmark = pytest.mark.timeout(90)


def wait_for(
    what: str, predicate: Callable[[], Any], timeout: float = WAIT_S, detail: Callable[[], str] = str
) -> Any:
    """Poll ``predicate`` until it is truthy; fail naming ``what`` (and ``detail()``) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{detail()}")
        time.sleep(0.02)


def options(**extra: Any) -> dict[str, Any]:
    return {
        "key": lambda key, label: key,
        "lock_resource": lambda key, label: key,
        "idempotency_ttl": timedelta(seconds=60),
        "lock_ttl": timedelta(seconds=2),
        **extra,
    }


# -- in this process: arguments, wrapping, the outcomes, on the session's Redis ----------------


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def local_app() -> Iterator[Celery]:
    """An app with the in-memory transport: tasks are called directly, never sent."""
    app = Celery("fk_local", broker="memory://", backend="cache+memory://")
    yield app
    app.close()


def test_the_module_imports_without_celery_and_the_decorator_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['celery'] = None\n"
        "import fencekit.integrations.celery as fc\n"
        "try:\n"
        "    fc.idempotent_task(None, None, key=str, lock_resource=str,"
        " idempotency_ttl=None, lock_ttl=None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    assert (
        out.stdout.strip() == "fencekit.integrations.celery needs Celery: pip install 'fencekit-jobs[celery]'"
    )


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"guard": "nope"}, TypeError, "guard must be an IdempotencyGuard"),
        ({"lock": "nope"}, TypeError, "lock must be a DistributedLock"),
        ({"key": "k"}, TypeError, "key must be a callable"),
        ({"lock_resource": 3}, TypeError, "lock_resource must be a callable"),
        ({"idempotency_ttl": 60}, TypeError, "idempotency_ttl must be a datetime.timedelta"),
        ({"idempotency_ttl": timedelta(milliseconds=500)}, ConfigError, "at least 1 second"),
        ({"lock_ttl": timedelta(0)}, ConfigError, "lock_ttl must be positive"),
        ({"store_result": 1}, TypeError, "store_result must be a bool"),
        ({"retry_on_in_progress": None}, TypeError, "retry_on_in_progress must be a bool"),
        ({"retry_countdown": "5"}, TypeError, "retry_countdown must be a number"),
        ({"retry_countdown": -1}, ConfigError, "finite number >= 0"),
        ({"retry_countdown": float("nan")}, ConfigError, "finite number >= 0"),
    ],
)
def test_bad_arguments_are_refused_when_decorating(
    client: redis.Redis, change: dict[str, Any], error: type[Exception], match: str
) -> None:
    kwargs: dict[str, Any] = {"guard": IdempotencyGuard(client), "lock": DistributedLock(client), **options()}
    kwargs.update(change)
    with pytest.raises(error, match=match):
        idempotent_task(kwargs.pop("guard"), kwargs.pop("lock"), **kwargs)


def test_key_functions_must_return_strings(client: redis.Redis) -> None:
    decorate = idempotent_task(
        IdempotencyGuard(client), DistributedLock(client), **options(key=lambda key, label: 7)
    )
    with pytest.raises(TypeError, match=r"key\(\.\.\.\) must return a str, got int 7"):
        decorate(lambda key, label: None)("k", "a")


def test_the_wrapper_keeps_the_name_and_signature_and_celery_checks_the_arguments(
    client: redis.Redis, local_app: Celery
) -> None:
    def charge(self: Any, order: str, amount: int = 1) -> str:
        """Charge an order once."""
        return order

    wrapped = idempotent_task(IdempotencyGuard(client), DistributedLock(client), **options())(charge)
    assert wrapped.__name__ == "charge"
    assert wrapped.__doc__ == "Charge an order once."
    assert wrapped.__wrapped__ is charge  # type: ignore[attr-defined]
    assert inspect.signature(wrapped) == inspect.signature(charge)
    task = local_app.task(bind=True)(wrapped)
    assert task.name.endswith(".charge")
    with pytest.raises(TypeError, match="order"):
        task.delay()  # refused before anything is sent: Celery read the real signature


def test_current_token_and_lock_are_set_only_inside_a_body(client: redis.Redis) -> None:
    with pytest.raises(NoCurrentJob, match="current_token"):
        current_token()
    with pytest.raises(NoCurrentJob, match="current_lock"):
        current_lock()
    guard, lock = IdempotencyGuard(client), DistributedLock(client)
    seen: list[Any] = []

    @idempotent_task(guard, lock, **options())
    def body(key: str, label: str) -> str:
        seen.append((current_token(), current_lock()))
        return label

    assert body("k-token", "a") == "a"
    token, handle = seen[0]
    assert handle.token == token
    assert token.resource == "k-token"
    assert handle.owner_id.startswith(guard.owner_id + "/")  # an owner of this delivery alone
    assert client.exists(lock.lock_key("k-token")) == 0  # released
    with pytest.raises(NoCurrentJob):
        current_token()


def test_a_done_key_returns_the_memo_without_running_the_body(client: redis.Redis) -> None:
    guard = IdempotencyGuard(client)
    runs: list[str] = []

    @idempotent_task(guard, DistributedLock(client), **options())
    def memo(key: str, label: str) -> dict[str, Any]:
        runs.append(label)
        return {"label": label, "n": [1, 2]}

    @idempotent_task(guard, DistributedLock(client), **options(store_result=False))
    def nomemo(key: str, label: str) -> str:
        runs.append(label)
        return label

    assert memo("k-memo", "a") == {"label": "a", "n": [1, 2]}
    assert memo("k-memo", "b") == {"label": "a", "n": [1, 2]}
    assert nomemo("k-nomemo", "c") == "c"
    assert nomemo("k-nomemo", "d") is None
    assert runs == ["a", "c"]
    assert guard.status("k-memo") == guard.status("k-nomemo") == "done"


def test_a_body_exception_releases_the_lock_and_the_next_delivery_reclaims(client: redis.Redis) -> None:
    guard, lock = IdempotencyGuard(client), DistributedLock(client)
    runs: list[str] = []

    @idempotent_task(guard, lock, **options())
    def flaky(key: str, label: str) -> str:
        runs.append(label)
        if label == "first":
            raise RuntimeError("boom")
        return label

    with pytest.raises(RuntimeError, match="boom"):
        flaky("k-flaky", "first")
    assert guard.status("k-flaky") == "pending"  # left for a retry ...
    assert client.exists(lock.lock_key("k-flaky")) == 0  # ... whose lock is free at once
    assert flaky("k-flaky", "second") == "second"
    assert runs == ["first", "second"]
    assert guard.get_result("k-flaky") == "second"


def test_in_progress_returns_none_or_retries_a_bound_task(client: redis.Redis, local_app: Celery) -> None:
    guard, lock = IdempotencyGuard(client), DistributedLock(client)
    inner: list[Any] = []

    @local_app.task(bind=True)
    @idempotent_task(guard, lock, **options(retry_on_in_progress=True, retry_countdown=0.0))
    def retrying(self: Any, key: str, label: str) -> str:
        return label

    @local_app.task(bind=True)
    @idempotent_task(guard, lock, **options())
    def outer(self: Any, key: str, label: str) -> str:
        inner.append(outer(key, "plain"))  # the same key, while this delivery holds it
        with pytest.raises(Retry):
            retrying(key, "retry")
        return label

    assert outer("k-busy", "outer") == "outer"
    assert inner == [None]
    assert guard.get_result("k-busy") == "outer"


def test_a_lease_lost_while_the_body_ran_is_reported_and_marks_nothing(client: redis.Redis) -> None:
    guard, lock, gate = IdempotencyGuard(client), DistributedLock(client), FenceGate(client)
    refused: list[str] = []
    short = options(lock_ttl=timedelta(milliseconds=300))

    @idempotent_task(guard, lock, **short)
    def body(key: str, label: str) -> str:
        token = current_token()
        if label == "stale":
            # paused past the lease: wait until it is gone, then a newer delivery runs
            wait_for("the lease to end", lambda: client.exists(lock.lock_key(key)) == 0, timeout=10)
            assert body(key, "newer") == "newer"
        try:
            gate.set_if_fresh(token, f"{key}:value", label)
        except FencedOutError:
            refused.append(label)
        return label

    with pytest.raises(LockNotOwned, match="was not marked done by this one"):
        body("k-stale", "stale")
    assert refused == ["stale"]
    assert client.get("k-stale:value") == b"newer"
    assert guard.status("k-stale") == "done"
    assert guard.get_result("k-stale") == "newer"


def test_the_docs_example_runs(redis_url: str) -> None:
    block = block_with('key=lambda order: f"charge:{order}",\n')
    namespace: dict[str, Any] = {}
    exec(block.replace("redis://localhost:6379/0", redis_url), namespace)
    namespace["app"].close()
    namespace["r"].close()
    r = redis.Redis.from_url(redis_url)
    assert r.get("order:order-7:charged") == b"yes"
    assert IdempotencyGuard(r).status("charge:order-7") == "done"
    r.close()


# -- the real worker ----------------------------------------------------------------------------


@dataclass
class Worker:
    """A running ``celery worker`` and the app this process sends with."""

    app: Celery
    directory: Path
    process: subprocess.Popen[bytes]
    log: Path
    redis: redis.Redis

    def send(self, task: str, key: str, label: str) -> AsyncResult:
        return self.app.send_task(task, args=[key, label])

    def records(self, key: str) -> list[list[str]]:
        path = self.directory / f"{key}.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def events(self, key: str, event: str) -> list[list[str]]:
        return [r for r in self.records(key) if r[0] == event]

    def hold(self, key: str, label: str, where: str = "hold") -> Path:
        """A file the body of ``label`` waits on: before its write (``hold``) or after it (``after``)."""
        path = self.directory / f"{key}.{label}.{where}"
        path.touch()
        return path

    def started(self, key: str, count: int = 1) -> list[list[str]]:
        starts: list[list[str]] = wait_for(
            f"{count} start(s) of {key}",
            lambda: len(self.events(key, "start")) >= count and self.events(key, "start"),
            detail=self.tail,
        )
        return starts

    def state(self, result: AsyncResult, wanted: str) -> None:
        """Wait for ``wanted``; fail at once if the task ends in another state."""

        def reached() -> bool:
            state = result.state  # read once: a second read (ready()) may see the state that came next
            if state != wanted and state in states.READY_STATES:
                pytest.fail(
                    f"task {result.id} ended {state} ({result.result!r}), not {wanted}\n{self.tail()}"
                )
            return state == wanted

        wait_for(f"task {result.id} to reach {wanted}", reached, detail=self.tail)

    def tail(self) -> str:
        """The end of the worker's log, for failure messages."""
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "--- worker log (end)\n" + text[-4000:]


def start_worker(directory: Path, broker: str, backend: str, guard_url: str) -> Iterator[Worker]:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(TEMPLATE, directory / "fk_celery_app.py")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT / "src"), str(ROOT)]),
        "FK_BROKER": broker,
        "FK_BACKEND": backend,
        "FK_REDIS": guard_url,
        "FK_DIR": str(directory),
    }
    log = directory / "worker.log"
    argv = [
        sys.executable, "-m", "celery", "-A", "fk_celery_app", "worker",
        "--pool", "prefork", "--concurrency", "2", "--prefetch-multiplier", "1",
        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--hostname", f"fk-{uuid.uuid4().hex[:8]}@%h",
    ]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    app = Celery("fk_sender", broker=broker, backend=backend)
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    client = redis.Redis.from_url(guard_url)
    worker = Worker(app, directory, process, log, client)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the worker exited with {process.returncode}:\n{worker.tail()}")
            return (directory / "ready").exists()

        wait_for("the worker to be ready", ready, detail=worker.tail)
        yield worker
    finally:
        stop_group(process, directory)
        client.close()
        app.close()


def stop_group(process: subprocess.Popen[bytes], directory: Path) -> None:
    """Release every body, wake stopped children, TERM the group; KILL it if it lingers."""
    (directory / "release-all").touch()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # children a warm shutdown left behind, if any
    process.wait(timeout=10)


def rabbitmqctl(*args: str) -> None:
    binary = shutil.which("rabbitmqctl")
    if binary is None:
        pytest.fail("rabbitmqctl is not on PATH: these tests need the machine's RabbitMQ", pytrace=False)
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.fail(f"rabbitmqctl {' '.join(args)} failed: {done.stderr or done.stdout}", pytrace=False)


@pytest.fixture(scope="module")
def rabbit_vhost() -> Iterator[str]:
    """A vhost of this module's own on the machine's RabbitMQ (guest/guest), deleted at the end."""
    try:
        socket.create_connection(RABBIT, timeout=5).close()
    except OSError as exc:
        pytest.fail(f"RabbitMQ is not listening on {RABBIT[0]}:{RABBIT[1]}: {exc}", pytrace=False)
    vhost = f"fencekit-test-celery-{uuid.uuid4().hex[:12]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture(scope="module")
def celery_redis(tmp_path_factory: pytest.TempPathFactory, server_binary: str) -> Iterator[RedisServer]:
    """This module's Redis: db 0 the guard, lock and gate; db 1 the results; db 2 the Redis broker."""
    server = RedisServer(tmp_path_factory.mktemp("celery-redis"), binary=server_binary)
    server.start()
    try:
        check_flavor(server)
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def rabbit_worker(
    tmp_path_factory: pytest.TempPathFactory, rabbit_vhost: str, celery_redis: RedisServer
) -> Iterator[Worker]:
    broker = f"amqp://guest:guest@{RABBIT[0]}:{RABBIT[1]}/{rabbit_vhost}"
    directory = tmp_path_factory.mktemp("celery-rabbit")
    yield from start_worker(directory, broker, celery_redis.url(1), celery_redis.url(0))


@pytest.fixture(scope="module")
def redis_worker(tmp_path_factory: pytest.TempPathFactory, celery_redis: RedisServer) -> Iterator[Worker]:
    directory = tmp_path_factory.mktemp("celery-redis-broker")
    yield from start_worker(directory, celery_redis.url(2), celery_redis.url(1), celery_redis.url(0))


@pytest.fixture(params=["rabbit_worker", "redis_worker"], ids=["rabbitmq", "redis-broker"])
def any_worker(request: pytest.FixtureRequest) -> Worker:
    worker: Worker = request.getfixturevalue(request.param)
    return worker


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


def result_of(result: AsyncResult) -> Any:
    return result.get(timeout=WAIT_S, propagate=True)


def test_two_deliveries_of_a_key_run_the_body_once_and_the_second_gets_the_memo(any_worker: Worker) -> None:
    key, plain = new_key(), new_key()
    assert result_of(any_worker.send("memo", key, "a")) == "result-a"
    assert result_of(any_worker.send("memo", key, "a")) == "result-a"  # the memo, not a second run
    assert result_of(any_worker.send("memo", key, "b")) == "result-a"
    assert [r[:2] for r in any_worker.records(key)] == [["start", "a"], ["wrote", "a"], ["done", "a"]]
    # store_result=False: the second delivery runs nothing and returns None
    assert result_of(any_worker.send("nomemo", plain, "a")) == "result-a"
    assert result_of(any_worker.send("nomemo", plain, "a")) is None
    assert len(any_worker.events(plain, "start")) == 1
    guard = IdempotencyGuard(any_worker.redis)
    assert guard.status(key) == guard.status(plain) == "done"


def test_in_progress_without_retry_returns_none_at_once(rabbit_worker: Worker) -> None:
    key = new_key()
    hold = rabbit_worker.hold(key, "a")
    first = rabbit_worker.send("memo", key, "a")
    rabbit_worker.started(key)
    assert result_of(rabbit_worker.send("memo", key, "b")) is None  # while the first still runs
    hold.unlink()
    assert result_of(first) == "result-a"
    assert len(rabbit_worker.events(key, "start")) == 1


def test_in_progress_with_retry_retries_until_the_memo_is_there(rabbit_worker: Worker) -> None:
    key = new_key()
    hold = rabbit_worker.hold(key, "a")
    first = rabbit_worker.send("memo", key, "a")
    rabbit_worker.started(key)
    second = rabbit_worker.send("retrying", key, "b")
    rabbit_worker.state(second, "RETRY")  # it asked again instead of returning
    hold.unlink()
    assert result_of(first) == "result-a"
    assert result_of(second) == "result-a"
    assert [r[1] for r in rabbit_worker.events(key, "start")] == ["a"]


@pytest.mark.slow
def test_a_killed_child_is_redelivered_and_reclaims_once_its_lease_ends(rabbit_worker: Worker) -> None:
    key = new_key()
    hold = rabbit_worker.hold(key, "x")
    sent = rabbit_worker.send("retrying", key, "x")
    ((_, _, pid, first_token),) = rabbit_worker.started(key)
    os.kill(int(pid), signal.SIGKILL)
    hold.unlink()
    rabbit_worker.state(sent, "SUCCESS")  # redelivered (acks_late, reject_on_worker_lost), reclaimed
    assert result_of(sent) == "result-x"
    starts, done = rabbit_worker.events(key, "start"), rabbit_worker.events(key, "done")
    assert len(starts) == 2
    assert len(done) == 1
    assert starts[1][2] != pid  # another child ...
    assert int(starts[1][3]) > int(first_token)  # ... with a newer token
    guard = IdempotencyGuard(rabbit_worker.redis)
    assert guard.status(key) == "done"
    assert guard.get_result(key) == "result-x"
    assert rabbit_worker.redis.get(f"{key}:value") == b"x"


def test_a_child_paused_past_its_lease_has_its_write_refused_and_marks_nothing(rabbit_worker: Worker) -> None:
    key, lock = new_key(), DistributedLock(rabbit_worker.redis)
    guard = IdempotencyGuard(rabbit_worker.redis)
    hold = rabbit_worker.hold(key, "old")
    old = rabbit_worker.send("memo", key, "old")
    ((_, _, pid, old_token),) = rabbit_worker.started(key)
    os.kill(int(pid), signal.SIGSTOP)
    try:
        wait_for(
            "the paused delivery's lease to end", lambda: rabbit_worker.redis.exists(lock.lock_key(key)) == 0
        )
        after = rabbit_worker.hold(key, "new", "after")  # the newer run stops after its write
        new = rabbit_worker.send("memo", key, "new")  # the producer sends again, as a retrying client does
        wait_for("the newer delivery's write", lambda: rabbit_worker.events(key, "wrote"))
        hold.unlink()
    finally:
        os.kill(int(pid), signal.SIGCONT)
    # the old run wakes while the newer one is still between its write and its mark
    rabbit_worker.state(old, "FAILURE")
    assert isinstance(old.result, LockNotOwned)
    assert "was not marked done by this one" in str(old.result)
    assert guard.status(key) == "pending"  # the old run marked nothing, not even "done" without a memo
    after.unlink()
    assert result_of(new) == "result-new"
    assert [r[:2] for r in rabbit_worker.records(key)] == [
        ["start", "old"],
        ["start", "new"],
        ["wrote", "new"],
        ["refused", "old"],
        ["done", "old"],
        ["done", "new"],
    ]
    (new_start,) = [r for r in rabbit_worker.events(key, "start") if r[1] == "new"]
    assert int(new_start[3]) > int(old_token)
    assert rabbit_worker.redis.get(f"{key}:value") == b"new"
    assert guard.status(key) == "done"
    assert guard.get_result(key) == "result-new"
