"""Errors in user code (Ray Serve docs: "Handle errors"/"Deployment handles"): an exception raised
by a deployment over HTTP is an HTTP 500 and the replica keeps serving; through a
DeploymentHandle, `.result()` raises an exception that is an instance of the user's exception
type and carries its message, and the handle keeps working afterwards."""
import os

import ray
import requests
from ray import serve
from starlette.requests import Request

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


class InsufficientFunds(Exception):
    pass


@serve.deployment
class Bank:
    def __init__(self):
        self.calls = 0

    async def __call__(self, request: Request):
        self.calls += 1
        if request.query_params.get("fail"):
            raise InsufficientFunds("balance too low: " + request.query_params["fail"])
        return {"calls": self.calls, "pid": os.getpid()}

    def withdraw(self, amount: int):
        if amount > 100:
            raise InsufficientFunds(f"cannot withdraw {amount}")
        return 100 - amount

    def divide(self, x: int):
        return 10 // x


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    handle = serve.run(Bank.bind(), name="bank", route_prefix="/bank")

    ok = requests.get(f"{BASE}/bank", timeout=30)
    assert ok.status_code == 200, (ok.status_code, ok.text)
    pid = ok.json()["pid"]

    r = requests.get(f"{BASE}/bank", params={"fail": "42"}, timeout=30)
    assert r.status_code == 500, (r.status_code, r.text)

    # The replica survived the exception: same process, state kept.
    again = requests.get(f"{BASE}/bank", timeout=30)
    assert again.status_code == 200, (again.status_code, again.text)
    assert again.json()["pid"] == pid, (again.json(), pid)
    assert again.json()["calls"] == 3, again.json()

    # Through the handle: the user's exception type, with its message.
    assert handle.withdraw.remote(30).result(timeout_s=30) == 70
    try:
        handle.withdraw.remote(500).result(timeout_s=30)
    except Exception as e:  # Ray wraps it in a RayTaskError that is also an InsufficientFunds
        assert isinstance(e, InsufficientFunds), (type(e), type(e).__mro__)
        assert "cannot withdraw 500" in str(e), str(e)
    else:
        raise AssertionError("withdraw(500) did not raise")

    # A built-in exception type too.
    try:
        handle.divide.remote(0).result(timeout_s=30)
    except Exception as e:
        assert isinstance(e, ZeroDivisionError), (type(e), type(e).__mro__)
    else:
        raise AssertionError("divide(0) did not raise")

    # Calling a method that does not exist fails, and the handle still works afterwards.
    try:
        handle.no_such_method.remote().result(timeout_s=30)
    except Exception as e:
        assert "no_such_method" in str(e), str(e)
    else:
        raise AssertionError("a missing method did not raise")
    assert handle.divide.remote(5).result(timeout_s=30) == 2

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
