"""The parts of a stalled child's report that need no Redis: threshold, bounded task list, stack file.

The stack file is exercised on a real process blocked in ``time.sleep``:
it registers the dump exactly as a pool child does, and the supervisor's
side asks twice through the same file (truncated and rewound each time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from fencekit.pool._child import _INHERITED_SIGNALS
from fencekit.pool._stall import (
    MAX_TASKS,
    STACK_SIGNAL,
    RunningTask,
    StackFile,
    _tasks_part,
    annotate,
    stall_threshold,
)

BLOCKED = textwrap.dedent(
    """
    import sys, time
    from fencekit.pool._stall import register_stack_dump
    register_stack_dump(int(sys.argv[1]))
    print("ready", flush=True)
    time.sleep(120)  # the blocked line
    """
).strip()
BLOCKED_LINE = next(n for n, line in enumerate(BLOCKED.splitlines(), 1) if "time.sleep" in line)


def test_the_stall_threshold_is_four_ticks_and_at_most_half_the_hang_timeout() -> None:
    assert stall_threshold(30.0) == 2.0
    assert stall_threshold(8.0) == 2.0
    assert stall_threshold(3.0) == 1.5
    assert stall_threshold(1.0) == 1.0  # never under two ticks


def test_the_task_list_is_bounded_and_says_how_many_more() -> None:
    tasks = [RunningTask("q", f"jid{i}", "op", 0, 30.0 - i) for i in range(MAX_TASKS + 5)]
    text = _tasks_part(tasks, None)
    assert text.splitlines()[0] == f"it was running {MAX_TASKS + 5} tasks (durations on Redis's clock):"
    assert "  q/op jid jid0 attempt 1, running for 30.0s" in text.splitlines()
    assert "jid20" not in text
    assert text.splitlines()[-1] == "  and 5 more"
    assert _tasks_part(None, "no answer within 0.5s") == (
        "the tasks it was running could not be read from Redis: no answer within 0.5s"
    )


def test_the_dump_signal_is_none_the_pool_handles() -> None:
    assert STACK_SIGNAL not in _INHERITED_SIGNALS


def test_a_frame_is_followed_by_its_source_line(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("x = 1\ntime.sleep(5)\n")
    text = annotate(f'Current thread 0x1 (most recent call first):\n  File "{source}", line 2 in f')
    assert text.splitlines() == [
        "  Current thread 0x1 (most recent call first):",
        f'    File "{source}", line 2 in f',
        "        time.sleep(5)",
    ]


async def test_a_blocked_process_dumps_its_stack_into_the_file_each_time_it_is_asked() -> None:
    stack = StackFile(0)
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, str(stack.fd)], pass_fds=(stack.fd,), stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        blocked = f'File "<string>", line {BLOCKED_LINE} in <module>'
        for _ in range(200):  # "ready" is printed just before the sleep: ask until it is there
            dump = await stack.dump(lambda sig: os.kill(proc.pid, sig))
            assert dump is not None
            if blocked in dump:
                break
        # asked again, the file holds the new dump only: truncated and rewound
        dump = await stack.dump(lambda sig: os.kill(proc.pid, sig))
        assert dump is not None
        assert dump.count("most recent call first") == 1, dump
        assert blocked in dump, dump
        os.kill(proc.pid, signal.SIGSTOP)  # a stopped process cannot answer: the wait is bounded
        assert await stack.dump(lambda sig: os.kill(proc.pid, sig)) is None
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        stack.close()
