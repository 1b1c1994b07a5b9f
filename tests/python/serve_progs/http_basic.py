"""HTTP ingress basics (Ray Serve docs: "Set Up FastAPI and HTTP", "Deploy Multiple
Applications"): a function deployment and a class deployment whose __call__ takes a starlette
Request; a str return is sent as text/plain, a dict as JSON, a starlette Response/JSONResponse as
is; query parameters, the path under the app's route_prefix, a POST JSON body read with
`await request.json()`, a raw body of several MiB with `await request.body()`, request headers, a
non-ASCII str (UTF-8); applications side by side on their own route prefixes, the longest
matching prefix winning on a path-segment boundary; an unknown route is a 404."""
import os

import ray
import requests
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment
def hello(request: Request) -> str:
    return "hello " + request.query_params.get("name", "world")


@serve.deployment
class Echo:
    def __init__(self, greeting: str):
        self.greeting = greeting

    async def __call__(self, request: Request):
        path = request.url.path
        if path.endswith("/text"):
            return f"{self.greeting} text"
        if path.endswith("/dict"):
            return {"greeting": self.greeting, "n": int(request.query_params.get("n", "0")),
                    "list": [1, 2, 3]}
        if path.endswith("/response"):
            return Response(content=b"raw bytes", status_code=201,
                            headers={"X-Custom": "yes"}, media_type="application/octet-stream")
        if path.endswith("/plain"):
            return PlainTextResponse("teapot", status_code=418)
        if path.endswith("/jsonresponse"):
            return JSONResponse({"ok": True, "method": request.method}, status_code=202)
        if path.endswith("/post"):
            body = await request.json()
            return {"sum": sum(body["values"]), "method": request.method}
        if path.endswith("/bytes"):
            import hashlib
            raw = await request.body()
            return {"len": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        if path.endswith("/headers"):
            return {"x-token": request.headers.get("x-token"),
                    "content-type": request.headers.get("content-type")}
        if path.endswith("/unicode"):
            return "héllo ✓ 世界"
        return {"path": path, "method": request.method,
                "query": dict(request.query_params)}


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})

    serve.run(hello.bind(), name="fn", route_prefix="/fn")
    serve.run(Echo.bind("hi"), name="cls", route_prefix="/cls")
    serve.run(Echo.bind("nested"), name="nested", route_prefix="/cls/nested")

    # A function deployment: the str comes back as plain text.
    r = requests.get(f"{BASE}/fn", timeout=30)
    assert r.status_code == 200 and r.text == "hello world", (r.status_code, r.text)
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    r = requests.get(f"{BASE}/fn", params={"name": "serve"}, timeout=30)
    assert r.text == "hello serve", r.text
    # Sub-paths of the prefix reach the same application.
    r = requests.get(f"{BASE}/fn/some/sub/path?name=x", timeout=30)
    assert r.status_code == 200 and r.text == "hello x", (r.status_code, r.text)

    # A class deployment: the return value's type picks the response.
    r = requests.get(f"{BASE}/cls/text", timeout=30)
    assert r.status_code == 200 and r.text == "hi text", (r.status_code, r.text)
    assert r.headers["content-type"].startswith("text/plain"), r.headers

    r = requests.get(f"{BASE}/cls/dict", params={"n": 7}, timeout=30)
    assert r.status_code == 200, r.status_code
    assert r.headers["content-type"].startswith("application/json"), r.headers
    assert r.json() == {"greeting": "hi", "n": 7, "list": [1, 2, 3]}, r.json()

    r = requests.get(f"{BASE}/cls/response", timeout=30)
    assert r.status_code == 201 and r.content == b"raw bytes", (r.status_code, r.content)
    assert r.headers["x-custom"] == "yes", r.headers
    assert r.headers["content-type"].startswith("application/octet-stream"), r.headers

    r = requests.get(f"{BASE}/cls/plain", timeout=30)
    assert r.status_code == 418 and r.text == "teapot", (r.status_code, r.text)

    r = requests.get(f"{BASE}/cls/jsonresponse", timeout=30)
    assert r.status_code == 202 and r.json() == {"ok": True, "method": "GET"}, (r.status_code,
                                                                               r.text)

    r = requests.post(f"{BASE}/cls/post", json={"values": [1, 2, 3, 4]}, timeout=30)
    assert r.status_code == 200 and r.json() == {"sum": 10, "method": "POST"}, (r.status_code,
                                                                               r.text)

    # The request's path is the full path, route prefix included; query parameters are parsed.
    r = requests.get(f"{BASE}/cls/a/b", params={"x": "1", "y": "two"}, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.json() == {"path": "/cls/a/b", "method": "GET", "query": {"x": "1", "y": "two"}}, \
        r.json()
    r = requests.put(f"{BASE}/cls/put", timeout=30)
    assert r.status_code == 200 and r.json()["method"] == "PUT", (r.status_code, r.text)

    # A request body of several MiB arrives whole; request headers are visible.
    import hashlib
    blob = os.urandom(3 * 1024 * 1024 + 17)
    r = requests.post(f"{BASE}/cls/bytes", data=blob, timeout=60)
    assert r.status_code == 200 and r.json() == {
        "len": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}, (r.status_code, r.text)
    r = requests.post(f"{BASE}/cls/headers", headers={"X-Token": "abc"}, json={}, timeout=30)
    assert r.json() == {"x-token": "abc", "content-type": "application/json"}, r.text
    r = requests.get(f"{BASE}/cls/unicode", timeout=30)
    assert r.content == "héllo ✓ 世界".encode("utf-8"), r.content
    assert "utf-8" in r.headers["content-type"].lower(), r.headers

    # The longest matching prefix wins, on a path-segment boundary.
    r = requests.get(f"{BASE}/cls/nested/text", timeout=30)
    assert r.status_code == 200 and r.text == "nested text", (r.status_code, r.text)
    r = requests.get(f"{BASE}/cls/nested", timeout=30)
    assert r.json()["path"] == "/cls/nested" and r.json()["method"] == "GET", r.text
    r = requests.get(f"{BASE}/cls/nestedx/text", timeout=30)
    assert r.status_code == 200 and r.text == "hi text", (r.status_code, r.text)

    # The applications stay up side by side.
    status = serve.status()
    assert {"fn", "cls", "nested"} <= set(status.applications), status.applications
    assert requests.get(f"{BASE}/fn", timeout=30).text == "hello world"

    # No application under "/": every path outside the two prefixes is a 404, including one
    # that merely starts with the same letters as a prefix.
    for path in ("/", "/nope", "/nope/deeper", "/fnx", "/clsx/text"):
        r = requests.get(f"{BASE}{path}", timeout=30)
        assert r.status_code == 404, (path, r.status_code, r.text)

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
