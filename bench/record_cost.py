"""What a kept record costs Redis, command by command: ``python -m bench.record_cost``.

Options: ``[--n 100000] [--batch 128] [--rounds 3]``. On one private Redis, N records
are written as ``enqueue_tracked.lua`` writes them (state, enqueued, keep and the
envelope in three listpack fields), then each command the ack of a kept record adds
(``ack_claim.lua``) runs over all N in scripts of ``--batch`` records, one command kind
per phase: the outcome ``HSET`` (state, result, finished, token, by), the retention
``PEXPIRE``, the index ``LPUSH`` and the trim (``RPOP`` of the index and ``DEL`` of the
records it names). Redis's own µs per record comes from ``INFO commandstats`` (reset
before each phase), less an empty loop over the same keys; the medians of the rounds.

Why the default record cannot reach the bare drain's rate: each record is a key of its
own, and a key's write and its expiry cost Redis one and a half to two and a half
microseconds each, most of it for finding the key: the outcome written as one field
instead of five saves a fraction of that (the 1-field row). A record that
were not a key -- a field of a per-queue hash with its own expiry -- needs ``HPEXPIRE``
(Redis 7.4, Valkey 9), which the servers fencekit supports do not all have.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable

import redis

from fencekit.testing import RedisServer

ENVELOPE = (
    '{"jid":"01a25048-9515-73cf-8ad1-d5827b0d0815","queue":"bench","operation":"noop",'
    '"params":{"i":12345},"attempt":0,"enqueued_at":1796628458490,"keep":3600000}'
)
_EACH = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do local key = '{q}:job:' .. i; "
SETUP = (
    _EACH + "redis.call('HSET', key, 'state', 'pending', 'enqueued', '1796628458490', 'keep', '3600000', "
    "'env', string.sub(ARGV[3], 1, 64), 'env1', string.sub(ARGV[3], 65, 128), "
    "'env2', string.sub(ARGV[3], 129)) end"
)
PHASES = {
    "empty loop": _EACH + "end",
    "outcome HSET (5 fields)": _EACH + "redis.call('HSET', key, 'state', 'done', 'result', 'null', "
    "'finished', '1796628458490', 'token', tostring(i), 'by', 'c1') end",
    "outcome HSET (1 field, for comparison)": _EACH + "redis.call('HSET', key, 'outcome', "
    "'done null 1796628458490 ' .. i .. ' c1') end",
    "PEXPIRE": _EACH + "redis.call('PEXPIRE', key, 3600000) end",
    "index LPUSH": "local keys = {} " + _EACH + "keys[#keys + 1] = key end "
    "redis.call('LPUSH', '{q}:finished', unpack(keys))",
    "trim (RPOP + DEL)": "local count = tonumber(ARGV[2]) - tonumber(ARGV[1]) + 1 "
    "redis.call('DEL', unpack(redis.call('RPOP', '{q}:finished', count)))",
}


def write_records(r: redis.Redis, n: int) -> None:
    """N records ``{q}:job:0`` .. as ``enqueue_tracked.lua`` writes them, on an emptied Redis."""
    r.flushall()
    setup = r.register_script(SETUP)
    for first in range(0, n, 1000):
        setup(args=[first, min(first + 999, n - 1), ENVELOPE])


def run_phases(r: redis.Redis, n: int, batch: int, names: Iterable[str]) -> dict[str, float]:
    """Redis µs per record of each phase named, in that order, over records 0 .. N-1."""
    out: dict[str, float] = {}
    for name in names:
        body = PHASES[name]
        script = r.register_script(body)
        r.script_load(body)  # EVALSHA from the first call on
        r.config_resetstat()
        for first in range(0, n, batch):
            script(args=[first, min(first + batch - 1, n - 1)])
        stats = r.info("commandstats")["cmdstat_evalsha"]
        out[name] = stats["usec"] / n
    return out


def one_round(r: redis.Redis, n: int, batch: int) -> dict[str, float]:
    """Redis µs per record of each phase, on N records written afresh."""
    write_records(r, n)
    return run_phases(r, n, batch, PHASES)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.record_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with RedisServer() as server:
        r = redis.Redis(port=server.port)
        setup = r.register_script(SETUP)
        setup(args=[0, 0, ENVELOPE])
        size, encoding = r.memory_usage("{q}:job:0"), r.object("encoding", "{q}:job:0")
        rounds = [one_round(r, args.n, args.batch) for _ in range(args.rounds)]
        r.close()
    loop = statistics.median(x["empty loop"] for x in rounds)
    print(f"N={args.n:,} records of {size} bytes ({encoding!r}), {args.batch} a script, {args.rounds} rounds")
    print("| command of a kept record's ack | Redis µs per record (median, less the empty loop) |")
    print("|---|---|")
    total = 0.0
    for name in PHASES:
        if name == "empty loop":
            continue
        us = statistics.median(x[name] for x in rounds) - loop
        total += 0.0 if "comparison" in name else us
        print(f"| {name} | {us:.2f} |")
    print(f"| the ack's commands (5-field HSET, PEXPIRE, LPUSH, trim) | {total:.2f} |")


if __name__ == "__main__":
    main()
