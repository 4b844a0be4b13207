"""fencekit's logging: the seed's stdout default that steps aside, the batching handler, the job lines.

The default-logger cases run in a fresh interpreter: under pytest the root
logger has handlers already, which is exactly the "application configured
logging" case.
"""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
import textwrap

import pytest

from fencekit import _log
from fencekit._log import FORMAT, JobLines, LineFormatter, LineHandler


def run_script(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=60, check=True
    )


def test_unconfigured_the_client_writes_its_info_lines_to_stdout() -> None:
    out = run_script(
        """
        from fencekit import Client
        client = Client("redis://127.0.0.1:1/0")
        client.logger.info("task %s accepted: %s/%s", "j1", "emails", "send")
        """
    )
    assert out.stdout.endswith(" INFO fencekit.client: task j1 accepted: emails/send\n")
    assert out.stderr == ""


def test_a_later_basic_config_silences_the_info_lines_and_takes_the_warnings() -> None:
    out = run_script(
        """
        import logging, sys
        from fencekit import Client
        from fencekit._log import JobLines
        client = Client("redis://127.0.0.1:1/0")
        lines = JobLines(client.logger)  # the enqueue line's fast path
        client.logger.info("before")
        lines.info("fast %s", "before")
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s",
        )
        lines.info("fast silenced")
        client.logger.info("silenced")
        client.logger.warning("kept")
        """
    )
    assert out.stdout.count("\n") == 2, out.stdout
    assert "INFO fencekit.client: before\n" in out.stdout
    assert out.stdout.endswith("INFO fencekit.client: fast before\n")
    assert out.stderr == "WARNING fencekit.client kept\n"


def test_a_later_basic_config_at_info_gets_each_line_once() -> None:
    out = run_script(
        """
        import logging, sys
        from fencekit import Client
        client = Client("redis://127.0.0.1:1/0")
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s",
        )
        client.logger.info("once")
        """
    )
    assert out.stdout == ""
    assert out.stderr == "INFO fencekit.client once\n"


def test_a_later_dict_config_of_the_fencekit_logger_takes_over() -> None:
    out = run_script(
        """
        import logging.config
        from fencekit import Client
        client = Client("redis://127.0.0.1:1/0")
        logging.config.dictConfig({
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {"err": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
            "loggers": {"fencekit": {"handlers": ["err"], "level": "ERROR"}},
        })
        client.logger.info("silenced")
        client.logger.error("shown")
        """
    )
    assert out.stdout == ""
    assert out.stderr == "shown\n"


def test_configured_first_the_client_logger_is_left_alone() -> None:
    out = run_script(
        """
        import logging, sys
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(message)s")
        from fencekit import Client
        client = Client("redis://127.0.0.1:1/0")
        assert client.logger.handlers == [] and client.logger.propagate
        client.logger.debug("debug too")
        """
    )
    assert out.stderr == "fencekit.client debug too\n"


def test_the_formatter_stamps_like_the_standard_one() -> None:
    ours, standard = LineFormatter(), logging.Formatter(FORMAT)
    for created in (1764612345.0, 1764612345.999, 1764612346.0005, 1764612399.5):
        record = logging.makeLogRecord({"name": "n", "levelname": "INFO", "msg": "m %s", "args": ("x",)})
        record.created, record.msecs = created, int((created - int(created)) * 1000)
        assert ours.format(record) == standard.format(record)
        assert ours.stamp(created) == standard.formatTime(record)


def test_lines_of_one_loop_iteration_go_out_in_one_write() -> None:
    writes: list[str] = []

    class Stream(io.StringIO):
        def write(self, s: str) -> int:
            writes.append(s)
            return len(s)

    handler = LineHandler(Stream())
    logger = logging.getLogger("test.fencekit.batch")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:

        async def main() -> list[str]:
            for i in range(5):
                logger.info("line %d", i)
            assert writes == []  # not yet: at the next iteration
            await asyncio.sleep(0)
            return list(writes)

        assert [w.count("\n") for w in asyncio.run(main())] == [5]
        logger.info("outside a loop")
        assert writes[-1].endswith("INFO test.fencekit.batch: outside a loop\n")
    finally:
        logger.removeHandler(handler)


def test_flush_all_writes_what_waits() -> None:
    stream = io.StringIO()
    handler = LineHandler(stream)

    async def main() -> None:
        handler.add("a")
        handler.add("b")
        _log.flush_all()
        assert stream.getvalue() == "a\nb\n"

    asyncio.run(main())


def test_a_broken_stream_loses_the_lines_not_the_caller(capsys: pytest.CaptureFixture[str]) -> None:
    stream = io.StringIO()
    handler = LineHandler(stream)
    stream.close()
    handler.add("x")  # ValueError inside: reported by logging's handleError, not raised
    assert "Logging error" in capsys.readouterr().err


def job_lines_setup(*handlers: logging.Handler) -> tuple[logging.Logger, JobLines]:
    logger = logging.getLogger(f"test.fencekit.lines.{len(handlers)}.{id(handlers)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for h in handlers:
        logger.addHandler(h)
    return logger, JobLines(logger)


def test_job_lines_skip_the_record_when_our_handler_is_the_only_destination() -> None:
    stream = io.StringIO()
    handler = LineHandler(stream)
    logger, lines = job_lines_setup(handler)
    assert lines.on
    assert lines._handler is handler
    lines.info("task %s started: %s/%s attempt %d of %d", "j1", "q", "op", 1, 3)
    assert stream.getvalue().endswith(" INFO " + logger.name + ": task j1 started: q/op attempt 1 of 3\n")


def test_job_lines_use_records_for_any_other_configuration() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    _, lines = job_lines_setup(LineHandler(io.StringIO()), Keep())
    assert lines._handler is None
    lines.info("task %s completed", "j2")
    assert [r.getMessage() for r in records] == ["task j2 completed"]
    assert records[0].funcName == "test_job_lines_use_records_for_any_other_configuration"

    filtered = LineHandler(io.StringIO())
    filtered.addFilter(lambda record: True)
    assert job_lines_setup(filtered)[1]._handler is None


def test_job_lines_follow_level_changes_at_refresh_and_new_handlers_within_a_second() -> None:
    stream = io.StringIO()
    logger, lines = job_lines_setup(LineHandler(stream))
    logger.setLevel(logging.WARNING)
    assert lines.on  # until the consumer's next turn
    lines.refresh()
    assert not lines.on
    logger.setLevel(logging.INFO)
    assert lines.wanted()
    records: list[logging.LogRecord] = []
    extra = logging.Handler()
    extra.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(extra)
    lines._checked -= _log.RECHECK_S + 0.1  # a second later
    lines.refresh()
    lines.info("now %s", "both")
    assert [r.getMessage() for r in records] == ["now both"]
    assert stream.getvalue().endswith("now both\n")


def test_job_lines_of_one_iteration_reach_the_handler_together_and_flush_all_hands_them_over() -> None:
    writes: list[str] = []

    class Stream(io.StringIO):
        def write(self, s: str) -> int:
            writes.append(s)
            return len(s)

    _, lines = job_lines_setup(LineHandler(Stream()))

    async def main() -> None:
        for i in range(5):
            lines.info("task %d completed", i)
        assert writes == []
        await asyncio.sleep(0)
        assert [w.count("\n") for w in writes] == [5]
        lines.info("before exit")
        _log.flush_all()  # what the pool child calls before os._exit
        assert writes[-1].endswith(": before exit\n")

    asyncio.run(main())
