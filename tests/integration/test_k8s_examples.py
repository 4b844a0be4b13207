"""The Kubernetes and KEDA examples of docs/guides/operations.md against a real pool: the YAML
parses; the Deployment's probes name the pool's /live and /ready on the port its arguments give,
and a pool started with those arguments (on a free port) answers both; the grace period covers
the pool's grace and its margin; KEDA's query names a metric the pool exports."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import yaml
from tests.docs_blocks import DOCS, blocks
from tests.fault_helpers import PoolRunner, http_body, http_status

from fencekit.runtime.services import GRACE_MARGIN

PAGE = DOCS / "guides" / "operations.md"

APP = textwrap.dedent(
    """
    class Analyse:
        queue = "analysis"
        operation = "analyse"

        @classmethod
        async def perform(cls, payload):
            return None

    WORKERS = [Analyse]
    """
)


def documents() -> dict[str, dict[str, Any]]:
    """Every YAML document of the page, by kind."""
    found = {}
    for block in blocks(PAGE):
        if block.lang == "yaml":
            for doc in yaml.safe_load_all(block.code):
                found[doc["kind"]] = doc
    return found


def test_the_kubernetes_and_keda_examples_match_a_real_pool(tmp_path: Path, redis_url: str) -> None:
    docs = documents()
    assert set(docs) == {"Deployment", "ScaledObject"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args: list[str] = container["args"]
    assert args[:4] == ["python", "-m", "fencekit.pool", "myapp:app"]
    port = int(args[args.index("--web-port") + 1])
    assert args[args.index("--web-host") + 1] == "0.0.0.0"  # reachable by the kubelet's probes
    assert container["ports"][0]["containerPort"] == port
    assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": port}
    grace = float(args[args.index("--grace") + 1])
    pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > grace + GRACE_MARGIN + pre_stop
    query = docs["ScaledObject"]["spec"]["triggers"][0]["metadata"]["query"]
    assert docs["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]

    # the container's own arguments, on a free port and loopback, against the test's Redis
    (tmp_path / "faultapp.py").write_text(APP)
    (tmp_path / "runs").mkdir()
    pool_args = args[4:]
    pool_args[pool_args.index("--web-host") + 1] = "127.0.0.1"
    i = pool_args.index("--web-port")
    del pool_args[i : i + 2]  # PoolRunner gives its own free port
    pool = PoolRunner(tmp_path, redis_url, *pool_args)
    try:
        pool.wait_ready()
        base = f"http://127.0.0.1:{pool.web_port}"
        assert http_status(f"{base}/live") == 200
        assert http_status(f"{base}/ready") == 200
        metrics = http_body(f"{base}/metrics")
    finally:
        assert pool.stop() == 0
    (metric,) = set(re.findall(r"fencekit_[a-z_]+", query))
    assert f'{metric}{{queue="analysis"}}' in metrics
