# Tasks (max_retries=-1) running on a node whose daemon is kill -9'd while they run: does every
# task get retried, or do some fail with ObjectLostError ("cannot store the result ...")?
import json, os, signal, subprocess, sys, time
import numpy as np, ray
TORUS = sys.argv[1]
ray.init()
subprocess.check_call([TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "2",
                       "--resources", '{"spare": 2}'], stdout=subprocess.DEVNULL)
big = ray.put(np.arange(20_000, dtype=np.int64))            # 160 KB, in the driver's node

@ray.remote(max_retries=-1, resources={"spare": 0.1})
def f(x, i):
    time.sleep(0.3 + 0.02 * i)
    return x * 2                                             # 160 KB result: stored in the node

refs = [f.remote(big, i) for i in range(20)]
time.sleep(0.6)
nodes = json.loads(subprocess.check_output([TORUS, "list", "nodes", "--format", "json"]))
victim = next(n for n in nodes if n["resources_total"].get("spare") and n["state"] == "ALIVE")
os.kill(victim["pid"], signal.SIGKILL)
subprocess.check_call([TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "2",
                       "--resources", '{"spare": 2}'], stdout=subprocess.DEVNULL)
ok, failed = 0, []
for r in refs:
    try:
        v = ray.get(r, timeout=60)
        ok += int(v[5] == 10)
    except Exception as e:
        failed.append(f"{type(e).__name__}: {str(e)[:250]}")
print("OK", ok, "FAILED", len(failed))
for f_ in failed[:3]:
    print("  ", f_)
