"""Lost objects (docs/objects.md "Lost objects"), through Ray's Python API: a task result whose
only copy went with a SIGKILLed node is made again by running its task again; one that cannot be
made again (max_retries=0) raises ray.exceptions.ObjectLostError naming the object."""
import json

from helpers import Cluster, run_python, torus_bin, wait_actor_dead

SCRIPT = """
import json, os, signal, subprocess, sys
import numpy as np
import ray

TORUS, DIR, RETRIES = sys.argv[1], sys.argv[2], int(sys.argv[3])
ray.init()  # attached to the head's node, the only one yet: the node killed below is never ours
for _ in range(2):
    subprocess.check_call([TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "1",
                           "--resources", json.dumps({"spare": 1})], stdout=subprocess.DEVNULL)

@ray.remote(resources={"spare": 1}, max_retries=RETRIES)
def make(n):
    with open(os.path.join(DIR, "made"), "a") as f:
        f.write(ray.get_runtime_context().get_node_id() + "\\n")
    return np.arange(n, dtype=np.int64)  # 8 MB: in the store of the node that ran it

x = make.remote(1_000_000)
ray.wait([x])  # ready, not read: the driver holds no copy
first = open(os.path.join(DIR, "made")).read().split()[0]
nodes = json.loads(subprocess.check_output([TORUS, "list", "nodes", "--format", "json"]))
os.kill(next(n["pid"] for n in nodes if n["node_id"] == first), signal.SIGKILL)
try:
    arr = ray.get(x, timeout=90)
    print("VALUE", int(arr.sum()), json.dumps(open(os.path.join(DIR, "made")).read().split()))
except ray.exceptions.ObjectLostError as e:
    print("LOST", type(e).__name__, x.hex(), "|", str(e).replace("\\n", " "))
"""


def _cluster():
    # The driver adds the two nodes with {"spare": 1} itself, once it is attached.
    return Cluster().start_head("--num-cpus", "1", "--node-timeout-ms", "2000")


def _run(tmp_path, retries: str):
    """SCRIPT on a fresh cluster: (its VALUE or LOST line, its whole output)."""
    c = _cluster()
    try:
        out = run_python(SCRIPT, env=c.driver_env(RAY_ADDRESS=c.address), shim=True,
                         args=(torus_bin(), str(tmp_path), retries)).stdout
        return next(l for l in out.splitlines() if l.startswith(("VALUE", "LOST"))), out
    finally:
        c.stop()


def test_a_result_lost_with_its_node_is_made_again(tmp_path):
    line, out = _run(tmp_path, "3")
    assert line.startswith("VALUE"), out
    _, total, made = line.split(" ", 2)
    assert int(total) == sum(range(1_000_000))
    made = json.loads(made)
    assert len(made) == 2 and made[0] != made[1], made  # made again, on the other node


def test_a_result_that_cannot_be_made_again_raises_object_lost(tmp_path):
    line, out = _run(tmp_path, "0")
    assert line.startswith("LOST ObjectLostError"), out
    oid, msg = line.split(" ", 3)[2], line.split("|", 1)[1]
    assert oid[:32] in msg and "cannot be rebuilt" in msg, line
    assert len((tmp_path / "made").read_text().split()) == 1


def test_an_object_whose_owner_died_raises_owner_died(torus_local):
    import numpy as np
    import torus
    from torus import exceptions as exc

    @torus.remote
    class Holder:
        def make(self):
            return [torus.put(np.arange(100_000))]  # owned by this actor's process

        def ping(self):
            return 1

    h = Holder.remote()
    [ref] = torus.get(h.make.remote())
    torus.kill(h)

    wait_actor_dead(h.ping.remote)
    try:
        torus.get(ref, timeout=30)
        raise AssertionError("get of an object whose owner died returned")
    except exc.OwnerDiedError as e:
        assert isinstance(e, exc.ObjectLostError)
        assert e.object_ref_hex == ref.hex(), (e.object_ref_hex, ref.hex())
        assert "owner" in str(e) and "died" in str(e), str(e)
