# A value lost with its node, rebuilt right after a head restart: its argument, a ray.put value
# on the driver's own node (alive throughout), is judged lost too if that node has not
# re-registered with the restarted head yet.
import json, os, signal, subprocess, sys, time
import numpy as np, ray
TORUS, PORT = sys.argv[1], sys.argv[2]
ray.init()
for _ in range(2):
    subprocess.check_call([TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "1",
                           "--resources", '{"spare": 1}'], stdout=subprocess.DEVNULL)
P = ray.put(np.arange(20_000, dtype=np.int64))        # 160 KB: in the driver's node's store

@ray.remote(max_retries=-1, resources={"spare": 1})
def f(x):
    return (x * 2, ray.get_runtime_context().get_node_id())

X = f.remote(P)
ray.wait([X], fetch_local=False)
nodes = json.loads(subprocess.check_output([TORUS, "list", "nodes", "--format", "json"]))
# which node made X: ask by running a no-op? we read it from the object listing instead
objs = json.loads(subprocess.check_output([TORUS, "list", "objects", "--format", "json"]))
where = next(o["node_id"] for o in objs if o["object_id"].startswith(X.hex()))
victim = next(n for n in nodes if n["node_id"] == where)
session = os.path.realpath(os.path.join(os.environ["TORUS_TMPDIR"], "session_latest"))
head_pid = int(open(os.path.join(session, "pids", "head.pid")).read().split()[0])
os.kill(victim["pid"], signal.SIGKILL)
os.kill(head_pid, signal.SIGKILL)
import threading
out = []
def reader():
    try:
        v, node = ray.get(X, timeout=60)
        out.append(f"OK rebuilt on {node[:12]} {int(v.sum()) == 2 * int(np.arange(20_000).sum())}")
    except Exception as e:
        out.append(f"FAIL {type(e).__name__} {str(e)[:700]}")
t = threading.Thread(target=reader); t.start()   # reads while the head is away
time.sleep(float(sys.argv[3]))
subprocess.check_call([TORUS, "start", "--head", "--port", PORT, "--num-cpus", "1"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
t.join(); print(out[0])
