"""user_config and reconfigure (Ray Serve docs: "Configure Ray Serve deployments" → user_config,
"Updating the user config"): a deployment's `reconfigure(config)` is called with its
user_config when the replica starts, before it takes traffic; redeploying the application with
`serve.run` and a new `.options(user_config=...)` makes every later answer, over HTTP and through
handles, reflect the new config; an async reconfigure works the same way; a user_config on a
deployment without reconfigure fails that application's deployment (serve.run raises,
DEPLOY_FAILED) and leaves the others serving."""
import os

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment
class Threshold:
    def __init__(self):
        self.threshold = None
        self.reconfigured = 0

    def reconfigure(self, config: dict):
        self.threshold = config["threshold"]
        self.reconfigured += 1

    def __call__(self, request=None):
        return {"threshold": self.threshold, "reconfigured": self.reconfigured}


@serve.deployment
class AsyncConfigured:
    def __init__(self):
        self.label = "unset"

    async def reconfigure(self, config: dict):
        self.label = config["label"]

    async def __call__(self, request=None):
        return self.label


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})

    h = serve.run(Threshold.options(user_config={"threshold": 0.5}).bind(), name="cfg",
                  route_prefix="/cfg")
    first = requests.get(f"{BASE}/cfg", timeout=30).json()
    assert first == {"threshold": 0.5, "reconfigured": 1}, first
    assert h.remote().result(timeout_s=30)["threshold"] == 0.5

    h = serve.run(Threshold.options(user_config={"threshold": 0.9}).bind(), name="cfg",
                  route_prefix="/cfg")
    for _ in range(5):
        r = requests.get(f"{BASE}/cfg", timeout=30).json()
        assert r["threshold"] == 0.9, r
        assert h.remote().result(timeout_s=30)["threshold"] == 0.9

    # In the decorator as well as in .options(); async reconfigure.
    a = serve.run(AsyncConfigured.options(user_config={"label": "one"}).bind(), name="acfg",
                  route_prefix="/acfg")
    assert a.remote().result(timeout_s=30) == "one"
    a = serve.run(AsyncConfigured.options(user_config={"label": "two"}).bind(), name="acfg",
                  route_prefix="/acfg")
    assert a.remote().result(timeout_s=30) == "two"
    assert requests.get(f"{BASE}/acfg", timeout=30).text == "two"

    # A user_config on a deployment without reconfigure: the replicas cannot start, serve.run
    # raises and the application is DEPLOY_FAILED.
    @serve.deployment(user_config={"x": 1})
    class NoReconfigure:
        def __call__(self):
            return 1

    try:
        serve.run(NoReconfigure.bind(), name="bad", route_prefix="/bad")
    except Exception:
        pass
    else:
        raise AssertionError("user_config without reconfigure() was accepted")
    assert serve.status().applications["bad"].status == "DEPLOY_FAILED", serve.status()
    # The other applications are unaffected.
    assert a.remote().result(timeout_s=30) == "two"

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
