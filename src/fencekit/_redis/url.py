"""Redis URLs: parsed once into a :class:`RedisTarget`, TLS options included.

Accepted URLs::

    redis://[[username]:password@]host[:port][/db][?options]
    rediss://...                      the same over TLS
    unix://[[username]:password@]/path/to/socket[?db=N&options]
    redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/master_name[?options]
    redis+cluster://[[username]:password@]host[:port][,host[:port]...][/][?options]
    rediss+cluster://...              a Redis Cluster over TLS

Cluster hosts are seed nodes (any of the cluster's nodes; without a port
6379): the slot map is read from the first that answers, and every node is
then reached at the address the cluster gives for it, with the URL's
credentials, TLS and timeouts. A cluster has one database: ``db`` other than 0
is refused. Sentinel hosts without a port use 26379; ``username``/``password`` authenticate
against the master, ``sentinel_username``/``sentinel_password`` (query) against
the sentinels. Query options: ``db``, ``socket_timeout``,
``socket_connect_timeout`` (Sentinel and Cluster default to 5 s and 2 s; plain URLs keep no
timeout, as redis-py does), and for ``rediss://`` ``ssl_cert_reqs``
(``none``/``optional``/``required``), ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile`` and ``ssl_check_hostname`` (``true``/``false``, also
``1``/``0``, ``yes``/``no``, ``on``/``off``).

The TLS options are read here, once, into a typed :class:`TlsOptions`; the
redis-py clients (:meth:`RedisTarget.connection_kwargs`) and the hot-path
connection (:meth:`TlsOptions.context`) both use it, so one URL always means
one TLS configuration.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, unquote

from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from fencekit.errors import ConfigError

__all__ = ["DEFAULT_URL", "RedisTarget", "TlsOptions", "parse_url", "redact_url", "with_db"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
SENTINEL_PORT = 26379
SENTINEL_SOCKET_TIMEOUT = 5.0
SENTINEL_CONNECT_TIMEOUT = 2.0

_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster", "rediss+cluster")
_TLS_SCHEMES = ("rediss", "rediss+cluster")
_CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_SSL_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
_URL_OPTIONS = ("db", "socket_timeout", "socket_connect_timeout", "sentinel_username", "sentinel_password")
_KNOWN_OPTIONS = frozenset((*_URL_OPTIONS, *_SSL_OPTIONS))
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TRUE = frozenset(("1", "true", "yes", "on"))
_FALSE = frozenset(("0", "false", "no", "off"))


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """The TLS settings of a ``rediss://`` URL (redis-py's defaults when absent)."""

    cert_reqs: str = "required"
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True

    @property
    def verifies_hostname(self) -> bool:
        """Whether the server's name is checked (never without certificate verification)."""
        return self.check_hostname and self.cert_reqs != "none"

    def redis_py_kwargs(self) -> dict[str, Any]:
        """The ``ssl_*`` keyword arguments of a redis-py connection."""
        return {
            "ssl": True,
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_ca_certs": self.ca_certs,
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_check_hostname": self.verifies_hostname,
        }

    def context(self, display: str) -> ssl.SSLContext:
        """An ``ssl.SSLContext`` with the same meaning (for the hot-path connection).

        ``display`` names the target in the error when a certificate file
        cannot be loaded.
        """
        context = ssl.create_default_context()
        context.check_hostname = self.verifies_hostname
        context.verify_mode = _CERT_REQS[self.cert_reqs]
        try:
            if self.certfile or self.keyfile:
                context.load_cert_chain(self.certfile or str(self.keyfile), self.keyfile)
            if self.ca_certs:
                context.load_verify_locations(cafile=self.ca_certs)
        except OSError as exc:  # ssl.SSLError included
            raise ConfigError(f"cannot load TLS certificates for {display}: {exc}") from exc
        return context


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
    tls: TlsOptions | None = None
    socket_timeout: float | None = None
    socket_connect_timeout: float | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    seeds: tuple[tuple[str, int], ...] = ()

    @property
    def is_sentinel(self) -> bool:
        return self.scheme == "redis+sentinel"

    @property
    def is_cluster(self) -> bool:
        """A Redis Cluster URL: ``seeds`` are the nodes asked for the slot map."""
        return self.scheme in _CLUSTER_SCHEMES

    def node(self, host: str, port: int) -> RedisTarget:
        """One node of a cluster as a plain target: this URL's credentials, TLS and timeouts.

        With TLS, the server name checked is the node's as the cluster
        announces it (``host``), as redis-py's cluster client does.
        """
        return replace(
            self, scheme="rediss" if self.tls is not None else "redis", host=host, port=port, seeds=()
        )

    def redacted(self) -> str:
        """The target as a URL with every password replaced by ``***``."""
        auth = ""
        if self.username or self.password:
            auth = f"{self.username or ''}{':***' if self.password else ''}@"
        if self.is_sentinel:
            hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"{self.scheme}://{auth}{hosts}/{self.master_name}?db={self.db}"
        if self.is_cluster:
            return f"{self.scheme}://{auth}{','.join(_joined(h, p) for h, p in self.seeds)}/"
        if self.path is not None:
            return f"unix://{auth}{self.path}?db={self.db}"
        return f"{self.scheme}://{auth}{self.host}:{self.port}/{self.db}"

    def connection_kwargs(self, *, aio: bool = False) -> dict[str, Any]:
        """Keyword arguments of redis-py's connections (retries off), asyncio ones if ``aio``."""
        kwargs: dict[str, Any] = {
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "retry": _no_retry(aio),
        }
        if self.path is not None:
            kwargs["unix_socket_path"] = self.path
        elif not self.is_sentinel and not self.is_cluster:
            kwargs["host"] = self.host
            kwargs["port"] = self.port
        if self.tls is not None:
            kwargs |= self.tls.redis_py_kwargs()
        return kwargs

    def handshake(self, name: str | None) -> list[tuple[str, tuple[bytes | str | int, ...]]]:
        """``(label, command)`` of what a new connection sends first: AUTH, SELECT, CLIENT SETNAME and,
        behind Sentinel, ROLE (the master the sentinels named must say it is one)."""
        steps: list[tuple[str, tuple[bytes | str | int, ...]]] = []
        if self.password is not None:
            auth = (self.username, self.password) if self.username else (self.password,)
            steps.append(("AUTH", (b"AUTH", *auth)))
        if self.db:
            steps.append((f"SELECT {self.db}", (b"SELECT", self.db)))
        if name is not None:
            steps.append((f"CLIENT SETNAME {name!r}", (b"CLIENT", b"SETNAME", name)))
        if self.is_sentinel:
            steps.append(("ROLE", (b"ROLE",)))
        return steps

    def sentinel_kwargs(self, *, aio: bool = False) -> dict[str, Any]:
        """Keyword arguments of the connections to the sentinels themselves (asyncio ones if ``aio``)."""
        return {
            "username": self.sentinel_username,
            "password": self.sentinel_password,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "retry": _no_retry(aio),
        }


