"""Type stub of the compiled RESP encoder (``ext/_resp.pyx``).

Same API and output as the pure-Python specification ``fencekit._redis._resp_py``.
"""

from collections.abc import Iterable, Sequence

from fencekit._redis._resp_py import RespArg

def pack_command(*args: RespArg) -> bytes: ...
def pack_commands(commands: Iterable[Sequence[RespArg]]) -> bytes: ...
def pack_evalsha(sha: str | bytes, keys: Sequence[RespArg], args: Sequence[RespArg]) -> bytes: ...
