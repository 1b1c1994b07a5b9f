"""The value layout of docs/python.md (no cluster: torus._private.serialization alone)."""
import struct

import msgpack
import numpy as np
import pytest

from torus._private import serialization as s
from torus.exceptions import RayTaskError


def test_header_and_alignment():
    a = np.arange(1000, dtype=np.int64)
    b = np.ones((3, 7), dtype=np.float32)
    size, parts, nested = s.serialize({"a": a, "b": b, "x": "small"})
    head = parts[0][1]
    magic, kind, zero, nbuf, inband = struct.unpack_from("<BBHIQ", head)
    assert (magic, kind, zero, nbuf) == (0xC1, ord("P"), 0, 2)
    offs = [struct.unpack_from("<QQ", head, 16 + 16 * i) for i in range(nbuf)]
    assert [o for o, _ in offs] == [p[0] for p in parts[1:]]
    assert all(o % 64 == 0 for o, _ in offs)
    assert [n for _, n in offs] == [a.nbytes, b.nbytes]
    assert size == offs[-1][0] + offs[-1][1]
    assert len(head) == 16 + 16 * nbuf + inband
    assert nested == []


def test_round_trip_zero_copy_read_only():
    a = np.random.default_rng(0).random((256, 256))
    buf = s.join(*s.serialize(a)[:2])
    out = s.deserialize(memoryview(buf))
    assert np.array_equal(out, a)
    assert not out.flags.writeable          # a view of the (read-only) value
    assert not out.flags.owndata
    # The array's memory lies inside the value: no copy was made.
    base = np.frombuffer(buf, dtype=np.uint8)
    start = out.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    assert 0 < start < len(buf)


def test_msgpack_values_from_cpp():
    assert s.deserialize(msgpack.packb([1, "two", {"3": 4.5}, b"raw"])) == \
        [1, "two", {"3": 4.5}, b"raw"]
    assert s.kind_of(msgpack.packb(7)) == 0
    assert s.deserialize(s.msgpack_dumps({"k": [1, 2]})) == {"k": [1, 2]}


def test_error_kind_and_cause():
    try:
        raise KeyError("missing")
    except KeyError as e:
        import traceback
        err = RayTaskError("mod.f", traceback.format_exc(), e)
    data, _ = s.serialize_to_bytes(err, s.KIND_ERROR)
    assert s.kind_of(data) == ord("E")
    back = s.deserialize(data)
    assert isinstance(back, RayTaskError)
    dual = back.as_instanceof_cause()
    assert isinstance(dual, KeyError) and isinstance(dual, RayTaskError)
    assert "KeyError" in str(dual) and "missing" in str(dual)


def test_kwargs_kind():
    data, _ = s.serialize_to_bytes(("a", "b"), s.KIND_KWARGS)
    assert s.kind_of(data) == ord("K")
    assert s.deserialize(data) == ("a", "b")


def test_non_contiguous_buffers_are_copied_in():
    a = np.arange(100).reshape(10, 10)[:, ::2]
    out = s.deserialize(s.join(*s.serialize(a)[:2]))
    assert np.array_equal(out, a)


def test_truncated_value_is_refused():
    data, _ = s.serialize_to_bytes(np.ones(100))
    with pytest.raises(ValueError):
        s.deserialize(data[:40])


class _Point:  # importable from this module: pickled by reference either way
    def __init__(self, x):
        self.x = x


def test_plain_values_take_the_c_pickler_and_read_back_the_same():
    # Built-in scalars and small flat containers of them are written by the C pickler (no
    # cloudpickle Pickler per value); the layout and the reader are the same.
    for v in [b"ok", "text", 0, -7, 2**80, 1.5, True, False, None,
              (1, "a", None), [1.0, b"x"], {"k": 1, 2: "v"}, (), [], {}]:
        data, nested = s.serialize_to_bytes(v)
        assert nested == []
        assert data[0] == 0xC1 and data[1] == ord("P")
        out = s.deserialize(data)
        assert out == v and type(out) is type(v)
        size, parts, nested = s.serialize(v)
        assert s.join(size, parts) == data
    # bool stays bool, int stays int (no type folding on the fast path)
    assert s.deserialize(s.serialize_to_bytes(True)[0]) is True
    assert type(s.deserialize(s.serialize_to_bytes(1)[0])) is int


def test_values_outside_the_plain_set_still_go_through_cloudpickle():
    # Nested containers, instances, functions: cloudpickle (by value for what needs it).
    fn = lambda x: x + 1  # noqa: E731  (only cloudpickle can pickle a lambda)
    for v in [[[1, 2], [3]], {"a": [1]}, _Point(3), [fn], tuple(range(100))]:
        out = s.deserialize(s.serialize_to_bytes(v)[0])
        if isinstance(v, _Point):
            assert out.x == 3
        elif isinstance(v, list) and v and callable(v[0]):
            assert out[0](1) == 2
        else:
            assert out == v