def _no_retry(aio: bool) -> Retry | AsyncRetry:
    """redis-py's "never re-send" (I4), of the kind its client wants: redis-py 8.2 converts a
    synchronous ``Retry`` given to an asyncio client, with a warning."""
    return AsyncRetry(NoBackoff(), 0) if aio else Retry(NoBackoff(), 0)


def with_db(target: RedisTarget, db: int) -> RedisTarget:
    """The same target on another database number (a cluster has only database 0)."""
    if target.is_cluster and db:
        raise ConfigError(f"a Redis Cluster has only database 0, not {db}: {target.redacted()}")
    return replace(target, db=db)


def _joined(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def redact_url(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***`` (for errors and logs)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    auth, _, tail = rest.rpartition("@")
    user = auth.partition(":")[0]
    return f"{scheme}://{user}:***@{tail}"


def _float_option(options: dict[str, str], name: str, default: float | None) -> float | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"{name} must be positive, got {raw!r}")
    return value


def _bool_option(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered not in _TRUE | _FALSE:
        raise ConfigError(f"{name} must be true or false, got {raw!r}")
    return lowered in _TRUE


def _tls(options: dict[str, str]) -> TlsOptions:
    reqs = options.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ConfigError(f"ssl_cert_reqs must be none, optional or required, got {reqs!r}")
    return TlsOptions(
        cert_reqs=reqs,
        ca_certs=options.get("ssl_ca_certs") or None,
        certfile=options.get("ssl_certfile") or None,
        keyfile=options.get("ssl_keyfile") or None,
        check_hostname=_bool_option(options, "ssl_check_hostname", True),
    )


def _host_port(item: str, default_port: int, url: str) -> tuple[str, int]:
    host, sep, port_text = item.rpartition(":") if not item.endswith("]") else (item, "", "")
    if not sep:
        host, port_text = item, ""
    host = host.strip("[]")
    if not host:
        raise ConfigError(f"missing host in Redis URL {redact_url(url)!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"bad port {port_text!r} in Redis URL {redact_url(url)!r}")
    return host, int(port_text)


def _db(text: str | None, url: str) -> int:
    if text is None or text == "":
        return 0
    if not text.isdigit():
        raise ConfigError(f"db must be a non-negative integer, got {text!r} in {redact_url(url)!r}")
    return int(text)


def parse_url(url: str) -> RedisTarget:
    """Parse a Redis URL into a :class:`RedisTarget` or raise :class:`ConfigError`."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"not a Redis URL: {url!r} (expected e.g. {DEFAULT_URL})")
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"unsupported URL scheme {scheme!r} in {redact_url(url)!r}; "
            f"use one of {', '.join(s + '://' for s in _SCHEMES)}"
        )
    rest, _, query = rest.partition("?")
    try:
        raw_options = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"malformed query string in {redact_url(url)!r}") from None
    options = {k: v[-1] for k, v in raw_options.items()}
    unknown = sorted(set(options) - _KNOWN_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} in {redact_url(url)!r}")
    if scheme not in _TLS_SCHEMES and any(k in options for k in _SSL_OPTIONS):
        raise ConfigError("ssl_* options need a rediss:// or rediss+cluster:// URL")
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
    timed = sentinel or scheme in _CLUSTER_SCHEMES  # several servers: one that hangs must not hang us
    common: dict[str, Any] = {
        "username": username,
        "password": password,
        "socket_timeout": _float_option(
            options, "socket_timeout", SENTINEL_SOCKET_TIMEOUT if timed else None
        ),
        "socket_connect_timeout": _float_option(
            options, "socket_connect_timeout", SENTINEL_CONNECT_TIMEOUT if timed else None
        ),
    }

    db_text = options.get("db")
    if scheme == "unix":
        path = unquote(rest)
        if not path.startswith("/"):
            raise ConfigError(f"unix:// URL needs an absolute socket path: {redact_url(url)!r}")
        return RedisTarget(scheme, path=path, db=_db(db_text, url), **common)

    hostpart, _, pathpart = rest.partition("/")
    if scheme in _CLUSTER_SCHEMES:
        if not hostpart:
            raise ConfigError(f"no cluster nodes in {redact_url(url)!r}")
        seeds = tuple(_host_port(h, 6379, url) for h in hostpart.split(","))
        path_db = pathpart.strip("/")
        if path_db not in ("", "0") or db_text not in (None, "", "0"):
            raise ConfigError(
                f"a Redis Cluster has only database 0; remove the database from {redact_url(url)!r}"
            )
        return RedisTarget(
            scheme,
            host=seeds[0][0],
            port=seeds[0][1],
            seeds=seeds,
            tls=_tls(options) if scheme == "rediss+cluster" else None,
            **common,
        )
    if sentinel:
        if not hostpart:
            raise ConfigError(f"no sentinel hosts in {redact_url(url)!r}")
        hosts = tuple(_host_port(h, SENTINEL_PORT, url) for h in hostpart.split(","))
        master = unquote(pathpart.strip("/"))
        if not master:
            raise ConfigError(f"missing master name in {redact_url(url)!r}")
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
        raise ConfigError(f"conflicting db in path and query of {redact_url(url)!r}")
    return RedisTarget(
        scheme,
        host=host,
        port=port,
        db=_db(path_db or db_text, url),
        tls=_tls(options) if scheme == "rediss" else None,
        **common,
    )
