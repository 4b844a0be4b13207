"""``fencekit.testing.pytest`` and ``drain`` used as a user would: a test project run by pytest.

Each test writes a user's project (an app, a conftest that opts in to the
plugin, test files) with pytester and runs it in a subprocess pytest, then
checks the outcomes -- including tests that must fail, which prove that
``drain`` reports a task's failure and a run that cannot drain.
"""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

USER_APP = textwrap.dedent(
    """
    from fencekit import App

    ROWS = {}

    class Charge:
        queue = "billing"
        operation = "charge"

        @classmethod
        async def perform(cls, payload):
            ROWS[payload["order"]] = "paid"
            return {"order": payload["order"], "status": "paid"}

    class Refund:
        queue = "billing"
        operation = "refund"
        retry = False

        @classmethod
        async def perform(cls, payload):
            raise ValueError("refunds are off")

    app = App([Charge, Refund])
    """
)

USER_INI = textwrap.dedent(
    """
    [pytest]
    asyncio_default_fixture_loop_scope = function
    filterwarnings = error
    """
)

USER_TESTS = textwrap.dedent(
    """
    import asyncio

    import pytest
    from fencekit import Client, Task
    from fencekit.errors import DrainTimeout
    from fencekit.testing import drain, drain_sync

    from userapp import ROWS, app


    @pytest.mark.asyncio
    async def test_a_view_enqueues_the_job_runs_the_row_is_updated(fencekit_client):
        jid = await fencekit_client.enqueue(Task("billing", "charge", {"order": 7}))
        drained = await drain(app)
        assert drained.results() == [{"order": 7, "status": "paid"}]
        assert drained.succeeded[0].jid == jid and ROWS[7] == "paid"


    @pytest.mark.asyncio
    async def test_each_test_starts_from_an_empty_redis(fencekit_client):
        drained = await drain(app)
        assert drained.succeeded == () and drained.failed == ()


    @pytest.mark.asyncio
    async def test_a_failure_is_reported_with_its_exception(fencekit_client):
        await fencekit_client.enqueue(Task("billing", "refund", {"order": 7}))
        await fencekit_client.enqueue(Task("billing", "charge", {"order": 8}))
        await fencekit_client.enqueue(Task("billing", "no-such-operation", {}))
        drained = await drain(app)
        assert [s.operation for s in drained.succeeded] == ["charge"]
        assert sorted(f.operation for f in drained.failed) == ["no-such-operation", "refund"]
        refund = next(f for f in drained.failed if f.operation == "refund")
        assert isinstance(refund.error, ValueError) and str(refund.error) == "refunds are off"
        assert drained.dead == 1 and drained.retried == 0


    @pytest.mark.asyncio
    async def test_must_fail_because_the_task_failed(fencekit_client):
        await fencekit_client.enqueue(Task("billing", "refund", {"order": 9}))
        drained = await drain(app)
        drained.raise_failures()


    @pytest.mark.asyncio
    async def test_a_task_scheduled_far_ahead_is_reported_at_the_timeout(fencekit_client):
        await fencekit_client.enqueue(Task("billing", "charge", {"order": 1}), delay=3600)
        with pytest.raises(DrainTimeout, match="billing: 0 pending, 1 scheduled"):
            await drain(app, timeout=0.5)


    def test_a_sync_test_drains_with_its_own_loop(fencekit_redis_url):
        async def enqueue():
            async with Client() as client:  # FENCEKIT_REDIS_URL points at the test's Redis
                await client.enqueue(Task("billing", "charge", {"order": 3}))

        asyncio.run(enqueue())
        drained = drain_sync(app)
        assert drained.results("charge") == [{"order": 3, "status": "paid"}]


    def test_must_fail_because_the_expected_result_is_wrong(fencekit_redis_url):
        async def enqueue():
            async with Client(fencekit_redis_url) as client:
                await client.enqueue(Task("billing", "charge", {"order": 4}))

        asyncio.run(enqueue())
        assert drain_sync(app).results() == [{"order": 4, "status": "refunded"}]
    """
)


def _project(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(userapp=USER_APP, test_user=USER_TESTS)
    pytester.makeini(USER_INI)


def test_a_user_project_drains_its_app_and_sees_results_and_failures(pytester: pytest.Pytester) -> None:
    _project(pytester)
    result = pytester.runpytest_subprocess("-p", "fencekit.testing.pytest", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=2)
    result.stdout.fnmatch_lines(
        [
            "E       ValueError: refunds are off",  # raise_failures() raised the task's own exception
            "FAILED test_user.py::test_must_fail_because_the_task_failed*",
            "FAILED test_user.py::test_must_fail_because_the_expected_result_is_wrong*",
        ]
    )


def test_the_plugin_opts_in_through_pytest_plugins_in_the_conftest(pytester: pytest.Pytester) -> None:
    _project(pytester)
    pytester.makeconftest('pytest_plugins = ["fencekit.testing.pytest"]')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "view_enqueues or sync_test")
    result.assert_outcomes(passed=2)


def test_without_opting_in_there_are_no_fencekit_fixtures(pytester: pytest.Pytester) -> None:
    _project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "view_enqueues")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'fencekit_client' not found*"])
