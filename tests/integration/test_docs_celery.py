"""The Celery page's examples (docs/guides/celery.md) run as written."""

from __future__ import annotations

import redis
from tests.docs_blocks import block_with, with_url


def test_the_celery_example_runs(redis_url: str):
    namespace: dict[str, object] = {}
    exec(with_url(block_with("def charge(self, order)"), redis_url), namespace)
    namespace["app"].close()  # type: ignore[attr-defined]
    r = redis.Redis.from_url(redis_url)
    assert r.get("order:order-7:charged") == b"yes"
    assert r.get("fencekit:idem:{charge:order-7}") == b"done"
    r.close()
