"""What keeps the admin pages safe to expose: headers, Basic Auth, origin and CSRF checks, form limits.

Basic Auth alone does not protect the POST actions: the browser resends the
credentials on every request, cross-site ones included. So a POST must also
name this same host in ``Origin`` (or ``Referer``) and carry the CSRF token
of this process, which a foreign page cannot read.

Same-origin means nothing if any host name reaches the pages: a site that
rebinds its DNS name to 127.0.0.1 is "same-origin" with itself. So the admin
pages and ``/metrics`` answer only requests whose ``Host`` is one of the
configured names (:func:`host_allowed`; loopback by default), and refuse
others with 421.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request

__all__ = [
    "LOOPBACK_NAMES",
    "MAX_FORM_BYTES",
    "SECURITY_HEADERS",
    "Credentials",
    "NoSniff",
    "allowed_hosts",
    "host_allowed",
    "process_csrf_token",
    "read_form",
    "same_origin",
]

MAX_FORM_BYTES = 8192
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARD_BINDS = ("0.0.0.0", "::", "")


def allowed_hosts(setting: str | None, bind: str) -> frozenset[str] | None:
    """The host names the pages answer to: the setting's comma-separated names (``*``: any, None
    returned), else the loopback names plus the address the server binds when it is a specific one."""
    if setting is not None:
        given = [n.strip().lower() for n in setting.split(",") if n.strip()]
        return None if "*" in given else frozenset(n.strip("[]") for n in given)
    names = set(LOOPBACK_NAMES)
    if bind not in _WILDCARD_BINDS:
        names.add(bind.strip("[]").lower())
    return frozenset(names)


def host_allowed(request: Request, hosts: frozenset[str] | None) -> bool:
    """True when the request's ``Host`` (its port aside) is one of ``hosts`` (None: any)."""
    if hosts is None:
        return True
    host = request.headers.get("host", "").strip().lower()
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in hosts


#: Sent with every HTML page. The policy allows no script at all (the pages
#: need none), so an escaping slip could still not run script, and only
#: inline styles (the layout template inlines the stylesheet).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

#: The CSRF token of this process, made on first use.
_process_token: str | None = None


def process_csrf_token() -> str:
    """The random CSRF token shared by every app created in this process.

    One per process rather than per app, so several mounts of the app (or a
    restart of the web server) keep accepting forms rendered earlier.
    """
    global _process_token
    if _process_token is None:
        _process_token = secrets.token_urlsafe(32)
    return _process_token


@dataclass(frozen=True, slots=True)
class Credentials:
    """The one username and password accepted by HTTP Basic Auth."""

    username: bytes
    password: bytes

    def match(self, header: str | None) -> bool:
        """Constant-time check of an ``Authorization: Basic`` header."""
        if not header:
            return False
        scheme, _, param = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(param.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(b":")
        if not sep:
            return False
        # Both comparisons always run, so the timing does not tell which one failed.
        user_ok = secrets.compare_digest(user, self.username)
        password_ok = secrets.compare_digest(password, self.password)
        return user_ok and password_ok


def _netloc(url: str) -> str:
    return urlsplit(url).netloc.rpartition("@")[2].lower()


def same_origin(request: Request) -> bool:
    """True if the request says it comes from a page of this same host."""
    host = request.headers.get("host", "").lower()
    if not host:
        return False
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and _netloc(origin) == host
    referer = request.headers.get("referer")
    return referer is not None and _netloc(referer) == host


async def read_form(request: Request) -> dict[str, str] | None:
    """The urlencoded form of a POST (last value of each field); None when too large.

    Read by hand, with a byte limit checked while streaming, so a client
    cannot make the process buffer an arbitrarily large body.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[-1] for k, v in fields.items()}


class NoSniff:
    """ASGI middleware: ``X-Content-Type-Options: nosniff`` on every response (the JSON routes,
    ``/metrics`` and the redirects too; the HTML pages carry :data:`SECURITY_HEADERS`)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-content-type-options" for name, _ in headers):
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)
