"""A user_config change is a lightweight update (Ray Serve docs: "Updating Applications In-Place"
→ "Lightweight Config Updates": user_config is among the options whose change "won't tear down
the replicas"): redeploying with `serve.run` and a new `.options(user_config=...)` calls
`reconfigure` on the running replica, which keeps its replica id and process and its state from
__init__.

Ray 2.60 itself only does this for config-file deploys (`serve deploy`), where the code version
is stable: `serve.run` of a deployment carries no code version, so the controller gives each
deploy a random one and replaces every replica (measured; see RAY_CANNOT in test_serve.py)."""
import os
import time

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment
class Model:
    def __init__(self):
        self.born = time.time()
        self.inits = 1
        self.version = None

    def reconfigure(self, config: dict):
        self.version = config["version"]

    def __call__(self, request=None):
        ctx = serve.get_replica_context()
        return {"version": self.version, "pid": os.getpid(), "replica": ctx.replica_tag,
                "born": self.born}


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})

    serve.run(Model.options(user_config={"version": 1}).bind(), name="m", route_prefix="/m")
    before = requests.get(f"{BASE}/m", timeout=30).json()
    assert before["version"] == 1, before

    serve.run(Model.options(user_config={"version": 2}).bind(), name="m", route_prefix="/m")
    after = requests.get(f"{BASE}/m", timeout=30).json()
    assert after["version"] == 2, after
    assert (after["pid"], after["replica"], after["born"]) == \
        (before["pid"], before["replica"], before["born"]), \
        f"the replica was replaced: {before} -> {after}"
    st = serve.status().applications["m"].deployments["Model"]
    assert st.status == "HEALTHY" and sum(st.replica_states.values()) == 1, st

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
