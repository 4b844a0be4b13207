"""How a task's record is stored on a real Redis: the envelope split over fields of at most
64 bytes (``lua/_env.lua``), so Redis keeps the record as a compact listpack from its
enqueue to its end; every reader joins the fields again, whatever the envelope's length,
its characters or the client's ``decode_responses``; a record rewritten with a shorter
envelope keeps no stale part; and a record written before the split still reads."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
import redis.asyncio
from tests.queue_helpers import eventually, new_server, qkey, running, worker

from fencekit import Client, JobStatus, Task, current_job
from fencekit.jobs import codec, records

# 300 characters of which many are 2, 3 and 4 UTF-8 bytes: every 64-byte cut falls inside one.
WIDE = "é" * 7 + "ж€😀" * 40 + "z" * 13


def _fields(r: Any, queue: str, jid: str) -> dict[str, bytes]:
    return {k.decode(): v for k, v in r.hgetall(qkey(queue, f"job:{jid}")).items()}


async def test_a_default_record_stays_a_listpack_from_enqueue_to_its_result(redis_url: str, r: Any) -> None:
    async def analyse(payload: dict[str, Any]) -> dict[str, Any]:
        return {"best": "e4", "n": payload["n"]}

    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("layout", "analyse", {"n": 7, "fen": "rnbqkbnr/pppppppp/8/8" * 3}))
        key = qkey("layout", f"job:{jid}")
        fields = _fields(r, "layout", jid)
        assert max(len(v) for v in fields.values()) <= 64
        assert "env1" in fields  # the envelope did not fit one field
        assert r.object("encoding", key) == b"listpack"
        async with running(new_server(redis_url, worker("layout", "analyse", analyse))):
            assert await client.result(jid, timeout=10) == {"best": "e4", "n": 7}
        assert r.object("encoding", key) == b"listpack"
        info = await client.job(jid)
        assert info is not None
        assert (info.status, info.params, info.result) == (
            JobStatus.DONE,
            {"n": 7, "fen": "rnbqkbnr/pppppppp/8/8" * 3},
            {"best": "e4", "n": 7},
        )


@pytest.mark.parametrize("decoded", [False, True], ids=["bytes", "decoded"])
async def test_wide_characters_and_long_envelopes_read_back_whole(
    redis_url: str, r: Any, decoded: bool
) -> None:
    """Cuts fall between characters: a client with ``decode_responses`` reads each part."""
    user = redis.asyncio.Redis.from_url(redis_url, decode_responses=decoded)
    params = {"name": WIDE, "games": ["1. e4 e5 2. Nf3 Nc6"] * 150}  # about 3.5 KB
    try:
        async with Client(redis=user) as client:
            jid = await client.enqueue(Task("layout", "analyse", params))
            later = await client.enqueue(Task("layout", "analyse", params), delay=600)
            fields = _fields(r, "layout", jid)
            parts = [fields["env"]] + [
                fields[f"env{i}"] for i in range(1, len(fields)) if f"env{i}" in fields
            ]
            assert len(parts) > 50
            for part in parts:
                part.decode()  # each part is whole UTF-8 on its own
            assert codec.decode(b"".join(parts)).params == params
            info = await client.job(jid)
            assert info is not None
            assert info.params == params
            # cancel finds the scheduled task by the envelope its record holds (cancel.lua)
            assert await client.cancel(later) is True
            gone = await client.job(later)
            assert gone is not None
            assert gone.status is JobStatus.CANCELLED
            assert r.zcard(qkey("layout", "scheduled")) == 0
    finally:
        await user.aclose()


async def test_a_record_rewritten_with_a_shorter_envelope_keeps_no_stale_part(redis_url: str, r: Any) -> None:
    """A debounced task enqueued again with shorter params: its record's envelope is rewritten
    (``enqueue_debounce.lua``) and the parts the longer one left are dropped."""
    async with Client(redis_url=redis_url) as client:
        first = Task("layout", "analyse", {"pad": "x" * 400}, debounce_key="k", debounce=600)
        jid = await client.enqueue(first)
        assert len([k for k in _fields(r, "layout", jid) if k.startswith("env")]) > 6
        again = await client.enqueue(Task("layout", "analyse", {"pad": "y"}, debounce_key="k", debounce=600))
        assert again == jid
        after = _fields(r, "layout", jid)
        whole = records.record_envelope(after)
        parts = -(-len(whole) // 64)  # ASCII: every part but the last is 64 bytes
        assert 0 < parts < 4
        assert sorted(k for k in after if k.startswith("env")) == [
            "env",
            *(f"env{i}" for i in range(1, parts)),
        ]
        info = await client.job(jid)
        assert info is not None
        assert (info.status, info.params) == (JobStatus.SCHEDULED, {"pad": "y"})


async def test_a_record_written_before_the_split_still_reads_and_retries(redis_url: str, r: Any) -> None:
    """An older fencekit kept the whole envelope in ``env``: read, cancelled and retried as before."""
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("layout", "analyse", {"n": 1}), delay=600)
        key = qkey("layout", f"job:{jid}")
        whole = records.record_envelope(_fields(r, "layout", jid))
        r.hdel(key, *[k for k in _fields(r, "layout", jid) if k.startswith("env")])
        r.hset(key, "env", whole)
        info = await client.job(jid)
        assert info is not None
        assert (info.status, info.params) == (JobStatus.SCHEDULED, {"n": 1})
        assert await client.cancel(jid) is True
        assert r.zcard(qkey("layout", "scheduled")) == 0

        failing = await client.enqueue(Task("layout", "boom", {"n": 2}))

        async def boom(payload: dict[str, Any]) -> None:
            raise RuntimeError("no")

        async with running(new_server(redis_url, worker("layout", "boom", boom, retry=False))):
            await eventually(lambda: _status(client, failing, JobStatus.FAILED), what="the failure")
        record = qkey("layout", f"job:{failing}")
        stored = records.record_envelope(_fields(r, "layout", failing))
        r.hdel(record, *[k for k in _fields(r, "layout", failing) if k.startswith("env")])
        r.hset(record, "env", stored)
        assert await client.queue("layout").retry_failed(failing) == 1
        again = await client.job(failing)
        assert again is not None
        assert (again.status, again.params, again.attempt) == (JobStatus.PENDING, {"n": 2}, 1)


async def test_the_envelope_parts_are_what_a_job_reads_while_it_runs(redis_url: str, r: Any) -> None:
    seen: list[dict[str, Any]] = []
    gate = asyncio.Event()

    async def analyse(payload: dict[str, Any]) -> None:
        seen.append({"params": payload, "jid": current_job().jid})
        await gate.wait()

    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("layout", "analyse", {"name": WIDE}))
        async with running(new_server(redis_url, worker("layout", "analyse", analyse))):
            await eventually(lambda: seen, what="the run")
            info = await client.job(jid)
            assert info is not None
            assert (info.status, info.params) == (JobStatus.RUNNING, {"name": WIDE})
            gate.set()
            await client.result(jid, timeout=10)
    assert seen == [{"params": {"name": WIDE}, "jid": jid}]
    assert orjson.loads(records.record_envelope(_fields(r, "layout", jid)))["params"] == {"name": WIDE}


async def _status(client: Client, jid: str, status: JobStatus) -> bool:
    info = await client.job(jid)
    return info is not None and info.status is status
