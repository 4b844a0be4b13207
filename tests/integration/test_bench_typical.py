"""The typical-job benchmark (``python -m bench.typical``) does on fencekit the work its table claims,
on a real Redis and real pools: each typical job's fenced write lands and its small result is kept in
its record (the default ``keep_result``); the no-op keeps none. A harness that timed less work than it
names would flatter fencekit beside the peers, whose own drivers count what their jobs left."""

from __future__ import annotations

from pathlib import Path

import orjson
from bench import typical

from fencekit.testing import RedisServer


async def test_the_typical_drains_do_the_work_they_name(redis_server: RedisServer, tmp_path: Path) -> None:
    url = redis_server.url()
    res = await typical.run(url, tmp_path, n=300, procs=1, conc=8, rounds=1, peers=[])
    for name, _kw in typical.FK_CASES:
        (row,) = res["rows"][f"fencekit: {name}"]
        assert "error" not in row, row
        assert (row["processed"], row["level"], row["conc"]) == (300, "INFO", 8)
    # the last case (the awaited write) left its work in Redis: each drain starts from an empty one
    with redis_server.client() as r:
        assert {int(r.get(f"bench:out:{i}")) for i in range(300)} == set(range(300))
        records = r.lrange("fencekit:{bench}:finished", 0, -1)
        assert len(records) == 300
        newest = r.hgetall(records[0])
        assert newest[b"state"] == b"done"
        assert orjson.loads(newest[b"result"])["ok"] is True
        assert 0 < r.pttl(records[0]) <= 3_600_000
    lines = typical.render(res)
    assert any(line.startswith("| **fencekit** (write on ack) |") for line in lines)
