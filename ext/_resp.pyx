# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""RESP request encoder, compiled: byte-identical to ``fencekit._resp_py``.

``fencekit._resp_py`` is the specification (framing rules, error messages);
this module produces the same bytes and raises the same ``EncodeError`` for the
same inputs, only faster. How it stays fast on the EVALSHA hot path:

- two passes over the arguments: the first validates them and sums the exact
  frame size, the second writes into one ``bytes`` object allocated once at
  that size (no join, no resize, no intermediate buffer);
- ``bytes``, ``bytearray``, ``str`` (its cached UTF-8), contiguous
  ``memoryview`` and machine-size ``int`` are framed straight from their
  memory with no per-argument Python object; only floats, big ints and
  non-contiguous views go through a temporary ``bytes``;
- the ``$7 EVALSHA $40 <sha>`` frame is built once per SHA and cached.

Containers that are not tuples are copied into one, so no Python code can
change an argument list between the two passes; the second pass also checks
every write against the allocated size and fails instead of overflowing if an
argument was resized in between (a finalizer touching a ``bytearray``).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_Clear
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.math cimport isfinite
from libc.string cimport memcpy

from fencekit.errors import EncodeError

cdef extern from "Python.h":
    # PyObject* variants of the type checks, so the argument loops do no
    # reference counting on borrowed items.
    bint _is_bytes "PyBytes_Check"(PyObject* o)
    char* _bytes_data "PyBytes_AS_STRING"(PyObject* o)
    Py_ssize_t _bytes_size "PyBytes_GET_SIZE"(PyObject* o)
    bint _is_bytearray "PyByteArray_Check"(PyObject* o)
    char* _bytearray_data "PyByteArray_AS_STRING"(PyObject* o)
    Py_ssize_t _bytearray_size "PyByteArray_GET_SIZE"(PyObject* o)
    bint _is_str "PyUnicode_Check"(PyObject* o)
    const char* _utf8 "PyUnicode_AsUTF8AndSize"(PyObject* o, Py_ssize_t* size)
    bint _is_bool "PyBool_Check"(PyObject* o)
    bint _is_int "PyLong_Check"(PyObject* o)
    long long _int_value "PyLong_AsLongLongAndOverflow"(PyObject* o, int* overflow)
    bint _is_float "PyFloat_Check"(PyObject* o)
    double _float_value "PyFloat_AS_DOUBLE"(PyObject* o)
    bint _is_memoryview "PyMemoryView_Check"(PyObject* o)
    bint _is_tuple_exact "PyTuple_CheckExact"(PyObject* o)
    # No ``except`` clause: a failure (released or non-contiguous view) is
    # cleared by the caller, which then takes the slow path.
    int _get_buffer "PyObject_GetBuffer"(PyObject* o, Py_buffer* view, int flags)

cdef enum:
    _SLOW = -2          # the argument needs a temporary bytes (float, big int, ...)
    _INT_BUF = 24       # "-9223372036854775808" fits
    # where an argument sits, for error messages (same text as the pure module)
    _IN_ARGS = 0
    _IN_KEYS = 1
    _IN_COMMAND = 2

cdef str _ACCEPTED = "bytes, bytearray, memoryview, str, int or float"
cdef Py_ssize_t _PREFIX_CACHE_LIMIT = 1024
cdef dict _prefix_cache = {}


# -- error messages ----------------------------------------------------------

cdef str _where(int kind, Py_ssize_t i, Py_ssize_t n):
    if kind == _IN_ARGS:
        return f"args[{i}]"
    if kind == _IN_KEYS:
        return f"keys[{i}]"
    return f"commands[{n}][{i}]"


cdef object _type_error(str where, object arg):
    if isinstance(arg, bool):
        return EncodeError(f"{where}: cannot encode a bool (pass an int or bytes explicitly)")
    return EncodeError(f"{where}: cannot encode a {type(arg).__name__} (expected {_ACCEPTED})")


cdef object _container_error(str what, object items):
    return EncodeError(f"{what} must be a sequence of arguments, not {type(items).__name__}")


cdef tuple _as_tuple(str what, object items):
    """``items`` as a tuple (tuples as is); a lone str/bytes is refused, not split."""
    if _is_tuple_exact(<PyObject*>items):
        return <tuple>items
    if isinstance(items, (str, bytes, bytearray, memoryview)):
        raise _container_error(what, items)
    try:
        return tuple(items)
    except TypeError:
        raise _container_error(what, items) from None


