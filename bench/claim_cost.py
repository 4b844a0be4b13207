"""Redis CPU per ``ack_claim.lua`` call, this checkout against another: ``python -m bench.claim_cost OTHER``.

Options: ``[--k 16] [--calls 20000] [--rounds 5]``. One private Redis loads
both checkouts' ``ack_claim.lua`` (includes expanded); each round, alternately,
fills a plain pending list and runs ``--calls`` acknowledge-K-claim-K calls,
reading ``usec_per_call`` of ``INFO commandstats`` (the server's own time in the
script, so the client's and the machine's noise mostly stay out). Prints every
figure, the medians and their ratio. What the default path of a change to the
claim script costs Redis, to the tenth of a microsecond.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

import redis

from fencekit.testing import RedisServer

LUA = Path("src/fencekit/_redis/lua")
ENVELOPE = (
    b'{"jid":"0193aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee","queue":"bench","operation":"noop",'
    b'"params":{"i":1},"attempt":0,"enqueued_at":1764480000123}'
)
KEYS = ["P:{bench}:pending", "P:{bench}:inflight:c", "P:{bench}:token", "P:{bench}:stats", "P:{bench}:wake"]


def expand(root: Path, name: str) -> str:
    source = (root / name).read_text()
    return re.sub(r"^--!include (\S+)\s*$", lambda m: expand(root, m.group(1)), source, flags=re.MULTILINE)


def one_round(r: redis.Redis, sha: str, k: int, calls: int) -> float:
    r.delete(*KEYS)
    for _ in range(calls * k // 10_000 + 1):
        r.lpush(KEYS[0], *([ENVELOPE] * 10_000))
    r.config_resetstat()
    acks: list[int] = []
    for _ in range(calls):
        reply = r.evalsha(sha, len(KEYS), *KEYS, k, len(acks), *acks)
        acks = [int(reply[1]) + j for j in range(len(reply) - 3)]
    return float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_cost", description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    roots = {"other": args.other / LUA, "this": Path(__file__).resolve().parent.parent / LUA}
    figures: dict[str, list[float]] = {name: [] for name in roots}
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url())
        shas = {name: str(r.script_load(expand(root, "ack_claim.lua"))) for name, root in roots.items()}
        for _ in range(args.rounds):
            for name, sha in shas.items():
                figures[name].append(one_round(r, sha, args.k, args.calls))
    for name, values in figures.items():
        shown = " / ".join(f"{v:.2f}" for v in values)
        print(f"K={args.k} {name:5}: {shown} µs per call, median {statistics.median(values):.2f}")
    ratio = statistics.median(figures["this"]) / statistics.median(figures["other"])
    print(f"this ÷ other: x{ratio:.3f}")


if __name__ == "__main__":
    main()
