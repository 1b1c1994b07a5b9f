# The owner holds its own copy of a value (ray.get pulled it) whose primary copy went with a
# killed node; a task then takes the value as an argument.
import json, os, signal, subprocess, sys, time
import numpy as np, ray
TORUS = sys.argv[1]
ray.init()
subprocess.check_call([TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "1",
                       "--resources", '{"spare": 1}'], stdout=subprocess.DEVNULL)

@ray.remote(max_retries=-1, resources={"spare": 1})
def make():
    return np.arange(20_000, dtype=np.int64)        # 160 KB: stored on the "spare" node

@ray.remote(max_retries=-1)
def total(x):
    return int(x.sum())

X = make.remote()
assert int(ray.get(X).sum()) == sum(range(20_000))  # the driver now holds a copy of its own
nodes = json.loads(subprocess.check_output([TORUS, "list", "nodes", "--format", "json"]))
victim = next(n for n in nodes if n["resources_total"].get("spare"))
os.kill(victim["pid"], signal.SIGKILL)
time.sleep(7)                                        # declared dead (5 s)
subprocess.check_call([TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "1",
                       "--resources", '{"spare": 1}'], stdout=subprocess.DEVNULL)
t0 = time.time()
try:
    print("OK", ray.get(total.remote(X), timeout=30) == sum(range(20_000)), f"{time.time() - t0:.1f} s")
except Exception as e:
    print("FAIL", type(e).__name__, str(e)[:300], f"{time.time() - t0:.1f} s")
tasks = json.loads(subprocess.check_output([TORUS, "list", "tasks", "--format", "json"]))
print("attempts of total:", [t["attempt"] for t in tasks if t["name"].endswith("total")])
