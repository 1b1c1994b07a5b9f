"""Model composition and DeploymentHandles (Ray Serve docs: "Deploy Compositions of Models"):
an ingress bound with other deployments' applications receives DeploymentHandles and awaits
their calls; a DeploymentResponse passed as an argument to another handle call is resolved to
its value first; `.options(method_name=...)` picks the method; from the driver,
`serve.run` returns the ingress handle, `serve.get_app_handle(name)` and
`serve.get_deployment_handle(deployment, app_name)` reach running deployments;
`.result(timeout_s=...)` raises TimeoutError when the answer is late; a downstream exception
reaches the caller (ingress or driver) as the user's type; serve.status() lists every
deployment of the application; an application run with route_prefix=None has no HTTP route but
answers through handles."""
import os
import time

import ray
import requests
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.requests import Request

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment
class Adder:
    def __init__(self, increment: int):
        self.increment = increment

    def __call__(self, x: int) -> int:
        return x + self.increment

    def add_twice(self, x: int) -> int:
        return x + 2 * self.increment


@serve.deployment
class Multiplier:
    def __init__(self, factor: int):
        self.factor = factor

    async def __call__(self, x: int) -> int:
        return x * self.factor

    async def fail(self, x: int) -> int:
        raise ValueError(f"multiplier refuses {x}")

    async def slow(self, seconds: float) -> str:
        import asyncio
        await asyncio.sleep(seconds)
        return "done"


@serve.deployment
class Ingress:
    def __init__(self, adder: DeploymentHandle, multiplier: DeploymentHandle):
        assert isinstance(adder, DeploymentHandle), type(adder)
        self.adder = adder
        self.multiplier = multiplier

    async def compute(self, x: int) -> dict:
        added = await self.adder.remote(x)
        # A DeploymentResponse as an argument: the multiplier receives the adder's value.
        chained = await self.multiplier.remote(self.adder.remote(x))
        twice = await self.adder.options(method_name="add_twice").remote(x)
        via_attr = await self.adder.add_twice.remote(x)
        return {"added": added, "chained": chained, "twice": twice, "via_attr": via_attr}

    async def relay_failure(self, x: int) -> str:
        # The downstream exception reaches the caller as the user's type.
        try:
            await self.multiplier.fail.remote(x)
        except ValueError as e:
            return f"caught: {e}"
        return "not raised"

    async def unhandled_failure(self, x: int) -> int:
        return await self.multiplier.fail.remote(x)

    async def __call__(self, request_or_x):
        if isinstance(request_or_x, Request):
            x = int(request_or_x.query_params["x"])
        else:
            x = request_or_x
        return await self.compute(x)


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    app = Ingress.bind(Adder.bind(10), Multiplier.bind(3))
    h = serve.run(app, name="comp", route_prefix="/comp")
    assert isinstance(h, DeploymentHandle), type(h)

    want = {"added": 11, "chained": 33, "twice": 21, "via_attr": 21}
    # From the driver, the handle serve.run returned.
    resp = h.remote(1)
    assert isinstance(resp, DeploymentResponse), type(resp)
    assert resp.result(timeout_s=30) == want, resp.result()
    # Over HTTP.
    r = requests.get(f"{BASE}/comp", params={"x": 1}, timeout=30)
    assert r.status_code == 200 and r.json() == want, (r.status_code, r.text)

    # By application name: the ingress deployment.
    app_h = serve.get_app_handle("comp")
    assert app_h.compute.remote(2).result(timeout_s=30) == {"added": 12, "chained": 36,
                                                           "twice": 22, "via_attr": 22}
    # By deployment name within the application.
    adder = serve.get_deployment_handle("Adder", app_name="comp")
    assert adder.remote(5).result(timeout_s=30) == 15
    assert adder.options(method_name="add_twice").remote(5).result(timeout_s=30) == 25
    mult = serve.get_deployment_handle("Multiplier", "comp")
    # A response from one handle as the argument of another, in the driver too.
    assert mult.remote(adder.remote(1)).result(timeout_s=30) == 33
    # Many calls in flight at once, each resolving to its own value.
    resps = [adder.remote(i) for i in range(20)]
    assert [r.result(timeout_s=30) for r in resps] == [i + 10 for i in range(20)]

    # Errors cross the composition: caught in the ingress as the user's type, or passed on to
    # the driver when not caught.
    caught = app_h.relay_failure.remote(4).result(timeout_s=30)
    assert caught.startswith("caught: ") and "multiplier refuses 4" in caught, caught
    try:
        app_h.unhandled_failure.remote(5).result(timeout_s=30)
    except ValueError as e:
        assert "multiplier refuses 5" in str(e), str(e)
    else:
        raise AssertionError("the downstream error did not reach the driver")

    # serve.status() lists every deployment of the application.
    deps = serve.status().applications["comp"].deployments
    assert set(deps) == {"Ingress", "Adder", "Multiplier"}, deps
    assert all(d.status == "HEALTHY" for d in deps.values()), deps

    # route_prefix=None: reachable through handles only.
    hidden = serve.run(Adder.bind(100), name="hidden", route_prefix=None)
    assert hidden.remote(1).result(timeout_s=30) == 101
    assert serve.get_app_handle("hidden").remote(2).result(timeout_s=30) == 102
    r = requests.get(f"{BASE}/hidden", timeout=30)
    assert r.status_code == 404, (r.status_code, r.text)

    # A late answer: result(timeout_s) raises TimeoutError; the call still completes.
    slow = mult.slow.remote(3)
    t0 = time.monotonic()
    try:
        slow.result(timeout_s=0.5)
    except TimeoutError:
        pass
    else:
        raise AssertionError("result(timeout_s=0.5) of a 3 s call did not time out")
    assert time.monotonic() - t0 < 2.5, time.monotonic() - t0
    assert slow.result(timeout_s=30) == "done"

    # Unknown names.
    for bad in (lambda: serve.get_app_handle("nope"),
                lambda: serve.get_deployment_handle("Nope", app_name="comp")):
        try:
            bad().remote(1).result(timeout_s=10)
        except Exception:
            pass
        else:
            raise AssertionError("a handle to a missing app/deployment answered")

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
