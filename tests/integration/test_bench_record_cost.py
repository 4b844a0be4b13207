"""``python -m bench.record_cost`` times the commands a kept record's ack adds: each phase does that
command to every record (a phase that touched fewer would understate what a record costs)."""

from __future__ import annotations

from bench import record_cost

from fencekit.testing import RedisServer


def test_each_phase_does_its_command_to_every_record(redis_server: RedisServer) -> None:
    n = 300
    with redis_server.client() as r:
        record_cost.write_records(r, n)
        assert r.object("encoding", "{q}:job:0") == b"listpack"  # as enqueue_tracked.lua leaves it
        before_trim = [name for name in record_cost.PHASES if not name.startswith("trim")]
        figures = record_cost.run_phases(r, n, 32, before_trim)
        assert set(figures) == set(before_trim)
        for i in range(n):
            record = r.hgetall(f"{{q}}:job:{i}")
            assert (record[b"state"], record[b"token"]) == (b"done", str(i).encode())
            assert record[b"outcome"].startswith(b"done null ")
            assert 0 < r.pttl(f"{{q}}:job:{i}") <= 3_600_000
        assert r.llen("{q}:finished") == n
        record_cost.run_phases(r, n, 32, ["trim (RPOP + DEL)"])
        assert r.dbsize() == 0  # every record found through the index and deleted
        assert set(record_cost.one_round(r, 100, 16)) == set(record_cost.PHASES)
