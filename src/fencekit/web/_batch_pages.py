"""The handlers of a batch's page and its cancel action.

``GET /admin/batch/<bid>`` shows one batch (:mod:`fencekit.web._batch_view`): its
progress, its counts by state, its children by state linked to their pages, its
callbacks and its parent. ``POST /admin/cancel-batch`` (form fields ``bid`` and
``csrf``) cancels its children not final yet, as ``Batch.cancel`` does, behind the
checks of every admin form (same origin, CSRF token: :meth:`fencekit.web.app._Admin.checked_post`,
without the known-queue check, since a batch's children may live in any queue).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from fencekit._redis.keys import JID_RULE, is_jid
from fencekit.errors import ConfigError, PayloadError, StoreError
from fencekit.web._answers import error, notice, root
from fencekit.web._pages import render_batch
from fencekit.web._security import SECURITY_HEADERS

if TYPE_CHECKING:
    from fencekit.web.source import AdminSource

__all__ = ["BatchPages"]

UNKNOWN = "no such batch: it finished longer ago than it is kept, or the id is wrong"


class BatchPages:
    """Mixed into the app's handlers (``source``, ``token`` and ``_redis_down`` are theirs)."""

    source: AdminSource
    token: str

    if TYPE_CHECKING:

        def _redis_down(self, request: Request, exc: StoreError) -> Response: ...

    async def batch_page(self, request: Request) -> Response:
        """One batch: progress, counts, children by state, callbacks, parent, and "cancel"."""
        bid = str(request.path_params.get("bid", ""))
        if not is_jid(bid):
            return error(request, 400, "Bad request", f"give a batch id: {JID_RULE}")
        try:
            view = await self.source.batch(bid)
        except StoreError as exc:
            return self._redis_down(request, exc)
        except PayloadError as exc:  # bookkeeping written by hand, or by another version
            return error(request, 500, "Unreadable batch", str(exc))
        if view is None:
            return error(request, 404, "Not found", UNKNOWN)
        body = render_batch(
            view, root=root(request), token=self.token, notice=notice(request), now=time.time()
        )
        return HTMLResponse(body, headers=SECURITY_HEADERS)

    async def cancel_batch(self, request: Request, form: dict[str, str]) -> Response:
        """Cancel the children of batch ``bid`` not final yet (behind checked_post)."""
        bid = form.get("bid", "")
        if not is_jid(bid):
            return error(request, 400, "Bad request", "missing batch id")
        try:
            cancelled = await self.source.cancel_batch(bid)
        except ConfigError:
            return error(request, 404, "Not found", UNKNOWN)
        except PayloadError as exc:
            return error(request, 500, "Unreadable batch", str(exc))
        self.source.logger.warning("admin: cancelled batch %s (%d task(s) not final yet)", bid, cancelled)
        return RedirectResponse(
            f"{root(request)}/admin/batch/{quote(bid, safe='')}?done=batch-cancelled&n={cancelled}", 303
        )
