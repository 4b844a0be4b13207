"""What the handlers answer besides their pages: error pages, the outcome notice, the mount root.

Shared by :mod:`fencekit.web.app` and :mod:`fencekit.web._queue_pages`. A
notice comes from a fixed set of messages keyed by ``?done=``: nothing of
the request is echoed back but numbers.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from fencekit.web._pages import render_error
from fencekit.web._security import SECURITY_HEADERS

__all__ = ["NOTICES", "error", "json_error", "notice", "root"]

NOTICES = {
    "cancelled": "Task cancelled.",
    "not-cancelled": "The task had finished already: nothing was cancelled.",
    "retried": "The failed task is enqueued again (attempt 1).",
    "retry-gone": "That task is no longer a kept failure (run again already, or pushed out).",
    "run-now": "The scheduled task is at the head of its queue.",
    "run-now-gone": "That task is no longer scheduled (it started, or was cancelled).",
    "revived": "Dead letter re-enqueued.",
    "gone": "That dead letter was already gone (re-enqueued or dropped).",
    "paused": "Queue paused: within about a second no consumer on any host claims from it "
    "(running tasks go on; enqueues are accepted).",
    "paused-already": "That queue was paused already.",
    "resumed": "Queue resumed: consumers claim from it again within about a second.",
    "resumed-already": "That queue was not paused.",
}

BULK_DONE = {"cancel": "cancelled", "run-now": "started now", "retry": "enqueued again", "delete": "deleted"}


def root(request: Request) -> str:
    """Where the app is mounted ("" at the top level), for links and redirects."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def notice(request: Request) -> str | None:
    """The outcome of the last action, from a fixed set of messages (never echoed input)."""
    params = request.query_params
    done = params.get("done")
    if done in NOTICES:
        return NOTICES[done]
    count = params.get("n", "")
    n = int(count) if count.isdigit() else 0
    if done == "purged":
        return f"Queue purged: {n} pending task(s) dropped."
    if done == "batch-cancelled":
        if not n:
            return "Nothing to cancel: every child of the batch was final already."
        return f"Batch cancelled: {n} child task(s) that were not final stopped; the batch completes."
    action = params.get("action", "")
    if done == "bulk" and action in BULK_DONE:
        of = params.get("of", "")
        matched = int(of) if of.isdigit() else n
        more = " (the first matches only: submit again for the rest)" if params.get("cut") == "1" else ""
        return f"{n} of {matched} selected task(s) {BULK_DONE[action]}{more}."
    return None


def json_error(request: Request, status: int, title: str, message: str) -> Response:
    return JSONResponse({"error": title, "detail": message}, status_code=status)


def error(
    request: Request,
    status: int,
    title: str,
    message: str,
    *,
    refresh: int | None = None,
    redis: str | None = None,
) -> Response:
    body = render_error(title, message, root=root(request), refresh=refresh, redis=redis)
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)
