"""Actor lifetime (Ray's): a non-detached actor ends once every handle to it is gone, after the
calls already submitted, running __ray_shutdown__; a detached actor, or one whose handle left the
process, stays."""
import gc
import os
import time

import torus

from helpers import wait_until


@torus.remote
class Keeper:
    def __init__(self, marker=""):
        self.marker = marker

    def pid(self):
        return os.getpid()

    def slow(self, seconds):
        time.sleep(seconds)
        return "done"

    def __ray_shutdown__(self):
        if self.marker:
            with open(self.marker, "w") as f:
                f.write("shut down")


@torus.remote
def use(handle):
    return torus.get(handle.pid.remote())


def _gone(name, namespace="pytest"):
    try:
        torus.get_actor(name, namespace=namespace)
        return False
    except ValueError:
        return True


def test_last_handle_dropped_ends_the_actor_after_its_pending_calls(torus_local, tmp_path):
    marker = tmp_path / "shutdown"
    k = Keeper.options(name="lifetime-dropped").remote(str(marker))
    pid = torus.get(k.pid.remote())
    pending = k.slow.remote(1.0)
    del k
    gc.collect()
    assert torus.get(pending, timeout=60) == "done"   # submitted before the drop: it runs
    wait_until(lambda: _gone("lifetime-dropped"), timeout=60,
               what="the actor to end once its last handle was dropped")
    assert marker.read_text() == "shut down"          # __ray_shutdown__ ran

    def process_gone():
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ", 1)[1].startswith("Z")
        except FileNotFoundError:
            return True

    wait_until(process_gone, timeout=30, what=f"the actor's worker {pid} to exit")


def test_other_handles_in_the_process_keep_it(torus_local):
    k = Keeper.options(name="lifetime-two-handles").remote()
    other = torus.get_actor("lifetime-two-handles")
    del k
    gc.collect()
    time.sleep(1.0)
    assert torus.get(other.pid.remote(), timeout=60) > 0
    del other
    gc.collect()
    wait_until(lambda: _gone("lifetime-two-handles"), timeout=60,
               what="the actor to end once the second handle was dropped too")


def test_a_handle_passed_to_a_task_keeps_the_actor(torus_local):
    k = Keeper.options(name="lifetime-escaped").remote()
    assert torus.get(use.remote(k), timeout=60) > 0
    del k
    gc.collect()
    time.sleep(1.5)
    same = torus.get_actor("lifetime-escaped")      # still there: the task may have kept it
    assert torus.get(same.pid.remote(), timeout=60) > 0
    torus.kill(same)


def test_detached_actor_outlives_its_handles(torus_local):
    k = Keeper.options(name="lifetime-detached", lifetime="detached").remote()
    torus.get(k.pid.remote())
    del k
    gc.collect()
    time.sleep(1.5)
    same = torus.get_actor("lifetime-detached")
    assert torus.get(same.pid.remote(), timeout=60) > 0
    torus.kill(same)
