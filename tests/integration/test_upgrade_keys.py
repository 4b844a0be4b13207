"""``fencekit upgrade-keys --from 0.6`` against state written by the REAL published fencekit 0.6.1.

A session fixture builds a virtualenv with ``pip install fencekit==0.6.1``
(the other author's package of the same import name); its code runs there, in
a subprocess, against the harness's Redis. Our command then runs as a real
subprocess, and our primitives read the result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from fencekit import DistributedLock, FenceGate, FenceToken, IdempotencyGuard
from fencekit.errors import FencedOutError, LockNotAcquired

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120
# one worker runs them all: the session fixture's virtualenv is built once, not once per worker
pytestmark = pytest.mark.xdist_group("upgrade_keys")


@pytest.fixture(scope="session")
def old_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A virtualenv's python with the published fencekit 0.6.1 (and redis-py) installed."""
    venv = tmp_path_factory.mktemp("fencekit061") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=TIMEOUT)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "fencekit==0.6.1"],
        check=True,
        timeout=TIMEOUT,
        env=_clean_env(),
    )
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('fencekit'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_clean_env(),
    ).stdout.strip()
    assert version == "0.6.1", version
    return python


def _clean_env() -> dict[str, str]:
    """The environment without our sources on the path (the venv must import ITS fencekit)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run_old(python: str, url: str, body: str) -> str:
    """Run ``body`` with fencekit 0.6.1 (``r``: a decode_responses client of ``url``); its stdout."""
    script = (
        "import sys, json\nfrom datetime import timedelta\nimport redis\n"
        "from fencekit import DistributedLock, FenceGate, FenceToken, IdempotencyGuard\n"
        "r = redis.Redis.from_url(sys.argv[1], decode_responses=True)\n" + textwrap.dedent(body)
    )
    done = subprocess.run(
        [python, "-c", script, url], capture_output=True, text=True, timeout=TIMEOUT, env=_clean_env()
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _ours_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    env.pop("FENCEKIT_REDIS_URL", None)
    env.pop("FENCEKIT_PREFIX", None)
    env.update(extra)
    return env


def upgrade(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Our command as a real subprocess (``python -m fencekit.cli upgrade-keys ...``)."""
    return subprocess.run(
        [sys.executable, "-m", "fencekit.cli", "upgrade-keys", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env or _ours_env(),
    )


def summary_of(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stdout + done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def snapshot(c: redis.Redis) -> dict[str, tuple[str | None, bool]]:
    """Every key's value and whether it has an expiry."""
    return {key: (c.get(key), c.pttl(key) > 0) for key in c.scan_iter(count=1000)}


OLD_STATE = """
    g = IdempotencyGuard(r, owner_id="old-owner")
    assert g.try_begin("done-key", ttl=timedelta(seconds=600))
    g.mark_done("done-key", result={"answer": 42, "list": [1, "x"]})
    assert g.try_begin("pending-key", ttl=timedelta(seconds=600))
    assert g.try_begin("{braced}:k", ttl=timedelta(seconds=600))
    g.mark_done("{braced}:k", result="braced memo")
    assert g.try_begin("ends:result", ttl=timedelta(seconds=600))
    g.mark_done("ends:result", result=None)
    assert g.try_begin("conflict-done", ttl=timedelta(seconds=600))
    g.mark_done("conflict-done", result="old wins")
    assert g.try_begin("ours-newer", ttl=timedelta(seconds=600))
    lock = DistributedLock(r)
    gate = FenceGate(r)
    tokens = []
    for _ in range(3):
        h = lock.acquire("res", ttl=timedelta(seconds=60))
        tokens.append(h.token.value)
        lock.release(h)
    gate.check_and_advance(FenceToken(tokens[-1], "res"))
    try:
        gate.check_and_advance(FenceToken(tokens[0], "res"))
        raise SystemExit("0.6 accepted a stale token")
    except Exception as exc:
        assert type(exc).__name__ == "FencedOutError"
    r.set("fencekit:fence:seq:big", 4 * 10**15)  # above our time-based tokens, below 2**53
    big = lock.acquire("big", ttl=timedelta(seconds=60))
    lock.release(big)
    gate.check_and_advance(big.token)
    held = lock.acquire("held", ttl=timedelta(seconds=120), owner_id="old-holder")
    print(json.dumps({"tokens": tokens, "big": big.token.value, "held": held.token.value}))
"""


def _our_state(c: redis.Redis) -> None:
    """Keys of ours written before the run (must stay untouched)."""
    guard = IdempotencyGuard(c, owner_id="new-owner")
    assert guard.try_begin("ours-key", ttl=timedelta(seconds=900))
    guard.mark_done("ours-key", result={"ours": True})
    assert guard.try_begin("conflict-done", ttl=timedelta(seconds=900))  # ours pending, 0.6 done
    assert guard.try_begin("ours-newer", ttl=timedelta(seconds=900))
    guard.mark_done("ours-newer", result="ours")  # ours done, 0.6 pending
    lock = DistributedLock(c)
    lock.acquire("ours-res", ttl=timedelta(seconds=900))
    FenceGate(c).check_and_advance(FenceToken(77, "ours-fence"))


@pytest.mark.slow
def test_state_of_061_reads_the_same_with_ours(old_python: str, redis_url: str, client: redis.Redis) -> None:
    _our_state(client)
    ours_before = snapshot(client)
    old = json.loads(run_old(old_python, redis_url, OLD_STATE))
    before = snapshot(client)

    dry = upgrade("--from", "0.6", "--dry-run", "--json", "--redis-url", redis_url)
    dry_summary = summary_of(dry)
    assert dry_summary["dry_run"] is True
    assert dry_summary["changed"] > 0
    assert snapshot(client) == before  # a dry run writes nothing

    first = summary_of(upgrade("--from", "0.6", "--json", "--redis-url", redis_url))
    assert first["changed"] == dry_summary["changed"]
    assert first["errors"] == []
    assert first["error_count"] == 0
    # idem: done-key, pending-key, ends:result, conflict-done ({braced}:k is at our name already)
    assert first["migrated"] == {"fence": 2, "seq": 3, "lock": 1, "idem": 4}, first
    assert first["kept"] == 1  # ours-newer: our done is kept over 0.6's pending

    guard = IdempotencyGuard(client, owner_id="someone-else")
    # done under 0.6: done with ours, same memo, the TTL carried
    assert guard.status("done-key") == "done"
    assert guard.get_result("done-key") == {"answer": 42, "list": [1, "x"]}
    # 0.6's 600 s carried (ours would be 900 s); the lower bound leaves minutes for a loaded machine
    assert 300_000 < client.pttl("fencekit:idem:{done-key}") <= 600_000
    assert 300_000 < client.pttl("fencekit:idem:{done-key}:result") <= 600_000
    assert guard.get_result("ends:result") is None
    assert guard.status("ends:result") == "done"
    assert guard.get_result("{braced}:k") == "braced memo"  # already at our name: left in place
    # pending stays pending, and its 0.6 owner finishes it with ours
    assert guard.status("pending-key") == "pending"
    assert not guard.try_begin("pending-key", ttl=timedelta(seconds=60))
    IdempotencyGuard(client, owner_id="old-owner").mark_done("pending-key", result="finished by ours")
    assert guard.get_result("pending-key") == "finished by ours"
    # done wins over pending; an existing done of ours is kept
    assert guard.status("conflict-done") == "done"
    assert guard.get_result("conflict-done") == "old wins"
    assert guard.get_result("ours-newer") == "ours"
    # fences never go backwards: every token 0.6 refused, ours refuses; newer ones pass
    gate = FenceGate(client)
    tokens = old["tokens"]
    with pytest.raises(FencedOutError):
        gate.check_and_advance(FenceToken(tokens[0], "res"))
    with pytest.raises(FencedOutError):
        gate.check_and_advance(FenceToken(old["big"] - 1, "big"))
    gate.check_and_advance(FenceToken(tokens[-1] + 1, "res"))
    # our lock issues tokens above every token 0.6 issued
    lock = DistributedLock(client)
    with lock.hold("big", ttl=timedelta(seconds=5)) as handle:
        assert handle.token.value > old["big"]
    assert int(client.get("fencekit:lock:{res}:seq") or 0) >= tokens[-1]
    # a lock 0.6 holds stays held until its lease ends
    with pytest.raises(LockNotAcquired):
        lock.acquire("held", ttl=timedelta(seconds=5))
    assert 0 < client.pttl("fencekit:lock:{held}") <= 120_000  # the 0.6 lease, carried
    # its holder stops renewing: the lease runs out (0.6's own key is left to its lease too)
    assert client.exists("fencekit:lock:held")
    for key in ("fencekit:lock:{held}", "fencekit:lock:held"):
        client.pexpire(key, 300)
    handle = lock.acquire("held", ttl=timedelta(seconds=5), blocking=True, wait=timedelta(seconds=20))
    assert not client.exists("fencekit:lock:held")  # only once the 0.6 lease was over
    assert handle.token.value > old["held"]
    lock.release(handle)
    # our own keys were not touched (the ones our checks above did not change)
    after = snapshot(client)
    for key in (
        "fencekit:idem:{ours-key}",
        "fencekit:idem:{ours-key}:result",
        "fencekit:lock:{ours-res}",
        "fencekit:fence:{ours-fence}",
        "fencekit:idem:{ours-newer}:result",
    ):
        assert after[key] == ours_before[key], key
    # the old keys are kept (rollback to 0.6 works)
    assert client.get("fencekit:idem:done-key") == "done"
    assert client.get("fencekit:fence:max:res") == str(tokens[-1])

    again = summary_of(upgrade("--from", "0.6", "--json", "--redis-url", redis_url))
    assert again["changed"] == 0, again
    assert again["error_count"] == 0, again
    text = upgrade("--from", "0.6", "--redis-url", redis_url)
    assert text.returncode == 0, text.stderr
    assert "nothing to change" in text.stdout, text.stdout


def test_delete_old_and_other_prefixes(old_python: str, redis_url: str, client: redis.Redis) -> None:
    run_old(
        old_python,
        redis_url,
        """
        g = IdempotencyGuard(r, prefix="legacy", owner_id="o")
        g.try_begin("k", ttl=timedelta(seconds=300)); g.mark_done("k", result=[1])
        FenceGate(r, prefix="legacy").check_and_advance(FenceToken(9, "f"))
        """,
    )
    done = upgrade(
        "--from",
        "0.6.1",
        "--json",
        "--old-prefix",
        "legacy",
        "--prefix",
        "app",
        "--delete-old",
        env=_ours_env(FENCEKIT_REDIS_URL=redis_url),
    )
    summary = summary_of(done)
    assert summary["migrated"] == {"fence": 1, "seq": 0, "lock": 0, "idem": 1}
    assert IdempotencyGuard(client, prefix="app").get_result("k") == [1]
    with pytest.raises(FencedOutError):
        FenceGate(client, prefix="app").check_and_advance(FenceToken(8, "f"))
    assert sorted(client.scan_iter(match="legacy:*")) == []  # deleted once carried


def test_bad_usage_exits_2_with_a_clear_message(redis_url: str) -> None:
    bad_from = upgrade("--from", "0.7", "--redis-url", redis_url)
    assert bad_from.returncode == 2
    assert "supported: 0.1, 0.2, 0.3, 0.4, 0.5, 0.6" in bad_from.stderr
    bad_url = upgrade("--from", "0.6", "--redis-url", "http://localhost:1/0")
    assert bad_url.returncode == 2
    assert "unsupported URL scheme 'http'" in bad_url.stderr
    unreachable = upgrade("--from", "0.6", "--redis-url", "redis://127.0.0.1:1/0")
    assert unreachable.returncode == 4  # as every fencekit command
    assert "cannot reach Redis" in unreachable.stderr
    env_url = upgrade("--from", "0.6", env=_ours_env(FENCEKIT_REDIS_URL="redis://h:notaport/0"))
    assert env_url.returncode == 2
    assert "bad port" in env_url.stderr
    assert upgrade("--redis-url", redis_url).returncode == 2  # --from is required
    assert upgrade("--from", "0.6", "--batch", "0", "--redis-url", redis_url).returncode == 2


@pytest.mark.slow
def test_killed_part_way_then_rerun_finishes(old_python: str, redis_url: str, client: redis.Redis) -> None:
    n = 10_000
    run_old(
        old_python,
        redis_url,
        f"""
        gate = FenceGate(r)
        g = IdempotencyGuard(r, owner_id="bulk")
        for i in range({n}):
            gate.check_and_advance(FenceToken(i + 1, f"r{{i}}"))
        for i in range({n // 2}):
            g.try_begin(f"k{{i}}", ttl=timedelta(seconds=900))
            g.mark_done(f"k{{i}}", result=i)
        """,
    )
    assert client.dbsize() == 2 * n
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fencekit.cli",
            "upgrade-keys",
            "--from",
            "0.6",
            "--batch",
            "20",
            "--redis-url",
            redis_url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_ours_env(),
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the first plain progress line: part-way
        assert line.startswith("upgrade-keys: scanned"), line
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
        if proc.stderr is not None:
            proc.stderr.close()
    carried = sum(1 for _ in client.scan_iter(match="fencekit:fence:{*", count=1000))
    assert 0 < carried < n  # it was interrupted part-way
    rerun = summary_of(upgrade("--from", "0.6", "--batch", "500", "--json", "--redis-url", redis_url))
    assert rerun["error_count"] == 0
    assert sum(1 for _ in client.scan_iter(match="fencekit:fence:{*", count=1000)) == n
    assert sum(1 for _ in client.scan_iter(match="fencekit:idem:{*}:result", count=1000)) == n // 2
    assert int(client.get("fencekit:fence:{r1234}") or 0) == 1235
    assert IdempotencyGuard(client).get_result("k4321") == 4321
    final = summary_of(upgrade("--from", "0.6", "--json", "--redis-url", redis_url))
    assert final["changed"] == 0
