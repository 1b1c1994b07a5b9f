"""Actors: sync, threaded, async, named, get_if_exists, kill, exit, restart after SIGKILL."""
import asyncio
import os
import signal
import threading
import time

import pytest

import torus
from torus import exceptions as exc

from helpers import wait_actor_dead, wait_until


@torus.remote
class Counter:
    def __init__(self, start=0):
        self.n = start

    def inc(self, by=1):
        self.n += by
        return self.n

    def get(self):
        return self.n

    def pid(self):
        return os.getpid()

    def ids(self):
        c = torus.get_runtime_context()
        return c.get_actor_id(), c.get_node_id()

    def fail(self):
        raise KeyError("no such thing")

    def leave(self):
        torus.actor.exit_actor()


@torus.remote
class Rendezvous:
    """Passes only if `n` calls run at the same time (a threaded actor)."""

    def __init__(self, n):
        self.barrier = threading.Barrier(n, timeout=20)

    def meet(self):
        return self.barrier.wait()


@torus.remote
class AsyncWorker:
    def __init__(self):
        self.running = 0
        self.peak = 0

    async def work(self, t):
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(t)
        self.running -= 1
        return t

    async def await_ref(self, ref_list):
        return await ref_list[0]

    def peak_seen(self):
        return self.peak


@torus.remote
class ThreadProbe:
    """What a sync actor's calls see of their Python thread."""

    def __init__(self):
        self.local = threading.local()

    def mark(self, v):
        self.local.v = v
        return threading.get_ident()

    def seen(self):
        return threading.get_ident(), getattr(self.local, "v", None)


@torus.remote
def plus_one(x):
    return x + 1


@torus.remote
def call_actor(handle, by):
    return torus.get(handle.inc.remote(by))


def test_sync_actor_keeps_state_in_order(torus_local):
    c = Counter.remote(10)
    refs = [c.inc.remote() for _ in range(20)]
    assert torus.get(refs) == list(range(11, 31))
    assert torus.get(c.inc.remote(by=5)) == 35


def test_sync_actor_calls_from_one_caller_run_on_one_python_thread(torus_local):
    # As in Ray: thread-local state (and libraries that keep per-thread state) set in one call
    # is there in the next.
    p = ThreadProbe.remote()
    ident = torus.get(p.mark.remote("kept"))
    seen = torus.get([p.seen.remote() for _ in range(20)])
    assert seen == [(ident, "kept")] * 20
    torus.kill(p)


def test_actor_method_exception(torus_local):
    c = Counter.remote()
    with pytest.raises(KeyError) as ei:
        torus.get(c.fail.remote())
    assert isinstance(ei.value, exc.RayTaskError)
    assert "Counter.fail" in str(ei.value) or "fail" in str(ei.value)
    assert torus.get(c.inc.remote()) == 1   # the actor survives its method's exception


def test_actor_init_failure(torus_local):
    @torus.remote
    class Broken:
        def __init__(self):
            raise RuntimeError("cannot start")

        def ping(self):
            return 1

    b = Broken.remote()
    with pytest.raises((exc.RayActorError, RuntimeError)) as ei:
        torus.get(b.ping.remote(), timeout=60)
    assert "cannot start" in str(ei.value)


def test_handle_passed_to_task(torus_local):
    c = Counter.remote()
    assert torus.get(call_actor.remote(c, 7)) == 7
    assert torus.get(c.get.remote()) == 7


def test_threaded_actor_runs_calls_concurrently(torus_local):
    r = Rendezvous.options(max_concurrency=4).remote(4)
    assert sorted(torus.get([r.meet.remote() for _ in range(4)], timeout=60)) == [0, 1, 2, 3]


def test_async_actor(torus_local):
    a = AsyncWorker.remote()
    t0 = time.monotonic()
    assert torus.get([a.work.remote(1.0) for _ in range(8)], timeout=60) == [1.0] * 8
    assert time.monotonic() - t0 < 6   # concurrent on the actor's event loop, not 8 s
    assert torus.get(a.peak_seen.remote()) > 1
    assert torus.get(a.await_ref.remote([plus_one.remote(1)])) == 2


def test_async_actor_max_concurrency(torus_local):
    a = AsyncWorker.options(max_concurrency=2).remote()
    torus.get([a.work.remote(0.3) for _ in range(6)], timeout=60)
    assert torus.get(a.peak_seen.remote()) <= 2


