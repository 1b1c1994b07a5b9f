"""Defaults (Ray Serve docs: "Set Up FastAPI and HTTP", HTTPOptions defaults host 127.0.0.1,
port 8000; serve.run's defaults name "default", route_prefix "/"): serve.run without serve.start
starts Serve and serves the application at http://127.0.0.1:8000/; serve.shutdown() closes
port 8000. This program needs port 8000 free."""
import socket
import time

import ray
import requests
from ray import serve


@serve.deployment
class Hello:
    def __call__(self, request):
        return f"hello from {request.url.path}"


def main():
    ray.init(num_cpus=8)
    h = serve.run(Hello.bind())
    r = requests.get("http://127.0.0.1:8000/", timeout=30)
    assert r.status_code == 200 and r.text == "hello from /", (r.status_code, r.text)
    r = requests.get("http://localhost:8000/x/y", timeout=30)
    assert r.status_code == 200 and r.text == "hello from /x/y", (r.status_code, r.text)
    assert "default" in serve.status().applications, serve.status()
    assert serve.status().applications["default"].status == "RUNNING"
    assert serve.get_app_handle("default") is not None
    del h

    serve.shutdown()
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", 8000), timeout=2):
                pass
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "port 8000 still open after serve.shutdown()"
        time.sleep(0.2)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
