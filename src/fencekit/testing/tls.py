"""A TLS-only Redis for tests: a throw-away CA, a server certificate, a server.

:func:`make_certificates` writes a CA and a server certificate for
``127.0.0.1`` / ``localhost`` (and a client certificate signed by the same
CA) with the ``openssl`` command line tool. :class:`TLSRedisServer` starts a
:class:`~fencekit.testing.RedisServer` that listens only on a TLS port
(``--port 0 --tls-port P``) with those files.

::

    with TLSRedisServer(tmp_path) as server:
        url = server.url()   # rediss://127.0.0.1:P/0?ssl_ca_certs=.../ca.crt
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from typing_extensions import Self

from fencekit.testing import RedisServer, find_server_binary, free_port

__all__ = ["Certificates", "TLSRedisServer", "TLSUnavailable", "make_certificates"]


class TLSUnavailable(RuntimeError):
    """No ``openssl`` tool, or a server binary built without TLS."""


@dataclass(frozen=True, slots=True)
class Certificates:
    """Paths of the generated PEM files."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    tool = shutil.which("openssl")
    if tool is None:
        raise TLSUnavailable("the openssl command line tool is needed to generate test certificates")
    result = subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise TLSUnavailable(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()[-500:]}")


def make_certificates(directory: str | Path, *, days: int = 2) -> Certificates:
    """A CA plus server and client certificates it signed, in ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ext = out / "server.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    client_ext = out / "client.ext"
    client_ext.write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    days_text = str(days)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=out)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", days_text,
        "-subj", "/CN=fencekit test CA", "-out", "ca.crt", cwd=out,
    )  # fmt: skip
    for name, extfile in (("server", ext), ("client", client_ext)):
        _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=out)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN=fencekit test {name}",
                 "-out", f"{name}.csr", cwd=out)  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", days_text, "-sha256", "-extfile", str(extfile), "-out", f"{name}.crt", cwd=out,
        )  # fmt: skip
    return Certificates(
        ca_cert=out / "ca.crt",
        ca_key=out / "ca.key",
        server_cert=out / "server.crt",
        server_key=out / "server.key",
        client_cert=out / "client.crt",
        client_key=out / "client.key",
    )


class TLSRedisServer(RedisServer):
    """A :class:`RedisServer` reachable only over TLS (plain port off).

    ``client_auth`` False (default) lets clients connect without a
    certificate (``tls-auth-clients no``); True requires one signed by the CA.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        binary: str | None = None,
        flavor: str | None = None,
        client_auth: bool = False,
        appendonly: bool = False,
        config: dict[str, Any] | None = None,
    ) -> None:
        base = Path(directory or tempfile.mkdtemp(prefix="fencekit-tls-"))
        self.certs = make_certificates(base / "certs")
        tls_port = free_port(host)
        tls_config: dict[str, Any] = {
            "port": 0,
            "tls-port": tls_port,
            "tls-cert-file": self.certs.server_cert,
            "tls-key-file": self.certs.server_key,
            "tls-ca-cert-file": self.certs.ca_cert,
            "tls-auth-clients": "yes" if client_auth else "no",
            **(config or {}),
        }
        super().__init__(
            base / "redis",
            port=tls_port,
            host=host,
            binary=binary or find_server_binary(flavor),
            appendonly=appendonly,
            config=tls_config,
        )
        self._tls_base = base
        self._own_tls_dir = directory is None
        self.client_auth = client_auth

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.certs.ca_cert))
        if self.client_auth:
            context.load_cert_chain(str(self.certs.client_cert), str(self.certs.client_key))
        return context

    def _open(self) -> socket.socket:
        raw = socket.create_connection((self.host, self.port), timeout=0.5)
        try:
            return self._context().wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise

    def start(self, timeout: float = 10.0) -> Self:
        try:
            super().start(timeout)
        except RuntimeError as exc:
            if "tls" in str(exc).lower():
                raise TLSUnavailable(f"{self.binary} cannot serve TLS: {exc}") from exc
            raise
        return self

    def url(self, db: int = 0, *, client_cert: bool | None = None) -> str:
        """``rediss://`` URL with the CA (and the client certificate when required)."""
        password = self.config.get("requirepass")
        auth = f":{password}@" if password else ""
        query = f"ssl_ca_certs={self.certs.ca_cert}"
        if self.client_auth if client_cert is None else client_cert:
            query += f"&ssl_certfile={self.certs.client_cert}&ssl_keyfile={self.certs.client_key}"
        return f"rediss://{auth}{self.host}:{self.port}/{db}?{query}"

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        extra: dict[str, Any] = {"ssl": True, "ssl_ca_certs": str(self.certs.ca_cert)}
        if self.client_auth:
            extra |= {"ssl_certfile": str(self.certs.client_cert), "ssl_keyfile": str(self.certs.client_key)}
        return super().client(db, **extra, **kwargs)

    def cleanup(self) -> None:
        super().cleanup()
        if self._own_tls_dir:
            shutil.rmtree(self._tls_base, ignore_errors=True)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the server answers over TLS."""
        deadline = time.monotonic() + timeout
        while not self.ping():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"TLS server on port {self.port} did not answer")
            time.sleep(0.05)