def test_named_actor_and_get_if_exists(torus_local):
    c = Counter.options(name="pytest-counter").remote(100)
    same = torus.get_actor("pytest-counter")
    assert torus.get(same.inc.remote()) == 101
    again = Counter.options(name="pytest-counter", get_if_exists=True).remote(0)
    assert torus.get(again.get.remote()) == 101
    with pytest.raises(ValueError):
        Counter.options(name="pytest-counter").remote()
    with pytest.raises(ValueError):
        torus.get_actor("no-such-actor")
    other = Counter.options(name="pytest-counter", namespace="elsewhere").remote(5)
    assert torus.get(torus.get_actor("pytest-counter", namespace="elsewhere").get.remote()) == 5
    torus.kill(c)
    torus.kill(other)


def test_kill(torus_local):
    c = Counter.remote()
    assert torus.get(c.inc.remote()) == 1
    torus.kill(c)

    def dead():   # kill is asynchronous (as in Ray): calls fail once it has taken effect
        try:
            torus.get(c.inc.remote(), timeout=60)
            return False
        except exc.RayActorError:
            return True

    wait_until(dead, timeout=30, what="the killed actor to refuse calls")
    with pytest.raises(ValueError):
        torus.kill(plus_one.remote(1))


def test_exit_actor(torus_local):
    c = Counter.remote()
    torus.get(c.inc.remote())
    try:
        torus.get(c.leave.remote(), timeout=60)   # Ray: None or RayActorError ("exited")
    except exc.RayActorError as e:
        assert "exit" in str(e).lower()
    with pytest.raises(exc.RayActorError):
        torus.get(c.inc.remote(), timeout=60)
    with pytest.raises(TypeError):
        torus.actor.exit_actor()   # not in an actor


def test_runtime_context_in_actor(torus_local):
    c = Counter.remote()
    actor_id, node_id = torus.get(c.ids.remote())
    assert actor_id == c._ray_actor_id.hex()
    assert node_id == torus.get_runtime_context().get_node_id()


def test_restart_after_sigkill(torus_local):
    c = Counter.options(max_restarts=1, max_task_retries=0).remote(0)
    pid1 = torus.get(c.pid.remote())
    os.kill(pid1, signal.SIGKILL)

    def restarted():
        try:
            return torus.get(c.pid.remote(), timeout=30)
        except exc.RayActorError:
            return None   # calls made while it restarts may fail (max_task_retries=0)

    pid2 = wait_until(restarted, timeout=60, what="the actor to restart")
    assert pid2 != pid1
    assert torus.get(c.inc.remote()) == 1   # a fresh instance (__init__ ran again)
    os.kill(pid2, signal.SIGKILL)           # no restarts left: the actor is dead now

    wait_actor_dead(c.pid.remote, timeout=60, call_timeout=30)
    assert torus.get(plus_one.remote(1)) == 2   # the cluster keeps serving


@torus.remote
class SlowStart:
    def __init__(self, path):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(2)

    def pid(self):
        return os.getpid()


def test_worker_killed_during_constructor_restarts_the_actor(torus_local, tmp_path):
    # A worker dying while the constructor runs is a worker failure: the actor restarts
    # (max_restarts allowing) instead of being declared dead as if its constructor had raised.
    path = tmp_path / "pids"
    a = SlowStart.options(max_restarts=-1, max_task_retries=-1).remote(str(path))
    first = wait_until(lambda: path.exists() and path.read_text().split(), timeout=30,
                       what="the constructor to start")
    os.kill(int(first[0]), signal.SIGKILL)
    pid = torus.get(a.pid.remote(), timeout=60)
    assert pid != int(first[0])
    assert len(path.read_text().split()) == 2   # the constructor ran again, once
    torus.kill(a)


def test_worker_killed_during_constructor_without_restarts_is_dead(torus_local, tmp_path):
    path = tmp_path / "pids"
    a = SlowStart.options(max_restarts=0).remote(str(path))
    first = wait_until(lambda: path.exists() and path.read_text().split(), timeout=30,
                       what="the constructor to start")
    os.kill(int(first[0]), signal.SIGKILL)
    with pytest.raises(exc.RayActorError, match="worker died while the constructor ran"):
        torus.get(a.pid.remote(), timeout=60)
    assert torus.get(plus_one.remote(1)) == 2   # the cluster keeps serving


def test_max_task_retries_replays_call_after_sigkill(torus_local):
    c = Counter.options(max_restarts=-1, max_task_retries=-1).remote(0)
    pid1 = torus.get(c.pid.remote())
    os.kill(pid1, signal.SIGKILL)
    pid2 = torus.get(c.pid.remote(), timeout=60)   # retried into the restarted actor
    assert pid2 != pid1
    torus.kill(c)
