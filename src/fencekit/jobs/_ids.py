"""Job ids: UUIDv7 (RFC 9562), time-sortable, generated without a dependency.

48 bits of Unix milliseconds, then 12 bits of a per-process counter that
keeps ids of the same millisecond in order, then 62 random bits. Forked
children reseed (:func:`reset`) so two processes never share a sequence.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> str:
    """A new UUIDv7 as its canonical 36-character string."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count up
        else:
            _counter += 1
            if _counter > 0xFFF:  # 4096 ids in one ms: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        counter = _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    return str(uuid.UUID(int=value))


def reset() -> None:
    """Forget the sequence state (call in a freshly forked child)."""
    global _last_ms, _counter
    _last_ms = 0
    _counter = 0
