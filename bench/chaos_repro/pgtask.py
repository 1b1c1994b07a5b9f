# A task in a placement group whose bundle's node was just kill -9'd (not declared dead yet):
# it must wait for the group to be placed again, then run.
import json, os, signal, subprocess, sys, time, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
TORUS = sys.argv[1]
ray.init()
subprocess.check_call([TORUS, "start", "--address", os.environ["RAY_ADDRESS"], "--num-cpus", "2"],
                      stdout=subprocess.DEVNULL)           # somewhere for the group to go next
pg = placement_group([{"CPU": 1}], strategy="STRICT_PACK")
ray.get(pg.ready(), timeout=30)
node = ray.util.placement_group_table()[pg.id.hex()]["bundles_to_node_id"][0] if False else None
@ray.remote(max_retries=-1, num_cpus=1)
def f():
    return ray.get_runtime_context().get_node_id()
where = ray.get(f.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote())
nodes = json.loads(subprocess.check_output([TORUS, "list", "nodes", "--format", "json"]))
victim = next(n for n in nodes if n["node_id"] == where)
print("bundle on", where[:12], "head node" if victim["is_head_node"] else "other node", flush=True)
os.kill(victim["pid"], signal.SIGKILL)
time.sleep(0.5)
r = f.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
try:
    print("OK", ray.get(r, timeout=60)[:12])
except Exception as e:
    print("FAIL", type(e).__name__, str(e).splitlines()[-1][:300])
