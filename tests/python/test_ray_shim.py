"""`python -m torus.ray SCRIPT`: Ray programs unchanged, in the driver and in its workers."""
import importlib.metadata
import sys

from helpers import clean_env, run_python

RAY_PROGRAM = """
import os, sys
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.placement_group import placement_group
from ray.exceptions import RayTaskError, GetTimeoutError
import ray.actor

ray.init()

@ray.remote
def inside(x):
    import ray as r2                      # resolved on the worker too
    from ray.util import placement_group as _pg  # noqa
    return r2.__name__, x * 2, r2.get_runtime_context().get_node_id() != ""

@ray.remote
class Acc:
    def __init__(self):
        self.v = []
    def add(self, x):
        self.v.append(x)
        return list(self.v)
    def bye(self):
        ray.actor.exit_actor()

@ray.remote(max_retries=0)
def bad():
    raise ZeroDivisionError("remote division")

name, doubled, has_node = ray.get(inside.remote(21))
assert name == "torus" and doubled == 42 and has_node, (name, doubled, has_node)
a = Acc.remote()
assert ray.get([a.add.remote(1), a.add.remote(2)]) == [[1], [1, 2]]
pg = placement_group([{"CPU": 1}])
ray.get(pg.ready(), timeout=60)
assert ray.get(inside.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
    placement_group=pg, placement_group_bundle_index=0)).remote(1))[1] == 2
try:
    ray.get(bad.remote())
except ZeroDivisionError as e:
    assert isinstance(e, RayTaskError) and "remote division" in str(e)
else:
    raise AssertionError("no error")
try:
    import ray.rllib
except NotImplementedError as e:
    assert "ray.rllib" in str(e)
else:
    raise AssertionError("ray.rllib imported")
print("argv", sys.argv[1:])
print("SHIM OK", ray.__name__)
ray.shutdown()
"""


def test_ray_program_runs_unchanged():
    p = run_python(RAY_PROGRAM, shim=True, args=["--flag", "x"], timeout=300)
    assert "SHIM OK torus" in p.stdout, p.stdout + p.stderr
    assert "argv ['--flag', 'x']" in p.stdout


def test_local_module_import_on_workers(tmp_path):
    (tmp_path / "mylib.py").write_text("def triple(x):\n    return 3 * x\n")
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import ray, mylib\n"
        "ray.init()\n"
        "@ray.remote\n"
        "def f(x):\n"
        "    import mylib as m\n"
        "    return m.triple(x), m.__file__\n"
        "print('RESULT', ray.get(f.remote(5)))\n")
    from helpers import run
    p = run([sys.executable, "-m", "torus.ray", str(prog)], env=clean_env(), cwd="/",
            timeout=300)
    assert "RESULT (15," in p.stdout, p.stdout + p.stderr


def test_nothing_named_ray_is_installed():
    files = importlib.metadata.files("torus") or []
    tops = {str(f).split("/")[0] for f in files}
    assert "ray" not in tops and not any(t.startswith("ray-") or t == "ray.py" for t in tops)


def test_plain_torus_does_not_touch_ray():
    p = run_python("import sys, torus\nprint('ray' in sys.modules)\n")
    assert p.stdout.strip() == "False"