# -- number formatting -------------------------------------------------------

cdef inline Py_ssize_t _udigits(unsigned long long v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


cdef inline char* _put_udec(char* p, unsigned long long v, Py_ssize_t ndigits) noexcept nogil:
    """Write ``v`` in decimal as exactly ``ndigits`` characters; return the end."""
    cdef char* q = p + ndigits
    while True:
        q -= 1
        q[0] = <char>(48 + v % 10)
        v //= 10
        if q == p:
            break
    return p + ndigits


cdef inline Py_ssize_t _format_int(char* buf, long long v) noexcept nogil:
    """Decimal text of ``v`` into ``buf``; return its length."""
    cdef unsigned long long magnitude
    cdef Py_ssize_t sign = 0
    if v < 0:
        magnitude = <unsigned long long>(-(v + 1)) + 1
        buf[0] = b'-'
        sign = 1
    else:
        magnitude = <unsigned long long>v
    cdef Py_ssize_t nd = _udigits(magnitude)
    _put_udec(buf + sign, magnitude, nd)
    return sign + nd


cdef inline Py_ssize_t _int_len(long long v) noexcept nogil:
    if v < 0:
        return 1 + _udigits(<unsigned long long>(-(v + 1)) + 1)
    return _udigits(<unsigned long long>v)


cdef inline Py_ssize_t _bulk_size(Py_ssize_t n) noexcept nogil:
    return 1 + _udigits(<unsigned long long>n) + 2 + n + 2


cdef inline char* _put_bulk(char* p, char* end, const char* data, Py_ssize_t n) noexcept nogil:
    """``$<n>\\r\\n<data>\\r\\n`` at ``p``; NULL if it would pass ``end``."""
    cdef Py_ssize_t nd = _udigits(<unsigned long long>n)
    if end - p < 1 + nd + 2 + n + 2:
        return NULL
    p[0] = b'$'
    p = _put_udec(p + 1, <unsigned long long>n, nd)
    p[0] = b'\r'
    p[1] = b'\n'
    p += 2
    if n:
        memcpy(p, data, n)
    p += n
    p[0] = b'\r'
    p[1] = b'\n'
    return p + 2


cdef inline char* _put_header(char* p, char* end, char mark, Py_ssize_t n) noexcept nogil:
    """``<mark><n>\\r\\n`` at ``p`` (``*`` array or ``$`` bulk header)."""
    cdef Py_ssize_t nd = _udigits(<unsigned long long>n)
    if end - p < 1 + nd + 2:
        return NULL
    p[0] = mark
    p = _put_udec(p + 1, <unsigned long long>n, nd)
    p[0] = b'\r'
    p[1] = b'\n'
    return p + 2


# -- one argument: measure (pass 1) and write (pass 2) ------------------------

cdef bytes _slow_bytes(PyObject* o, int kind, Py_ssize_t i, Py_ssize_t n):
    """The frame payload of an argument without a direct memory view."""
    cdef object arg = <object>o
    if _is_int(o):
        return int.__repr__(arg).encode("ascii")
    if _is_float(o):
        if not isfinite(_float_value(o)):
            raise EncodeError(
                f"{_where(kind, i, n)}: cannot encode the non-finite float {float.__repr__(arg)}"
            )
        return float.__repr__(arg).encode("ascii")
    try:
        return arg.tobytes()
    except ValueError as exc:  # released view
        raise EncodeError(f"{_where(kind, i, n)}: cannot encode a memoryview ({exc})") from None


cdef Py_ssize_t _measure(PyObject* o, int kind, Py_ssize_t i, Py_ssize_t n) except -1:
    """Payload length of argument ``o``, or ``_SLOW``; raise EncodeError if invalid."""
    cdef Py_ssize_t size
    cdef int overflow
    cdef long long value
    cdef Py_buffer view
    if _is_bytes(o):
        return _bytes_size(o)
    if _is_str(o):
        if _utf8(o, &size) == NULL:
            PyErr_Clear()
            _raise_utf8_error(<object>o, kind, i, n)
        return size
    if _is_bool(o):
        raise _type_error(_where(kind, i, n), <object>o)
    if _is_int(o):
        value = _int_value(o, &overflow)
        if overflow:
            return _SLOW
        return _int_len(value)
    if _is_bytearray(o):
        return _bytearray_size(o)
    if _is_float(o):
        return _SLOW
    if _is_memoryview(o):
        if _get_buffer(o, &view, PyBUF_SIMPLE) == -1:
            PyErr_Clear()
            return _SLOW
        size = view.len
        PyBuffer_Release(&view)
        return size
    raise _type_error(_where(kind, i, n), <object>o)


cdef int _raise_utf8_error(object text, int kind, Py_ssize_t i, Py_ssize_t n) except -1:
    """Raise the pure module's EncodeError for a str that has no UTF-8 form."""
    try:
        str.encode(text, "utf-8")
    except UnicodeEncodeError as exc:
        raise EncodeError(
            f"{_where(kind, i, n)}: str is not encodable as UTF-8 "
            f"({exc.reason} at index {exc.start})"
        ) from None


cdef char* _write(char* p, char* end, PyObject* o, list slow, Py_ssize_t* next_slow) except NULL:
    """Frame argument ``o`` at ``p`` (already validated by ``_measure``)."""
    cdef Py_ssize_t size
    cdef int overflow
    cdef long long value
    cdef char buf[_INT_BUF]
    cdef const char* data
    cdef char* q
    cdef Py_buffer view
    if _is_bytes(o):
        q = _put_bulk(p, end, _bytes_data(o), _bytes_size(o))
    elif _is_str(o):
        data = _utf8(o, &size)
        if data == NULL:
            return NULL
        q = _put_bulk(p, end, data, size)
    elif _is_int(o) and not _is_bool(o):
        value = _int_value(o, &overflow)
        if overflow:
            q = _put_slow(p, end, slow, next_slow)
        else:
            q = _put_bulk(p, end, buf, _format_int(buf, value))
    elif _is_bytearray(o):
        q = _put_bulk(p, end, _bytearray_data(o), _bytearray_size(o))
    elif _is_memoryview(o) and _get_buffer(o, &view, PyBUF_SIMPLE) == 0:
        q = _put_bulk(p, end, <const char*>view.buf, view.len)
        PyBuffer_Release(&view)
    else:
        PyErr_Clear()
        q = _put_slow(p, end, slow, next_slow)
    if q == NULL:
        raise RuntimeError("an argument changed size while it was being encoded")
    return q


cdef inline char* _put_slow(char* p, char* end, list slow, Py_ssize_t* next_slow) noexcept:
    cdef PyObject* item
    if slow is None or next_slow[0] >= PyList_GET_SIZE(slow):
        return NULL
    item = PyList_GET_ITEM(slow, next_slow[0])
    next_slow[0] += 1
    return _put_bulk(p, end, _bytes_data(item), _bytes_size(item))


cdef Py_ssize_t _measure_all(tuple items, int kind, Py_ssize_t n, list slow) except -1:
    """Sum of the bulk frame sizes of ``items``.

    Payloads of slow arguments are appended to ``slow`` in order; when
    ``slow`` is None (the common case: no such argument so far) the first
    slow argument returns ``_SLOW`` and the caller measures again with a list.
    """
    cdef Py_ssize_t total = 0, i, size
    cdef PyObject* o
    cdef bytes extra
    for i in range(PyTuple_GET_SIZE(items)):
        o = PyTuple_GET_ITEM(items, i)
        size = _measure(o, kind, i, n)
        if size == _SLOW:
            if slow is None:
                return _SLOW
            extra = _slow_bytes(o, kind, i, n)
            slow.append(extra)
            size = len(extra)
        total += _bulk_size(size)
    return total


cdef inline char* _write_all(char* p, char* end, tuple items, list slow, Py_ssize_t* next_slow) except NULL:
    cdef Py_ssize_t i
    for i in range(PyTuple_GET_SIZE(items)):
        p = _write(p, end, PyTuple_GET_ITEM(items, i), slow, next_slow)
    return p


cdef inline Py_ssize_t _header_size(Py_ssize_t count) noexcept nogil:
    return 1 + _udigits(<unsigned long long>count) + 2


cdef inline bytes _finish(bytes out, char* p, char* end):
    if p != end:
        raise RuntimeError("an argument changed size while it was being encoded")
    return out


# -- public API --------------------------------------------------------------

def pack_command(*args):
    """One command as a RESP array of bulk strings."""
    cdef list slow = None
    cdef Py_ssize_t next_slow = 0
    cdef Py_ssize_t count = PyTuple_GET_SIZE(args)
    if count == 0:
        raise EncodeError("args: cannot encode an empty command")
    cdef Py_ssize_t total = _measure_all(args, _IN_ARGS, 0, slow)
    if total == _SLOW:
        slow = []
        total = _measure_all(args, _IN_ARGS, 0, slow)
    total += _header_size(count)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    cdef char* end = p + total
    p = _put_header(p, end, b'*', count)
    p = _write_all(p, end, args, slow, &next_slow)
    return _finish(out, p, end)


def pack_commands(commands):
    """Several commands framed back to back (one pipeline write)."""
    cdef tuple outer = _as_tuple("commands", commands)
    cdef Py_ssize_t ncommands = PyTuple_GET_SIZE(outer)
    cdef list normalized = [None] * ncommands
    cdef list slow = None
    cdef Py_ssize_t next_slow = 0
    cdef Py_ssize_t total = 0, n, count, size
    cdef tuple command
    for n in range(ncommands):
        command = _as_tuple(f"commands[{n}]", <object>PyTuple_GET_ITEM(outer, n))
        count = PyTuple_GET_SIZE(command)
        if count == 0:
            raise EncodeError(f"commands[{n}]: cannot encode an empty command")
        normalized[n] = command
        size = _measure_all(command, _IN_COMMAND, n, slow)
        if size == _SLOW:
            slow = []
            size = _measure_all(command, _IN_COMMAND, n, slow)
        total += _header_size(count) + size
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    cdef char* end = p + total
    for n in range(ncommands):
        command = <tuple><object>PyList_GET_ITEM(normalized, n)
        p = _put_header(p, end, b'*', PyTuple_GET_SIZE(command))
        if p == NULL:
            raise RuntimeError("an argument changed size while it was being encoded")
        p = _write_all(p, end, command, slow, &next_slow)
    return _finish(out, p, end)


cdef bytes _sha_prefix(object sha):
    """``$7 EVALSHA $<n> <sha>`` framed; cached per SHA (a handful per process)."""
    cdef object cached = _prefix_cache.get(sha) if isinstance(sha, (str, bytes)) else None
    if cached is not None:
        return <bytes>cached
    if not isinstance(sha, (str, bytes)):
        raise EncodeError(f"sha: cannot encode a {type(sha).__name__} (expected str or bytes)")
    cdef bytes data
    if isinstance(sha, str):
        try:
            data = str.encode(sha, "utf-8")
        except UnicodeEncodeError as exc:
            raise EncodeError(
                f"sha: str is not encodable as UTF-8 ({exc.reason} at index {exc.start})"
            ) from None
    else:
        data = bytes(memoryview(sha))
    cdef bytes prefix = b"$7\r\nEVALSHA\r\n$%d\r\n%s\r\n" % (len(data), data)
    if len(_prefix_cache) >= _PREFIX_CACHE_LIMIT:
        _prefix_cache.clear()
    _prefix_cache[sha] = prefix
    return prefix


def pack_evalsha(sha, keys, args):
    """``EVALSHA <sha> <numkeys> keys... args...`` as one RESP command (the hot path)."""
    cdef bytes prefix = _sha_prefix(sha)
    cdef tuple key_items = _as_tuple("keys", keys)
    cdef tuple arg_items = _as_tuple("args", args)
    cdef list slow = None
    cdef Py_ssize_t next_slow = 0
    cdef Py_ssize_t nkeys = PyTuple_GET_SIZE(key_items)
    cdef Py_ssize_t count = 3 + nkeys + PyTuple_GET_SIZE(arg_items)
    cdef char numkeys[_INT_BUF]
    cdef Py_ssize_t numkeys_len = _format_int(numkeys, nkeys)
    cdef Py_ssize_t prefix_len = len(prefix)
    cdef Py_ssize_t total = _header_size(count) + prefix_len + _bulk_size(numkeys_len)
    cdef Py_ssize_t size = _measure_all(key_items, _IN_KEYS, 0, slow)
    if size == _SLOW:
        slow = []
        size = _measure_all(key_items, _IN_KEYS, 0, slow)
    total += size
    size = _measure_all(arg_items, _IN_ARGS, 0, slow)
    if size == _SLOW:
        slow = []
        size = _measure_all(arg_items, _IN_ARGS, 0, slow)
    total += size
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    cdef char* end = p + total
    p = _put_header(p, end, b'*', count)
    memcpy(p, PyBytes_AS_STRING(prefix), prefix_len)
    p = _put_bulk(p + prefix_len, end, numkeys, numkeys_len)
    p = _write_all(p, end, key_items, slow, &next_slow)
    p = _write_all(p, end, arg_items, slow, &next_slow)
    return _finish(out, p, end)
