"""The fenced primitives page's examples (docs/guides/primitives.md) run as written."""

from __future__ import annotations

import redis
from tests.docs_blocks import block_with, with_url


def test_the_primitives_example_runs(redis_url: str):
    namespace: dict[str, object] = {}
    exec(with_url(block_with("def analyze_batch"), redis_url), namespace)
    namespace["analyze_batch"]()  # type: ignore[operator]
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    assert r.get("analysis:batch-42:status") == "running"
    assert [k for k in r.keys("fencekit:idem:*") if not k.endswith(":result")]
    r.close()
