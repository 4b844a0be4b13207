"""The Redis ceiling's replay (``bench/replay.lua`` through ``bench.ceiling.replay``) does the work
it claims to measure, on a real Redis: every job claimed into the in-flight hash and acknowledged
out of it, each record written with its outcome and retention and trimmed to ``keep_finished``,
each fenced write landing; a ceiling that measured less work than a drain does would flatter it."""

from __future__ import annotations

import pytest
from bench import ceiling

from fencekit.testing import RedisServer


@pytest.mark.parametrize("kind", list(ceiling.KINDS))
def test_the_replay_does_each_kinds_work(redis_server: RedisServer, kind: str) -> None:
    out = ceiling.replay(redis_server.port, n=500, batch=64, keep_finished=100, kinds=(kind,))
    flags, result = ceiling.KINDS[kind]
    assert out[kind]["jobs"] == 500
    assert out[kind]["us_per_job"] > 0
    with redis_server.client() as r:
        assert r.llen("{bench}:pending") == 0
        assert r.hlen("{bench}:inflight") == 0  # every claimed job acknowledged
        assert r.hget("{bench}:stats", "processed") == b"500"
        records = r.lrange("{bench}:finished", 0, -1)
        if "r" in flags:
            assert len(records) == 100  # trimmed to keep_finished, the newest kept
            assert records[0] == b"{bench}:job:500"
            assert r.exists(*records) == 100
            assert r.exists("{bench}:job:400") == 0  # pushed out by the trim: deleted
            newest = r.hgetall(records[0])
            assert newest[b"state"] == b"done"
            assert (newest[b"result"], newest[b"token"]) == (result.encode(), b"500")
            assert 0 < r.pttl(records[0]) <= 3_600_000
        else:
            assert records == []
        outs = r.keys("{bench}:out:*")
        assert len(outs) == (500 if "f" in flags or "a" in flags else 0)
