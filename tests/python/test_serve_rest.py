"""Ray Serve's REST API on the head (docs/http.md, src/head/serve_http.h), as KubeRay's RayService
calls it on the dashboard port: PUT /api/serve/applications/ with Serve's declarative config,
GET for ServeInstanceDetails, DELETE to shut Serve down. The head stores the config in its KV
store (namespace serve) and starts Serve with a bootstrap job when no controller is alive; the
controller applies it. Also the token rule and bad configs."""
import json
import socket
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import (Cluster, dashboard_url, free_port, ray_client_bin, ray_env, run,
                     wait_until)

EMPTY_DETAILS = {"controller_info": {}, "proxy_location": None, "http_options": None,
                 "grpc_options": None, "proxies": {}, "applications": {}, "target_capacity": None}

APP = '''
try:
    from ray import serve
except ImportError:  # outside the ray import shim
    from torus import serve


@serve.deployment
class Hello:
    def __call__(self, request):
        return "hello"


app = Hello.bind()
'''


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    apps = tmp_path_factory.mktemp("serve-apps")
    (apps / "hello_app.py").write_text(textwrap.dedent(APP))
    c = Cluster()
    # The cluster's processes (the bootstrap job, the controller, the build task) import the app
    # from here; the bootstrap job runs this interpreter (it has torus installed).
    c.env["PYTHONPATH"] = str(apps)
    c.env["TORUS_SERVE_PYTHON"] = sys.executable
    try:
        c.start_head("--num-cpus", "4", "--dashboard-port", str(free_port()))
        yield c
    finally:
        c.stop()


def http(cluster, method, path, body=None, token="cluster", url=None, timeout=30):
    """(status, body text) of one request; token "cluster" = the cluster's, None = no header."""
    h = {}
    if token == "cluster":
        token = (Path(cluster.session) / "token").read_text().strip()
    if token is not None:
        h["Authorization"] = "Bearer " + token
    if body is not None:
        h["Content-Type"] = "application/json"
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else \
        body.encode() if isinstance(body, str) else body
    req = urllib.request.Request((url or dashboard_url(cluster)) + path, data=data, method=method,
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def details(cluster):
    code, text = http(cluster, "GET", "/api/serve/applications/")
    assert code == 200, (code, text)
    return json.loads(text)


def bootstrap_jobs(cluster):
    code, text = http(cluster, "GET", "/api/jobs/")
    assert code == 200, text
    return [j for j in json.loads(text) if j["submission_id"].startswith("serve-bootstrap-")]


def diagnostics(cluster) -> str:
    """The bootstrap jobs' logs and the details, for a failure's message."""
    out = [f"details: {http(cluster, 'GET', '/api/serve/applications/')[1]}"]
    for j in bootstrap_jobs(cluster):
        logs = http(cluster, "GET", f"/api/jobs/{j['submission_id']}/logs")[1]
        out.append(f"job {j['submission_id']} {j['status']}: {json.loads(logs)['logs'][-4000:]}")
    return "\n".join(out)


def port_open(port) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_token_is_required(head):
    for method in ("GET", "PUT", "DELETE"):
        code, text = http(head, method, "/api/serve/applications/", body="{}" if method == "PUT" else None,
                          token=None)
        assert code == 401 and "Unauthorized" in text, (method, code, text)
        code, text = http(head, method, "/api/serve/applications/", body="{}" if method == "PUT" else None,
                          token="not-the-token")
        assert code == 403 and "Forbidden" in text, (method, code, text)
    # Nothing was stored or started.
    assert details(head) == EMPTY_DETAILS
    assert bootstrap_jobs(head) == []


def test_bad_configs_are_refused_naming_the_problem(head):
    cases = [
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "the request body"),
        ({"applications": {"name": "x"}}, "applications must be a list"),
        ({"applications": [{"name": "a", "import_path": "m:a", "route_prefix": "/a"},
                           {"name": "b", "import_path": "nocolon"}]},
         'applications[1].import_path must be a non-empty string "module:attribute"'),
        ({"applications": [{"name": "a", "import_path": ""}]}, "applications[0].import_path"),
        ({"applications": [{"name": "a", "import_path": "m:a", "route_prefix": "/a"},
                           {"name": "a", "import_path": "m:b", "route_prefix": "/b"}]},
         "application names must be unique"),
    ]
    for body, expect in cases:
        code, text = http(head, "PUT", "/api/serve/applications/", body=body)
        assert code == 400 and expect in text, (body, code, text)
    assert details(head) == EMPTY_DETAILS
    assert bootstrap_jobs(head) == []


