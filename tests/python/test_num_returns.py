"""num_returns (Ray's): a task or actor method returning N values gives N ObjectRefs, each its
own object (fetched, passed on and freed on its own); an error is every return's value; a count
that does not match is the task's error; num_returns=0 gives None."""
import gc

import numpy as np
import pytest

import torus
import torus.exceptions as exc


@torus.remote(num_returns=3)
def three(x):
    return x, x + 1, x + 2


@torus.remote
def split(n):
    return tuple(range(n))


@torus.remote
def fail_after(x):
    raise KeyError(f"no {x}")


@torus.remote
def total(*xs):
    return sum(xs)


@torus.remote
class Splitter:
    def __init__(self):
        self.calls = 0

    @torus.method(num_returns=2)
    def pair(self, x):
        self.calls += 1
        return x, -x

    def triple(self, x):
        return x, x, x

    def count(self):
        return self.calls


def test_function_with_three_returns(torus_local):
    refs = three.remote(10)
    assert isinstance(refs, list) and len(refs) == 3
    assert len({r.hex() for r in refs}) == 3
    assert torus.get(refs, timeout=60) == [10, 11, 12]
    # Each return on its own, in any order.
    a, b, c = three.remote(1)
    assert torus.get(c, timeout=60) == 3
    assert torus.get(a, timeout=60) == 1
    del a, c
    gc.collect()
    assert torus.get(b, timeout=60) == 2


def test_options_num_returns_and_passing_returns_on(torus_local):
    refs = split.options(num_returns=4).remote(4)
    assert torus.get(refs, timeout=60) == [0, 1, 2, 3]
    # Returns passed as arguments to another task, some unresolved when it is submitted.
    assert torus.get(total.remote(*refs), timeout=60) == 6
    x, y = split.options(num_returns=2).remote(2)
    assert torus.get(total.remote(x, y, 10), timeout=60) == 11


def test_large_and_nested_returns(torus_local):
    @torus.remote(num_returns=2)
    def big_and_ref():
        inner = torus.put("inside")
        return np.arange(1 << 20, dtype=np.int64), [inner]

    arr_ref, box_ref = big_and_ref.remote()
    arr = torus.get(arr_ref, timeout=60)
    assert arr.shape == (1 << 20,) and int(arr[-1]) == (1 << 20) - 1
    del arr, arr_ref
    gc.collect()
    # The ref packed in the second return outlives the first and the task's worker.
    (inner,) = torus.get(box_ref, timeout=60)
    assert torus.get(inner, timeout=60) == "inside"


def test_several_large_returns_each_arrive_whole(torus_local):
    # Large returns go to the core in pieces (one copy each): the first written straight into
    # the store, the others gathered; every one must arrive whole, in its place.
    @torus.remote(num_returns=3)
    def bigs():
        return (np.arange(1 << 20, dtype=np.int64), {"b": np.full((512, 1024), 7, np.float32)},
                np.arange(3 << 18, dtype=np.int32)[::-1].copy())

    a, b, c = torus.get(list(bigs.remote()), timeout=60)
    assert a.shape == (1 << 20,) and int(a[12345]) == 12345 and int(a[-1]) == (1 << 20) - 1
    assert b["b"].shape == (512, 1024) and float(b["b"].min()) == float(b["b"].max()) == 7.0
    assert c.shape == (3 << 18,) and int(c[0]) == (3 << 18) - 1 and int(c[-1]) == 0


def test_wrong_count_is_the_tasks_error(torus_local):
    refs = split.options(num_returns=3).remote(2)
    for r in refs:
        with pytest.raises(exc.RayTaskError, match="num_returns=3"):
            torus.get(r, timeout=60)

    @torus.remote(num_returns=2)
    def scalar():
        return 5

    for r in scalar.remote():
        with pytest.raises(exc.RayTaskError, match="num_returns=2"):
            torus.get(r, timeout=60)
    # The cluster keeps serving.
    assert torus.get(three.remote(0), timeout=60) == [0, 1, 2]


def test_an_error_is_every_returns_value(torus_local):
    refs = fail_after.options(num_returns=2).remote("key")
    for r in refs:
        with pytest.raises(KeyError):
            torus.get(r, timeout=60)
        with pytest.raises(exc.RayTaskError):
            torus.get(r, timeout=60)


def test_num_returns_zero_gives_none_and_still_runs(torus_local):
    @torus.remote
    class Box:
        def __init__(self):
            self.v = None

        def set(self, v):
            self.v = v

        def get(self):
            return self.v

    box = Box.remote()
    assert box.set.options(num_returns=0).remote(7) is None
    assert torus.get(box.get.remote(), timeout=60) == 7


def test_actor_methods_with_several_returns(torus_local):
    s = Splitter.remote()
    p, n = s.pair.remote(5)
    assert torus.get([n, p], timeout=60) == [-5, 5]
    refs = s.triple.options(num_returns=3).remote("x")
    assert torus.get(refs, timeout=60) == ["x", "x", "x"]
    # Order of calls holds across single and multi-return calls.
    many = [s.pair.remote(i) for i in range(20)]
    assert torus.get([m[0] for m in many], timeout=60) == list(range(20))
    assert torus.get(s.count.remote(), timeout=60) == 21


def test_cancel_through_any_return(torus_local):
    @torus.remote(num_returns=2)
    def slow():
        import time
        time.sleep(60)
        return 1, 2

    a, b = slow.remote()
    import time
    time.sleep(0.5)
    torus.cancel(b, force=True)
    for r in (a, b):
        with pytest.raises((exc.TaskCancelledError, exc.WorkerCrashedError)):
            torus.get(r, timeout=60)
