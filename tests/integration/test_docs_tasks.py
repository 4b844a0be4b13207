"""The writing-tasks page's examples (docs/guides/tasks.md) run as written."""

from __future__ import annotations

import os
import signal
import threading
import time

import redis
from tests.docs_blocks import block_with, with_url


def test_the_job_queue_example_runs_until_sigterm(redis_url: str):
    r = redis.Redis.from_url(redis_url)

    def stop_when_sent() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if r.hget("fencekit:{emails}:stats", "processed") == b"1":
                os.kill(os.getpid(), signal.SIGTERM)  # the server's own handler stops it
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=stop_when_sent)
    watcher.start()
    code = with_url(block_with("class SendEmailWorker"), redis_url.rsplit("/", 1)[0])
    exec(code, {"__name__": "readme_example"})
    watcher.join()
    keys = r.keys("email:*:status")
    assert len(keys) == 1
    assert r.get(keys[0]) == b"sent"
    r.close()