def test_details_before_anything_is_deployed(head):
    assert details(head) == EMPTY_DETAILS
    # The same route without the trailing slash, JSON as Ray's.
    req = urllib.request.Request(dashboard_url(head) + "/api/serve/applications", headers={
        "Authorization": "Bearer " + (Path(head.session) / "token").read_text().strip()})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        assert json.loads(r.read()) == EMPTY_DETAILS


def hello_config(port):
    return {"proxy_location": "EveryNode", "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [{"name": "hello", "route_prefix": "/",
                              "import_path": "hello_app:app", "runtime_env": {}}]}


def wait_running(cluster, name="hello"):
    def running():
        app = details(cluster).get("applications", {}).get(name) or {}
        return app.get("status") == "RUNNING"

    try:
        wait_until(running, timeout=60, interval=0.5, what=f"application {name} RUNNING")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnostics(cluster)}") from None


def wait_shut_down(cluster, port):
    try:
        wait_until(lambda: details(cluster)["applications"] == {}, timeout=60, interval=0.5,
                   what="no applications after DELETE")
        wait_until(lambda: not port_open(port), timeout=60, interval=0.5,
                   what=f"Serve's HTTP port {port} to close")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnostics(cluster)}") from None


def test_deploy_serve_and_shut_it_down(head):
    port = free_port()
    config = hello_config(port)
    code, text = http(head, "PUT", "/api/serve/applications/", body=config)
    assert code == 200 and text == "", (code, text)
    wait_running(head)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
        assert r.read().decode() == "hello"

    # The same config again: applied by the live controller, no second bootstrap job.
    code, text = http(head, "PUT", "/api/serve/applications", body=config)
    assert code == 200, (code, text)
    assert len(bootstrap_jobs(head)) == 1, bootstrap_jobs(head)

    code, text = http(head, "DELETE", "/api/serve/applications/")
    assert code == 200 and text == "", (code, text)
    wait_shut_down(head, port)


def test_deploy_right_after_delete_starts_serve_again(head):
    """DELETE answers once the controller is gone (as Ray's), so a PUT after it is not handed to
    a controller on its way out (which would drop it: the PUT would find the controller alive and
    start no new one). The controller polls the version every 0.5 s and takes a moment to shut
    down; the delays cover that window, had the DELETE answered at once."""
    port = free_port()
    for delay in (0.6, 0.9):
        assert http(head, "PUT", "/api/serve/applications/", body=hello_config(port))[0] == 200
        wait_running(head)
        assert http(head, "DELETE", "/api/serve/applications/")[0] == 200
        time.sleep(delay)
        assert http(head, "PUT", "/api/serve/applications/", body=hello_config(port))[0] == 200
        wait_running(head)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert r.read().decode() == "hello", delay
        assert http(head, "DELETE", "/api/serve/applications/")[0] == 200
        wait_shut_down(head, port)


def serve_cli(cluster, *args, check=True):
    """Ray 2.60's `serve` CLI (python/requirements-ray-client.txt) against the cluster."""
    p = run([str(ray_client_bin() / "serve"), *args, "--address", dashboard_url(cluster)],
            env=ray_env(cluster), check=check, timeout=120)
    return p.stdout + p.stderr


def test_ray_serve_cli_deploys(head, tmp_path):
    ray_client_bin()  # skips without the client
    out = serve_cli(head, "status")
    assert "applications: {}" in out, out
    port = free_port()
    config = tmp_path / "serve.json"  # YAML's superset: the CLI reads it
    config.write_text(json.dumps(hello_config(port)))
    out = serve_cli(head, "deploy", str(config))
    assert "Sent deploy request successfully" in out, out
    wait_running(head)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
        assert r.read().decode() == "hello"
    assert http(head, "DELETE", "/api/serve/applications/")[0] == 200
    wait_shut_down(head, port)


def test_ray_serve_cli_status_and_shutdown(head, tmp_path):
    ray_client_bin()
    port = free_port()
    config = tmp_path / "serve.json"
    config.write_text(json.dumps(hello_config(port)))
    serve_cli(head, "deploy", str(config))
    wait_running(head)
    try:
        out = serve_cli(head, "status")
        assert "hello" in out and "RUNNING" in out, out
        serve_cli(head, "shutdown", "--yes")
        wait_shut_down(head, port)
    finally:
        http(head, "DELETE", "/api/serve/applications/")
