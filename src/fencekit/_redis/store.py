"""Connections to Redis: URL parsing, client construction, error translation.

Accepted URLs::

    redis://[[username]:password@]host[:port][/db][?options]
    rediss://...                      the same over TLS
    unix://[[username]:password@]/path/to/socket[?db=N&options]
    redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/master_name[?options]

Sentinel hosts without a port use 26379; ``username``/``password`` authenticate
against the master, ``sentinel_username``/``sentinel_password`` (query) against
the sentinels. Query options: ``db``, ``socket_timeout``,
``socket_connect_timeout`` (Sentinel defaults 5 s and 2 s; plain URLs keep no
timeout, as redis-py does), and for ``rediss://`` ``ssl_cert_reqs``,
``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``.

Every client built here has redis-py's retries turned off: a command is sent
once, and a lost reply surfaces as :class:`~fencekit.errors.StoreError`
(DESIGN I4). :func:`run` and :func:`arun` execute a :class:`~fencekit._redis.scripts.Call`
by SHA, loading the script on ``NOSCRIPT`` (the script did not run, so that is
not a re-send), and translate errors at this one boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast
from urllib.parse import parse_qs, unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.retry import Retry

from fencekit._redis.scripts import Call
from fencekit.errors import ConfigError, StoreError, script_error

DEFAULT_URL = "redis://127.0.0.1:6379/0"
SENTINEL_PORT = 26379
SENTINEL_SOCKET_TIMEOUT = 5.0
SENTINEL_CONNECT_TIMEOUT = 2.0

_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")
_SSL_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
_URL_OPTIONS = ("db", "socket_timeout", "socket_connect_timeout", "sentinel_username", "sentinel_password")
_KNOWN_OPTIONS = frozenset((*_URL_OPTIONS, *_SSL_OPTIONS))


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where Redis is and how to talk to it; parsed from a URL by :func:`parse_url`."""

    scheme: str
    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ssl_options: tuple[tuple[str, str], ...] = ()
    socket_timeout: float | None = None
    socket_connect_timeout: float | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)

    @property
    def is_sentinel(self) -> bool:
        return self.scheme == "redis+sentinel"

    def redacted(self) -> str:
        """The target as a URL with every password replaced by ``***``."""
        auth = ""
        if self.username or self.password:
            auth = f"{self.username or ''}{':***' if self.password else ''}@"
        if self.is_sentinel:
            hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"{self.scheme}://{auth}{hosts}/{self.master_name}?db={self.db}"
        if self.path is not None:
            return f"unix://{auth}{self.path}?db={self.db}"
        return f"{self.scheme}://{auth}{self.host}:{self.port}/{self.db}"

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by redis-py's sync and asyncio connections."""
        kwargs: dict[str, Any] = {
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        if self.path is not None:
            kwargs["unix_socket_path"] = self.path
        elif not self.is_sentinel:
            kwargs["host"] = self.host
            kwargs["port"] = self.port
        if self.tls:
            kwargs["ssl"] = True
            for name, value in self.ssl_options:
                kwargs[name] = value == "true" if name == "ssl_check_hostname" else value
        return kwargs


def _float_option(options: dict[str, str], name: str, default: float | None) -> float | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {raw!r}")
    return value


def _host_port(item: str, default_port: int, url: str) -> tuple[str, int]:
    host, sep, port_text = item.rpartition(":") if not item.endswith("]") else (item, "", "")
    if not sep:
        host, port_text = item, ""
    host = host.strip("[]")
    if not host:
        raise ConfigError(f"missing host in Redis URL {_redact_raw(url)!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"bad port {port_text!r} in Redis URL {_redact_raw(url)!r}")
    return host, int(port_text)


def _redact_raw(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    auth, _, tail = rest.rpartition("@")
    user = auth.partition(":")[0]
    return f"{scheme}://{user}:***@{tail}"


def parse_url(url: str) -> RedisTarget:
    """Parse a Redis URL into a :class:`RedisTarget` or raise :class:`ConfigError`."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"not a Redis URL: {url!r} (expected e.g. {DEFAULT_URL})")
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"unsupported URL scheme {scheme!r} in {_redact_raw(url)!r}; "
            f"use one of {', '.join(s + '://' for s in _SCHEMES)}"
        )
    rest, _, query = rest.partition("?")
    try:
        raw_options = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"malformed query string in {_redact_raw(url)!r}") from None
    options = {k: v[-1] for k, v in raw_options.items()}
    unknown = sorted(set(options) - _KNOWN_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} in {_redact_raw(url)!r}")
    if scheme != "rediss" and any(k in options for k in _SSL_OPTIONS):
        raise ConfigError("ssl_* options need a rediss:// URL")
    if scheme != "redis+sentinel" and any(k.startswith("sentinel_") for k in options):
        raise ConfigError("sentinel_* options need a redis+sentinel:// URL")

    username = password = None
    if "@" in rest:
        auth, _, rest = rest.rpartition("@")
        user_text, colon, pass_text = auth.partition(":")
        username = unquote(user_text) or None
        password = unquote(pass_text) if colon else None
        if not colon and user_text:  # redis://password@host is redis-py's reading too
            username, password = None, unquote(user_text)

    sentinel = scheme == "redis+sentinel"
    default_timeout = SENTINEL_SOCKET_TIMEOUT if sentinel else None
    default_connect = SENTINEL_CONNECT_TIMEOUT if sentinel else None
    common: dict[str, Any] = {
        "username": username,
        "password": password,
        "socket_timeout": _float_option(options, "socket_timeout", default_timeout),
        "socket_connect_timeout": _float_option(options, "socket_connect_timeout", default_connect),
    }

    db_text = options.get("db")
    if scheme == "unix":
        path = unquote(rest)
        if not path.startswith("/"):
            raise ConfigError(f"unix:// URL needs an absolute socket path: {_redact_raw(url)!r}")
        return RedisTarget(scheme, path=path, db=_db(db_text, url), **common)

    hostpart, _, pathpart = rest.partition("/")
    if sentinel:
        if not hostpart:
            raise ConfigError(f"no sentinel hosts in {_redact_raw(url)!r}")
        hosts = tuple(_host_port(h, SENTINEL_PORT, url) for h in hostpart.split(","))
        master = unquote(pathpart.strip("/"))
        if not master:
            raise ConfigError(f"missing master name in {_redact_raw(url)!r}")
        return RedisTarget(
            scheme,
            db=_db(db_text, url),
            sentinels=hosts,
            master_name=master,
            sentinel_username=options.get("sentinel_username") or None,
            sentinel_password=options.get("sentinel_password") or None,
            **common,
        )

    host, port = _host_port(hostpart, 6379, url)
    path_db = pathpart.strip("/")
    if path_db and db_text is not None and path_db != db_text:
        raise ConfigError(f"conflicting db in path and query of {_redact_raw(url)!r}")
    ssl_options = tuple(sorted((k, v) for k, v in options.items() if k in _SSL_OPTIONS))
    return RedisTarget(
        scheme,
        host=host,
        port=port,
        db=_db(path_db or db_text, url),
        tls=scheme == "rediss",
        ssl_options=ssl_options,
        **common,
    )


def _db(text: str | None, url: str) -> int:
    if text is None or text == "":
        return 0
    if not text.isdigit():
        raise ConfigError(f"db must be a non-negative integer, got {text!r} in {_redact_raw(url)!r}")
    return int(text)


# clients ----------------------------------------------------------------------


def _sentinel_kwargs(target: RedisTarget) -> dict[str, Any]:
    return {
        "username": target.sentinel_username,
        "password": target.sentinel_password,
        "socket_timeout": target.socket_timeout,
        "socket_connect_timeout": target.socket_connect_timeout,
        "retry": Retry(NoBackoff(), 0),
    }


def sync_client(target: RedisTarget | str, **overrides: Any) -> redis.Redis:
    """A synchronous redis-py client for ``target`` with retries off."""
    if isinstance(target, str):
        target = parse_url(target)
    kwargs = target.connection_kwargs() | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target), **kwargs
        )
        return cast(redis.Redis, sentinel.master_for(target.master_name, **kwargs))  # type: ignore[no-untyped-call]
    return redis.Redis(**kwargs)


def async_client(target: RedisTarget | str, **overrides: Any) -> redis.asyncio.Redis:
    """An asyncio redis-py client for ``target`` with retries off."""
    if isinstance(target, str):
        target = parse_url(target)
    kwargs = target.connection_kwargs() | overrides
    if target.is_sentinel:
        assert target.master_name is not None
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target), **kwargs
        )
        return cast(redis.asyncio.Redis, sentinel.master_for(target.master_name, **kwargs))
    return redis.asyncio.Redis(**kwargs)


async def resolve_address(target: RedisTarget) -> tuple[str, int] | str:
    """Where the master is now: ``(host, port)``, or a socket path for ``unix://``.

    For Sentinel this asks the sentinels (each is tried; one that is down is
    skipped); raises :class:`StoreError` when none knows the master.
    """
    if target.path is not None:
        return target.path
    if not target.is_sentinel:
        return (target.host, target.port)
    assert target.master_name is not None
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target)
    )
    try:
        host, port = await sentinel.discover_master(target.master_name)
    except (RedisError, OSError) as exc:
        raise StoreError(f"no sentinel knows master {target.master_name!r}: {exc}") from exc
    finally:
        for conn in sentinel.sentinels:
            await conn.aclose()
    return (str(host), int(port))


def with_db(target: RedisTarget, db: int) -> RedisTarget:
    """The same target on another database number."""
    return replace(target, db=db)


def as_text(value: bytes | str) -> str:
    """A reply as ``str``, whatever the client's ``decode_responses``."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# error translation --------------------------------------------------------------


def translate_error(exc: BaseException) -> BaseException:
    """Our exception for a redis-py or socket error (script refusals included)."""
    if isinstance(exc, ResponseError):
        mapped = script_error(str(exc))
        if mapped is not None:
            return mapped
    if isinstance(exc, (RedisError, OSError)):
        return StoreError(f"{type(exc).__name__}: {exc}")
    return exc


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise redis-py and socket errors as fencekit errors."""
    try:
        yield
    except (TimeoutError, RedisError, OSError) as exc:
        raise translate_error(exc) from exc


def run(client: redis.Redis | redis.RedisCluster, call: Call) -> Any:
    """Execute ``call`` synchronously by SHA; load the script on ``NOSCRIPT``."""
    keys_and_args = (*call.keys, *call.args)
    with translated():
        try:
            return client.evalsha(call.script.sha, len(call.keys), *keys_and_args)
        except NoScriptError:
            client.script_load(call.script.source)
            return client.evalsha(call.script.sha, len(call.keys), *keys_and_args)


async def arun(client: redis.asyncio.Redis | redis.asyncio.RedisCluster, call: Call) -> Any:
    """Execute ``call`` on an asyncio client by SHA; load the script on ``NOSCRIPT``."""
    keys_and_args = (*call.keys, *call.args)
    with translated():
        try:
            return await client.evalsha(call.script.sha, len(call.keys), *keys_and_args)
        except NoScriptError:
            await client.script_load(call.script.source)
            return await client.evalsha(call.script.sha, len(call.keys), *keys_and_args)


async def apipeline(
    client: redis.asyncio.Redis, calls: Sequence[Call], *, wait: tuple[int, int] | None = None
) -> list[Any]:
    """Run script ``calls`` in one round trip on an asyncio client.

    Scripts missing on the server are loaded once and only their calls run
    again (they did not run). A call's own error reply comes back translated
    in its slot; a connection failure raises :class:`StoreError`. With
    ``wait=(replicas, timeout_ms)`` a ``WAIT`` follows the calls in the same
    round trip (Redis refuses it inside scripts) and its reply -- how many
    replicas confirmed -- is appended to the results.
    """
    with translated():
        results = await _evalsha_pipeline(client, calls, wait)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            for source in {calls[i].script.sha: calls[i].script.source for i in missing}.values():
                await client.script_load(source)
            again = await _evalsha_pipeline(client, [calls[i] for i in missing], wait)
            for i, result in zip(missing, again):
                results[i] = result
            if wait is not None:
                results[-1] = again[-1]
    return [translate_error(r) if isinstance(r, BaseException) else r for r in results]


async def _evalsha_pipeline(
    client: redis.asyncio.Redis, calls: Sequence[Call], wait: tuple[int, int] | None = None
) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for c in calls:
        pipe.evalsha(c.script.sha, len(c.keys), *c.keys, *c.args)
    if wait is not None:
        pipe.execute_command("WAIT", *wait)
    return list(await pipe.execute(raise_on_error=False))


async def aclose_client(client: redis.asyncio.Redis) -> None:
    """Close an asyncio client, and the sentinel connections of a Sentinel-managed one."""
    await client.aclose()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()
