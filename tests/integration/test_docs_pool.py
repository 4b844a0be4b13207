"""The running-the-pool page's examples (docs/guides/pool.md) run as written."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from tests.docs_blocks import block_with, with_url

from fencekit.testing import RedisServer


async def test_the_starlette_lifespan_example_runs_the_pool(
    private_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "workers.py").write_text(
        textwrap.dedent(
            """
            class Noop:
                queue = "readme"
                operation = "noop"

                @classmethod
                async def perform(cls, payload):
                    return None

            WORKERS = [Noop]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    namespace: dict[str, object] = {"__name__": "readme_lifespan"}
    exec(with_url(block_with("lifespan"), private_redis.url()), namespace)
    app = namespace["app"]
    async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/pool")
    children = response.json()
    assert len(children) == 2
    assert all(child["ready"] for child in children)
    sys.modules.pop("myapp.workers", None)
    sys.modules.pop("myapp", None)
    await asyncio.sleep(0)
