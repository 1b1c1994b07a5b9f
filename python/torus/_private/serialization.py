"""The value layout of docs/python.md: the only module that knows it.

A Python value is pickle protocol 5 (cloudpickle) with out-of-band buffers:

    0      1   0xC1
    1      1   kind: b'P' a value, b'E' a task's exception, b'K' keyword-argument names
    2      2   zero
    4      4   nbuf (u32 LE)
    8      8   inband: length of the pickle stream (u64 LE)
    16  16*n   per buffer: offset from the value's start, length (u64, u64 LE)
    ...        the pickle stream
    ...        the buffers, each on a 64-byte boundary of the value

Anything not starting with 0xC1 is a msgpack document written by C++.

`serialize` returns the parts without joining them, so `_core.put` copies each buffer once,
straight into the shared-memory store. `deserialize` slices the buffer `_core.get` returned,
so a numpy array comes back read-only over that memory (zero copy), and the memoryview slices
keep the store's buffer alive while the array lives.
"""
from __future__ import annotations

import pickle
import struct
import threading
from typing import Any, List, Sequence, Tuple

import cloudpickle
import msgpack

MAGIC = 0xC1
KIND_VALUE = ord("P")
KIND_ERROR = ord("E")
KIND_KWARGS = ord("K")  # names of the trailing keyword arguments of a call (Python only)
_HEADER = struct.Struct("<BBHIQ")  # magic, kind, zero, nbuf, inband
_BUFENT = struct.Struct("<QQ")
ALIGN = 64

# From this size a value goes through the node's shared-memory store instead of inline in a
# message (the core's kInlineLimit): task arguments are put first, return values come back in
# pieces.
INLINE_LIMIT = 100 * 1024

_ctx = threading.local()


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class _Collector:
    """Object ids of ObjectRefs pickled inside the value being serialized."""

    def __init__(self) -> None:
        self.ids: List[Any] = []


def record_nested_id(object_id) -> None:
    """Called by ObjectRef.__reduce__: the ref travels inside a value."""
    col = getattr(_ctx, "collector", None)
    if col is not None:
        col.ids.append(object_id)


def _dumps(obj: Any, buffers: list) -> bytes:
    return cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)


# Values the standard (C) pickler writes exactly as cloudpickle would: built-in scalars, and small
# lists, tuples and dicts of them. They hold no ObjectRef and nothing pickled by reference to a
# module (a class or function of __main__ must go by value, which only cloudpickle does), and no
# out-of-band buffer. Creating cloudpickle's Python-level Pickler costs ~10 us per value, most of
# an actor call's return path; the C pickler takes well under 1 us for these.
_SCALARS = frozenset((bytes, str, int, float, bool, type(None)))
_SHALLOW_MAX = 16


def _plain(obj: Any) -> bool:
    t = type(obj)
    if t in _SCALARS:
        return True
    if (t is tuple or t is list) and len(obj) <= _SHALLOW_MAX:
        for x in obj:
            if type(x) not in _SCALARS:
                return False
        return True
    if t is dict and len(obj) <= _SHALLOW_MAX:
        for k, v in obj.items():
            if type(k) not in _SCALARS or type(v) not in _SCALARS:
                return False
        return True
    return False


def _plain_value(obj: Any, kind: int) -> bytes:
    inband = pickle.dumps(obj, protocol=5)
    return _HEADER.pack(MAGIC, kind, 0, 0, len(inband)) + inband


def serialize(obj: Any, kind: int = KIND_VALUE) -> Tuple[int, List[Tuple[int, Any]], List[Any]]:
    """-> (size, parts, nested_ids); parts are (offset, buffer) to copy into a value of `size`."""
    if _plain(obj):
        data = _plain_value(obj, kind)
        return len(data), [(0, data)], []
    col = _Collector()
    prev = getattr(_ctx, "collector", None)
    _ctx.collector = col
    buffers: List[pickle.PickleBuffer] = []
    try:
        inband = _dumps(obj, buffers)
    finally:
        _ctx.collector = prev
    raws = []
    for b in buffers:
        try:
            raws.append(b.raw())
        except BufferError:  # not contiguous: one copy, in band of the buffer list
            raws.append(memoryview(bytes(b)))
    nbuf = len(raws)
    head_len = _HEADER.size + _BUFENT.size * nbuf
    pos = head_len + len(inband)
    table = []
    for r in raws:
        pos = _align(pos)
        table.append((pos, r.nbytes))
        pos += r.nbytes
    size = pos
    head = bytearray(head_len)
    _HEADER.pack_into(head, 0, MAGIC, kind, 0, nbuf, len(inband))
    for i, (off, ln) in enumerate(table):
        _BUFENT.pack_into(head, _HEADER.size + i * _BUFENT.size, off, ln)
    parts: List[Tuple[int, Any]] = [(0, bytes(head) + inband)]
    for (off, _), r in zip(table, raws):
        parts.append((off, r))
    return size, parts, col.ids


def join(size: int, parts: Sequence[Tuple[int, Any]]) -> bytes:
    """One contiguous bytes object of a serialized value (task arguments, return values)."""
    if len(parts) == 1 and parts[0][0] == 0 and len(parts[0][1]) == size:
        return bytes(parts[0][1])
    out = bytearray(size)
    for off, buf in parts:
        mv = memoryview(buf).cast("B")
        out[off:off + mv.nbytes] = mv
    return bytes(out)


def serialize_to_bytes(obj: Any, kind: int = KIND_VALUE) -> Tuple[bytes, List[Any]]:
    size, parts, nested = serialize(obj, kind)
    return join(size, parts), nested


def is_python_value(buf) -> bool:
    mv = memoryview(buf)
    return mv.nbytes >= 1 and mv[0] == MAGIC


def kind_of(buf) -> int:
    """KIND_* of a Python value; 0 for msgpack."""
    mv = memoryview(buf).cast("B")
    if mv.nbytes >= _HEADER.size and mv[0] == MAGIC:
        return mv[1]
    return 0


def deserialize(buf) -> Any:
    """The value; an 'E' value yields the exception object (the caller raises it)."""
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    if mv.nbytes == 0:
        return None
    if mv[0] != MAGIC:
        return msgpack.unpackb(mv, raw=False, strict_map_key=False)
    if mv.nbytes < _HEADER.size:
        raise ValueError("truncated Torus value header")
    magic, kind, _zero, nbuf, inband = _HEADER.unpack_from(mv, 0)
    p = _HEADER.size
    bufs = []
    for i in range(nbuf):
        off, ln = _BUFENT.unpack_from(mv, p + i * _BUFENT.size)
        if off + ln > mv.nbytes:
            raise ValueError("Torus value buffer out of range")
        bufs.append(mv[off:off + ln])
    start = p + nbuf * _BUFENT.size
    if start + inband > mv.nbytes:
        raise ValueError("truncated Torus value pickle stream")
    return pickle.loads(mv[start:start + inband], buffers=bufs)


def dumps_function(obj: Any) -> bytes:
    """A function or class, pickled once for export to the head's KV store."""
    return cloudpickle.dumps(obj, protocol=5)


def loads_function(data) -> Any:
    return pickle.loads(data)


def msgpack_dumps(obj: Any) -> bytes:
    """A value as C++ reads it (cross-language calls)."""
    return msgpack.packb(obj, use_bin_type=True)
