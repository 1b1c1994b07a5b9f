"""The `serve` command of the package (python/torus/serve/scripts.py), as Ray Serve's CLI is
used: `serve build` writes a config for an application; `serve deploy` sends a config file to
the cluster's REST API (dashboard address and token from the latest local session) and the
application runs; `serve status` and `serve config` show it; `serve shutdown -y` stops Serve;
`serve run --non-blocking` deploys from `module:app`; bad config files are refused with their
reason."""
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers import Cluster, free_port, run

APP = '''
from ray import serve

@serve.deployment(ray_actor_options={"num_cpus": 0})
class Greeter:
    def __init__(self, greeting="hello"):
        self.greeting = greeting
    def reconfigure(self, config):
        self.greeting = config.get("greeting", self.greeting)
    def __call__(self, request):
        return self.greeting

app = Greeter.bind()
'''


def serve_cmd(c, *args, check=True, cwd=None):
    exe = Path(sys.executable).parent / "serve"
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "torus.serve.scripts"]
    return run(cmd + list(args), env=c.env, check=check, cwd=cwd, timeout=180)


def get(port, path="/"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode()


def port_closes(port, timeout=60) -> bool:
    """Whether Serve's HTTP port stops answering within `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            get(port)
        except OSError:
            return True
        time.sleep(0.3)
    return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    apps = tmp_path_factory.mktemp("serve-cli-apps")
    (apps / "greeter.py").write_text(textwrap.dedent(APP))
    c = Cluster()
    c.env["PYTHONPATH"] = str(apps)
    c.env["TORUS_SERVE_PYTHON"] = sys.executable
    c.apps = apps
    try:
        c.start_head("--num-cpus", "4", "--dashboard-port", str(free_port()))
        yield c
    finally:
        c.stop()


def test_build_deploy_status_config_shutdown(cluster, tmp_path):
    port = free_port()
    out = serve_cmd(cluster, "build", "greeter:app", cwd=str(cluster.apps)).stdout
    cfg = yaml.safe_load(out)
    assert cfg["applications"][0]["import_path"] == "greeter:app"
    assert cfg["applications"][0]["deployments"][0]["name"] == "Greeter"
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    cfg["applications"][0]["deployments"][0]["user_config"] = {"greeting": "hi from config"}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = serve_cmd(cluster, "deploy", str(path)).stdout
    assert "Sent deploy request successfully" in out
    deadline = time.time() + 90
    while time.time() < deadline:
        st = yaml.safe_load(serve_cmd(cluster, "status").stdout)
        if st["applications"].get("default", {}).get("status") == "RUNNING":
            break
        time.sleep(0.5)
    assert st["applications"]["default"]["status"] == "RUNNING", st
    assert st["applications"]["default"]["deployments"]["Greeter"]["status"] == "HEALTHY"
    assert get(port) == "hi from config"
    shown = yaml.safe_load(serve_cmd(cluster, "config").stdout)
    assert shown["import_path"] == "greeter:app"
    out = serve_cmd(cluster, "shutdown", "-y").stdout
    assert "shutdown" in out.lower()
    if not port_closes(port):
        pytest.fail("the HTTP port still answers after `serve shutdown -y`")


def test_run_non_blocking_then_shutdown(cluster):
    port = free_port()
    p = serve_cmd(cluster, "run", "--non-blocking", "--port", str(port), "greeter:app",
                  cwd=str(cluster.apps))
    assert "Deployed" in p.stdout, p.stdout + p.stderr
    assert get(port) == "hello"
    serve_cmd(cluster, "shutdown", "-y")


def test_bad_config_files_are_refused_with_their_reason(cluster, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [ {name: x, import_path: 3\n")
    p = serve_cmd(cluster, "deploy", str(bad), check=False)
    assert p.returncode != 0 and "not valid YAML" in p.stderr, p.stderr
    bad.write_text("applications:\n  - name: x\n    nonsense: 1\n")
    p = serve_cmd(cluster, "deploy", str(bad), check=False)
    assert p.returncode != 0 and "not a valid Serve config" in p.stderr and "import_path" in \
        p.stderr, p.stderr
    p = serve_cmd(cluster, "deploy", str(tmp_path / "missing.yaml"), check=False)
    assert p.returncode != 0 and "no such config file" in p.stderr, p.stderr


WD_APP = '''
import os
from ray import serve

@serve.deployment(ray_actor_options={"num_cpus": 0})
class Reader:
    def __call__(self, request):
        # Relative to the replica's working directory: the application's working_dir.
        with open("message.txt") as f:
            return f.read().strip() + " from " + os.path.basename(os.getcwd())

app = Reader.bind()
'''


def test_an_applications_working_dir_holds_its_code_and_files(cluster, tmp_path):
    """runtime_env working_dir in a config file, as Ray's docs write it: a path relative to the
    config file. Its module is on no one's import path; the replicas import it from the
    working_dir and run in it. `serve deploy` (REST) and `serve run` both take it."""
    proj = tmp_path / "project"
    (proj / "code").mkdir(parents=True)
    (proj / "code" / "wd_app.py").write_text(textwrap.dedent(WD_APP))
    (proj / "code" / "message.txt").write_text("shipped")
    for how in ("deploy", "run"):
        port = free_port()
        cfg = {"http_options": {"host": "127.0.0.1", "port": port},
               "applications": [{"name": "wd", "route_prefix": "/", "import_path": "wd_app:app",
                                 "runtime_env": {"working_dir": "./code"}}]}
        path = proj / "serve.yaml"
        path.write_text(yaml.safe_dump(cfg))
        if how == "deploy":
            serve_cmd(cluster, "deploy", str(path))
            deadline = time.time() + 90
            while time.time() < deadline:
                st = yaml.safe_load(serve_cmd(cluster, "status").stdout)
                if st["applications"].get("wd", {}).get("status") in ("RUNNING",
                                                                      "DEPLOY_FAILED"):
                    break
                time.sleep(0.5)
            assert st["applications"]["wd"]["status"] == "RUNNING", st
        else:
            p = serve_cmd(cluster, "run", "--non-blocking", str(path), cwd=str(tmp_path))
            assert "Deployed" in p.stdout, p.stdout + p.stderr
        text = get(port)
        assert text.startswith("shipped from "), text
        serve_cmd(cluster, "shutdown", "-y")
        port_closes(port)
