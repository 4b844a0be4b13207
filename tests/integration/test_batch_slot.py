"""A batch's bookkeeping in its own slot, on a real Redis (docs/design/batches.md).

The batch half of the fan-in protocol: children registered before they are
enqueued, each counted once whatever notes arrive and however often, the
callbacks handed out to exactly one caller -- the one whose call completed the
batch -- and the batch closed once. Under ``FENCEKIT_TEST_TOPOLOGY=cluster``
the same on a 3-master Redis Cluster (every call touches one slot).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis
from tests.servers import direct

from fencekit._redis import scripts
from fencekit._redis.keys import BatchKeys, KeySpace
from fencekit._redis.run import run
from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs.batches import BatchState, callbacks_due, parse_meta

CALLBACKS = {"complete": {"op": "report"}, "success": {"op": "celebrate"}, "failure": {"op": "alert"}}


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = direct(redis_url)
    yield client
    client.close()


def open_batch(
    r: Any, bk: BatchKeys, jids: list[str], *, armed: bool = True, callbacks: Any = CALLBACKS
) -> int:
    call = scripts.batch_open(
        meta=bk.meta,
        children=bk.children,
        callbacks=orjson.dumps(callbacks),
        armed=armed,
        parent="",
        jids=jids,
    )
    return int(run(r, call))


def note(r: Any, bk: BatchKeys, *notes: tuple[str, str]) -> tuple[int, int, bytes]:
    counted, ignored, fire = run(r, scripts.batch_note(meta=bk.meta, children=bk.children, notes=notes))
    return int(counted), int(ignored), fire


def meta_of(r: Any, bk: BatchKeys) -> Any:
    return parse_meta(bk.bid, r.hgetall(bk.meta))


def test_each_child_counts_once_and_the_call_that_completes_the_batch_gets_the_callbacks(r: Any):
    bk = KeySpace().batch("games-42")
    assert open_batch(r, bk, ["g1", "g2", "g3", "g2"]) == 3  # a jid given twice is one child
    assert note(r, bk, ("g1", "s")) == (1, 0, b"")
    assert note(r, bk, ("g1", "s"), ("g1", "f")) == (0, 2, b"")  # applied again: counts nothing
    assert note(r, bk, ("nobody", "s")) == (0, 1, b"")  # not a child of this batch
    assert note(r, bk, ("g2", "f")) == (1, 0, b"")
    counted, ignored, fire = note(r, bk, ("g3", "c"), ("g2", "s"))
    assert (counted, ignored) == (1, 1)
    assert orjson.loads(fire) == CALLBACKS
    meta = meta_of(r, bk)
    assert meta.state is BatchState.COMPLETING
    assert (meta.total, meta.final, meta.succeeded, meta.failed, meta.cancelled) == (3, 3, 1, 1, 1)
    assert callbacks_due(meta) == ["complete", "failure"]
    assert note(r, bk, ("g3", "c")) == (0, 1, b"")  # completed once: no second hand-out

    assert run(r, scripts.batch_done(meta=bk.meta, children=bk.children, keep_ms=60_000)) == 1
    assert run(r, scripts.batch_done(meta=bk.meta, children=bk.children, keep_ms=60_000)) == 0
    done = meta_of(r, bk)
    assert done.state is BatchState.DONE
    assert done.finished_ms is not None
    assert done.finished_ms >= done.created_ms
    assert 0 < r.pttl(bk.meta) <= 60_000
    assert 0 < r.pttl(bk.children) <= 60_000


def test_callbacks_due_follow_the_children_s_outcomes(r: Any):
    keys = KeySpace()
    all_ok = keys.batch("all-ok")
    open_batch(r, all_ok, ["a", "b"])
    note(r, all_ok, ("a", "s"), ("b", "s"))
    assert callbacks_due(meta_of(r, all_ok)) == ["complete", "success"]

    one_cancelled = keys.batch("one-cancelled")
    open_batch(r, one_cancelled, ["a", "b"])
    note(r, one_cancelled, ("a", "s"), ("b", "c"))
    assert callbacks_due(meta_of(r, one_cancelled)) == ["complete"]  # neither all succeeded nor any failed

    only_failure = keys.batch("only-failure")
    open_batch(r, only_failure, ["a"], callbacks={"failure": {"op": "alert"}})
    note(r, only_failure, ("a", "s"))
    assert callbacks_due(meta_of(r, only_failure)) == []  # no callback of a kind that is due


def test_many_appliers_of_the_same_notes_count_each_child_once_and_hand_out_the_callbacks_once(r: Any):
    """Eight movers apply every note several times, in their own orders, at once."""
    bk = KeySpace().batch("crowd")
    jids = [f"c{i}" for i in range(300)]
    open_batch(r, bk, jids)
    outcomes = {jid: random.choice("sffc") if i % 10 == 0 else "s" for i, jid in enumerate(jids)}
    fired: list[bytes] = []
    errors: list[BaseException] = []

    def mover(seed: int, url_client: Any) -> None:
        try:
            notes = [(jid, outcomes[jid]) for jid in jids] * 3
            random.Random(seed).shuffle(notes)
            for start in range(0, len(notes), 25):
                _, _, fire = note(url_client, bk, *notes[start : start + 25])
                if fire:
                    fired.append(fire)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=mover, args=(seed, r)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert len(fired) == 1
    meta = meta_of(r, bk)
    assert meta.final == meta.total == 300
    assert meta.succeeded == sum(1 for o in outcomes.values() if o == "s")
    assert meta.failed == sum(1 for o in outcomes.values() if o == "f")
    assert meta.cancelled == sum(1 for o in outcomes.values() if o == "c")


def test_an_open_batch_takes_children_until_it_is_armed_then_fires_when_all_are_final(r: Any):
    bk = KeySpace().batch("growing")
    open_batch(r, bk, ["a"], armed=False)
    assert note(r, bk, ("a", "s")) == (1, 0, b"")  # final, but not armed: no callbacks yet
    assert run(r, scripts.batch_add(meta=bk.meta, children=bk.children, jids=["b", "c", "a"])) == 2
    assert note(r, bk, ("b", "s"), ("c", "s")) == (2, 0, b"")
    assert meta_of(r, bk).state is BatchState.OPEN
    fire = run(r, scripts.batch_arm(meta=bk.meta))
    assert orjson.loads(fire) == CALLBACKS  # every child was final already
    assert run(r, scripts.batch_arm(meta=bk.meta)) == b""  # armed once
    with pytest.raises(ConfigError, match="is completing: no child may join"):
        run(r, scripts.batch_add(meta=bk.meta, children=bk.children, jids=["late"]))

    waiting = KeySpace().batch("armed-before-the-end")
    open_batch(r, waiting, ["x", "y"], armed=False)
    assert run(r, scripts.batch_arm(meta=waiting.meta)) == b""
    assert note(r, waiting, ("x", "s"))[2] == b""
    assert orjson.loads(note(r, waiting, ("y", "s"))[2]) == CALLBACKS


def test_bad_calls_are_refused_whole_and_count_nothing(r: Any):
    bk = KeySpace().batch("strict")
    open_batch(r, bk, ["a", "b"])
    with pytest.raises(ConfigError, match="exists already"):
        open_batch(r, bk, ["c"])
    with pytest.raises(PayloadError, match="outcome x is not s, f or c"):
        note(r, bk, ("a", "s"), ("b", "x"))
    with pytest.raises(PayloadError, match="a note is a jid and an outcome"):
        run(r, scripts.call("batch_note", (bk.meta, bk.children), ("a",)))
    meta = meta_of(r, bk)
    assert (meta.final, meta.succeeded) == (0, 0)
    missing = KeySpace().batch("never-opened")
    assert note(r, missing, ("a", "s")) == (0, 1, b"")
    with pytest.raises(ConfigError, match="does not exist"):
        run(r, scripts.batch_arm(meta=missing.meta))
    with pytest.raises(ConfigError, match="does not exist"):
        run(r, scripts.batch_add(meta=missing.meta, children=missing.children, jids=["a"]))
    assert r.exists(missing.meta, missing.children) == 0
