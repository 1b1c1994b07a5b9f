# A host of a multi-host slice kill -9'd and started again at once with the same TPU environment
# (new node id, same TPU_NAME and TPU_WORKER_ID): the new node registers while the old one is
# still alive to the head. Once the old one is declared dead, the slice is whole again (`torus
# list slices`: free, 4 of 4 hosts), so a reservation of it must be granted.
import json, os, signal, subprocess, sys, time, ray
from ray.util.tpu import slice_placement_group
TORUS = sys.argv[1]
ray.init()
env = dict(os.environ, TORUS_TPU_METADATA_URL="off", TPU_NAME="dup-slice", TPU_ACCELERATOR_TYPE="v6e-16",
           TPU_TOPOLOGY="4x4", TPU_WORKER_HOSTNAMES="h0,h1,h2,h3", TORUS_TPU_CHIPS="4")
cmd = [TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "1"]
for w in range(4):
    subprocess.check_call(cmd, env=dict(env, TPU_WORKER_ID=str(w)), stdout=subprocess.DEVNULL)
spg = slice_placement_group(topology="4x4", accelerator_version="v6e")
ray.get(spg.placement_group.ready(), timeout=30)           # the slice works before the kill
ray.util.remove_placement_group(spg.placement_group)
nodes = json.loads(subprocess.check_output([TORUS, "list", "nodes", "--format", "json"]))
victim = next(n for n in nodes if n["labels"].get("torus.io/tpu-worker-id") == "1")
os.kill(victim["pid"], signal.SIGKILL)
subprocess.check_call(cmd, env=dict(env, TPU_WORKER_ID="1"), stdout=subprocess.DEVNULL)


def dead():
    ns = json.loads(subprocess.check_output([TORUS, "list", "nodes", "--format", "json"]))
    return any(n["node_id"] == victim["node_id"] and n["state"] == "DEAD" for n in ns)


while not dead():
    time.sleep(0.2)
slices = json.loads(subprocess.check_output([TORUS, "list", "slices", "--format", "json"]))
print("slices:", [(s["slice_name"], s["state"], s["hosts_alive"], s["hosts_expected"]) for s in slices])
t0 = time.time()
spg = slice_placement_group(topology="4x4", accelerator_version="v6e")
try:
    ray.get(spg.placement_group.ready(), timeout=30)
    print(f"OK granted after {time.time() - t0:.2f} s")
except Exception as e:
    pgs = json.loads(subprocess.check_output([TORUS, "list", "placement-groups", "--format", "json"]))
    why = next(g["pending_reason"] for g in pgs if g["placement_group_id"] == spg.placement_group.id.hex())
    print("FAIL", type(e).__name__, "; pending:", why)
