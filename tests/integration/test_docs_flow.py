"""The flow-control page's examples (docs/guides/flow.md) run as written."""

from __future__ import annotations

from typing import Any

from tests.docs_blocks import block_with

from fencekit import Task


def test_the_flow_control_examples_declare_valid_workers_and_tasks():
    """The priority, rate-limit and concurrency-key examples run as written and say what they claim."""
    from fencekit.jobs.flow import Rate
    from fencekit.jobs.worker import inspect_worker

    prio: dict[str, Any] = {"__name__": "readme_prio"}
    exec(block_with("async def send_now(client: Client, to: str)"), prio)
    assert inspect_worker(prio["digest"]).priority == -2
    assert Task("emails", "send", {"to": "x"}, priority=3).envelope().startswith(b'{"jid":')

    rate: dict[str, Any] = {"__name__": "readme_rate"}
    exec(block_with("class CallPartner:"), rate)
    assert inspect_worker(rate["CallPartner"]).rate == Rate(50.0, 5)

    keyed: dict[str, Any] = {"__name__": "readme_keyed"}
    exec(block_with("max_concurrency=2)"), keyed)
    spec = inspect_worker(keyed["build_report"])
    assert spec.max_concurrency == 2
    assert keyed["build_report"].build("t-7", "2026-11").concurrency_key == "t-7"
    assert keyed["by_hand"].concurrency_key == "t-7"


def test_the_per_key_rate_limit_example_keys_each_call_by_its_account():
    """The per-key rate limit example runs as written: each account gets a bucket of "10/s"."""
    from fencekit.jobs.flow import Rate
    from fencekit.jobs.worker import inspect_worker

    keyed: dict[str, Any] = {"__name__": "readme_rate_key"}
    exec(block_with('rate_key=lambda p: p["account"]'), keyed)
    push = keyed["push_invoice"]
    assert inspect_worker(push).rate == Rate(10.0, 1)
    assert push.build("acme", 7).rate_key == "acme"
    assert push.build("globex", 8).rate_key == "globex"
