"""The Kubernetes and KEDA examples of docs/guides/operations.md against a real pool: the YAML
parses; the Deployment's probes name the pool's /live and /ready on the port its arguments give,
and a pool started with those arguments and environment (on a free port) answers both, and
answers /metrics to a request naming the pod's IP; the grace period covers the preStop pause,
the pool's grace (given or the default) and the supervisor's margin; KEDA's query names a metric
the pool exports."""

from __future__ import annotations

import os
import re
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.docs_blocks import DOCS, blocks
from tests.fault_helpers import PoolRunner, http_body, http_status

from fencekit._options import defaults
from fencekit.runtime.services import GRACE_MARGIN
from fencekit.settings import PoolSettings

POD_IP = "10.12.34.56"
"""What the downward API would give ``$(POD_IP)``: Prometheus's requests name it as their host."""

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


def get_as(url: str, host: str) -> tuple[int, str]:
    """GET ``url`` with ``Host: host`` (as a scrape of the pod's IP sends it): status and body."""
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), bytes(response.read()).decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read()).decode()


def test_the_kubernetes_and_keda_examples_match_a_real_pool(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    given = args[args.index("--grace") + 1] if "--grace" in args else None
    grace = float(given) if given is not None else float(defaults(PoolSettings)["grace"])
    pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > grace + GRACE_MARGIN + pre_stop
    query = docs["ScaledObject"]["spec"]["triggers"][0]["metadata"]["query"]
    assert docs["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    for name, entry in env.items():  # the container's environment, $(POD_IP) expanded as the kubelet does
        if "value" in entry:
            monkeypatch.setenv(name, entry["value"].replace("$(POD_IP)", POD_IP))
    assert POD_IP in (web_hosts := os.environ["FENCEKIT_WEB_HOSTS"])
    assert "127.0.0.1" in web_hosts.split(",")  # kubectl port-forward still reaches /admin

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
        scraped = get_as(f"{base}/metrics", f"{POD_IP}:{port}")  # Prometheus at the pod's IP
        misdirected = get_as(f"{base}/metrics", f"other.example:{port}")
    finally:
        assert pool.stop() == 0
    (metric,) = set(re.findall(r"fencekit_[a-z_]+", query))
    assert f'{metric}{{queue="analysis"}}' in metrics
    assert scraped[0] == 200
    assert f'{metric}{{queue="analysis"}}' in scraped[1]
    assert misdirected[0] == 421
    procs = args[args.index("--procs") + 1]
    assert f"fencekit_desired_workers {float(procs)}" in metrics.splitlines()
