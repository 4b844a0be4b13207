"""The Celery app the tests of ``test_celery.py`` run in a real worker (copied into tmp_path).

Everything comes from the environment: ``FK_BROKER`` (RabbitMQ or Redis),
``FK_BACKEND`` (the result backend), ``FK_REDIS`` (the Redis of the guard,
the lock and the fence gate) and ``FK_DIR`` (where the bodies record their
runs and where the test puts hold files). Every task runs one body,
:func:`work`: it records ``start`` (with its pid and fencing token), waits
while ``<key>.<label>.hold`` exists, writes ``label`` to ``<key>:value``
through ``FenceGate.set_if_fresh`` with its token (recording ``wrote`` or
``refused``), waits while ``<key>.<label>.after`` exists, records ``done``
and returns ``result-<label>``. Records are
lines appended (and flushed) to ``<key>.log``, outside Redis, so the test
counts real runs.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_process_shutdown, worker_ready

from fencekit import DistributedLock, FenceGate, IdempotencyGuard
from fencekit._coverage import save as save_coverage
from fencekit.errors import FencedOutError
from fencekit.integrations.celery import current_token, idempotent_task

DIR = Path(os.environ["FK_DIR"])
HOLD_LIMIT_S = 60.0  # a body never waits longer for its hold file to go

app = Celery("fk_celery_app", broker=os.environ["FK_BROKER"], backend=os.environ["FK_BACKEND"])
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
)

client = redis.Redis.from_url(os.environ["FK_REDIS"])
guard = IdempotencyGuard(client)
lock = DistributedLock(client)
gate = FenceGate(client)

OPTIONS: dict[str, Any] = {
    "key": lambda key, label: key,
    "lock_resource": lambda key, label: key,
    "idempotency_ttl": timedelta(seconds=60),
    "lock_ttl": timedelta(seconds=2),
}


def record(key: str, *words: object) -> None:
    with open(DIR / f"{key}.log", "a") as log:
        log.write(" ".join(str(w) for w in words) + "\n")
        log.flush()
        os.fsync(log.fileno())


def wait_while(hold: Path) -> None:
    deadline = time.monotonic() + HOLD_LIMIT_S
    while hold.exists() and not (DIR / "release-all").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{hold} was never removed")
        time.sleep(0.02)


def work(key: str, label: str) -> str:
    token = current_token()
    record(key, "start", label, os.getpid(), token.value)
    wait_while(DIR / f"{key}.{label}.hold")
    try:
        gate.set_if_fresh(token, f"{key}:value", label)
        record(key, "wrote", label, os.getpid(), token.value)
    except FencedOutError:
        record(key, "refused", label, os.getpid(), token.value)
    wait_while(DIR / f"{key}.{label}.after")
    record(key, "done", label, os.getpid(), token.value)
    return f"result-{label}"


@app.task(name="memo")
@idempotent_task(guard, lock, **OPTIONS)
def memo(key: str, label: str) -> str:
    """Unbound; the result is memoised; IN_PROGRESS returns None."""
    return work(key, label)


@app.task(name="nomemo", bind=True)
@idempotent_task(guard, lock, store_result=False, **OPTIONS)
def nomemo(self: Any, key: str, label: str) -> str:
    """Bound; no memo, so a later delivery gets None."""
    return work(key, label)


@app.task(name="retrying", bind=True, max_retries=200)
@idempotent_task(guard, lock, retry_on_in_progress=True, retry_countdown=0.2, **OPTIONS)
def retrying(self: Any, key: str, label: str) -> str:
    """Bound; IN_PROGRESS retries every 0.2 s."""
    return work(key, label)


@worker_ready.connect
def _ready(**_: Any) -> None:
    (DIR / "ready").write_text(str(os.getpid()))


@worker_process_shutdown.connect
def _save_coverage(**_: Any) -> None:
    save_coverage()  # prefork children leave with os._exit
