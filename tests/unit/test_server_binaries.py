"""Every server the suite builds runs the binary the run asked for.

``.ci/run`` runs the integration tests a second time with
``FENCEKIT_TEST_SERVER=valkey``; a test that builds a ``RedisServer`` (or a
Sentinel or Cluster deployment) without the session's ``server_binary`` would
quietly start redis-server in that pass. The session's own servers are checked
at run time (``tests/servers.py``); this test reads the suite's source and
finds every server built some other way. TLS servers are the exception: only
Debian's redis-server is built with TLS, so they take
``find_server_binary("redis")``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVERS = {"RedisServer", "LocalSentinel", "LocalCluster"}
TLS_SERVERS = {"TLSRedisServer"}


def sources() -> list[Path]:
    return [*sorted((ROOT / "tests").rglob("*.py")), ROOT / "bench" / "conftest.py"]


def called_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def wrong_builds(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line`` of each server built without the binary it must use."""
    tree = ast.parse(path.read_text(), filename=str(path))
    wrong = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = called_name(node)
        if name not in SERVERS | TLS_SERVERS:
            continue
        binary = next((kw.value for kw in node.keywords if kw.arg == "binary"), None)
        text = ast.unparse(binary) if binary is not None else ""
        tls = name in TLS_SERVERS or any(kw.arg == "tls" for kw in node.keywords)  # LocalCluster(tls=...)
        wanted = "find_server_binary('redis')" if tls else "server_binary"
        if text != wanted:
            where = f"{path.relative_to(root)}:{node.lineno}"
            wrong.append(f"{where}: {name}(binary={text or '<missing>'}), wanted binary={wanted}")
    return wrong


def test_every_server_a_test_builds_takes_the_session_binary() -> None:
    wrong = [line for path in sources() for line in wrong_builds(path)]
    assert wrong == []


def test_the_check_finds_a_server_built_without_the_binary(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(tmp_path, server_binary):\n"
        "    RedisServer(tmp_path)\n"
        "    testing.LocalCluster(tmp_path, binary=None)\n"
        "    TLSRedisServer(tmp_path, binary=server_binary)\n"
        "    RedisServer(tmp_path, binary=server_binary)\n"
        "    TLSRedisServer(tmp_path, binary=find_server_binary('redis'))\n"
        "    LocalCluster(tmp_path, tls=certs, binary=server_binary)\n"
        "    LocalCluster(tmp_path, tls=certs, binary=find_server_binary('redis'))\n"
    )
    found = wrong_builds(probe, root=tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "3", "4", "7"]
