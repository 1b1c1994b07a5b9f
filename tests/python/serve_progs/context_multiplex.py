"""Replica context and model multiplexing (Ray Serve API reference: serve.get_replica_context,
ReplicaContext; docs "Model Multiplexing"): inside a replica, serve.get_replica_context() gives
the application name, the deployment name and a replica tag/id unique per replica (and raises
outside a replica); a method decorated with `@serve.multiplexed(max_num_models_per_replica=2)`
loads a model once per model id and caches it, evicting the least recently used model beyond
two (its __del__ runs); serve.get_multiplexed_model_id() returns the id from the
`serve_multiplexed_model_id` HTTP header or from `handle.options(multiplexed_model_id=...)`,
and "" when none was given."""
import os

import ray
import requests
from ray import serve
from ray.serve.exceptions import RayServeException

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment(num_replicas=2)
class Context:
    def __call__(self, request=None):
        ctx = serve.get_replica_context()
        rid = ctx.replica_id
        return {"app": ctx.app_name, "deployment": ctx.deployment, "tag": ctx.replica_tag,
                "unique_id": rid.unique_id, "rid_deployment": rid.deployment_id.name,
                "rid_app": rid.deployment_id.app_name, "pid": os.getpid()}


class FakeModel:
    unloaded = []

    def __init__(self, model_id: str):
        self.model_id = model_id

    def predict(self, x: str) -> str:
        return f"{self.model_id}:{x}"

    def __del__(self):
        FakeModel.unloaded.append(self.model_id)


@serve.deployment
class Multiplexed:
    def __init__(self):
        self.loads = []

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> FakeModel:
        self.loads.append(model_id)
        return FakeModel(model_id)

    async def __call__(self, request=None):
        model_id = serve.get_multiplexed_model_id()
        if not model_id:
            return {"model": None}
        model = await self.get_model(model_id)
        return {"model": model_id, "out": model.predict("x")}

    def stats(self):
        import gc
        gc.collect()
        return {"loads": list(self.loads), "unloaded": list(FakeModel.unloaded)}


def main():
    ray.init(num_cpus=8)
    try:
        serve.get_replica_context()
    except RayServeException:
        pass
    else:
        raise AssertionError("get_replica_context() outside a replica did not raise")

    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    ctx_h = serve.run(Context.bind(), name="ctxapp", route_prefix="/ctx")
    tags = {}
    with requests.Session() as s:
        for _ in range(40):
            c = s.get(f"{BASE}/ctx", timeout=30).json()
            assert c["app"] == "ctxapp" and c["deployment"] == "Context", c
            assert c["rid_app"] == "ctxapp" and c["rid_deployment"] == "Context", c
            assert c["tag"] == c["unique_id"] and c["tag"], c
            tags[c["tag"]] = c["pid"]
            if len(tags) == 2:
                break
    assert len(tags) == 2 and len(set(tags.values())) == 2, tags
    c = ctx_h.remote().result(timeout_s=30)
    assert tags.get(c["tag"]) == c["pid"], (c, tags)

    mh = serve.run(Multiplexed.bind(), name="mux", route_prefix="/mux")
    hdr = "serve_multiplexed_model_id"

    def ask(model_id):
        r = requests.get(f"{BASE}/mux", headers={hdr: model_id}, timeout=30)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    assert ask("a") == {"model": "a", "out": "a:x"}
    assert ask("a") == {"model": "a", "out": "a:x"}
    assert ask("b")["model"] == "b"
    st = mh.stats.remote().result(timeout_s=30)
    assert st["loads"] == ["a", "b"], st  # "a" was loaded once, then served from the cache
    # A third model evicts the least recently used one ("a").
    assert ask("c")["model"] == "c"
    st = mh.stats.remote().result(timeout_s=30)
    assert st["loads"] == ["a", "b", "c"] and set(st["unloaded"]) == {"a"}, st
    # "b" is still cached; "a" must be loaded again.
    assert ask("b")["model"] == "b"
    assert ask("a")["model"] == "a"
    st = mh.stats.remote().result(timeout_s=30)
    assert st["loads"] == ["a", "b", "c", "a"], st

    # Through a handle.
    out = mh.options(multiplexed_model_id="a").remote().result(timeout_s=30)
    assert out == {"model": "a", "out": "a:x"}, out
    # No model id: the empty string.
    assert requests.get(f"{BASE}/mux", timeout=30).json() == {"model": None}
    assert mh.remote().result(timeout_s=30) == {"model": None}

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
