"""Torus's `ray` entry point for images (docs/kuberay.md): the exact commands KubeRay v1.5.0 runs
in a head and a worker container bring up a cluster (each "pod" with its own session root, the
token shared through the environment as a Kubernetes secret would be), `ray health-check` and
KubeRay's HTTP probes see it ready, a Ray program runs on it, and the kubelet's SIGTERM stops it."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, clean_env, free_port, run, run_python, torus_bin, wait_until


def _ray_compat_dir(tmp_path) -> Path:
    """The installed lib/torus/ray-compat (pip install . puts it under sys.prefix); outside CI, a
    prefix made from this checkout's script and the torus command under test."""
    installed = Path(sys.prefix) / "lib" / "torus" / "ray-compat"
    if (installed / "ray").is_file():
        return installed
    if os.environ.get("CI"):
        pytest.fail(f"the Python package did not install {installed / 'ray'}")
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib" / "torus" / "ray-compat").mkdir(parents=True)
    os.symlink(torus_bin(), prefix / "bin" / "torus")
    shutil.copy(REPO / "scripts" / "ray-compat" / "ray", prefix / "lib" / "torus" / "ray-compat")
    return prefix / "lib" / "torus" / "ray-compat"


def _outward_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("8.8.8.8", 53))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _probe(url: str) -> bool:
    try:
        return b"success" in urllib.request.urlopen(url, timeout=2).read()
    except OSError:
        return False


DRIVER = """
import time, ray
ray.init()
deadline = time.time() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
    time.sleep(0.2)
assert ray.cluster_resources().get("TPU") == 4, ray.cluster_resources()

@ray.remote(resources={"TPU": 4})
def on_the_tpu_host():
    return ray.get_runtime_context().get_node_id()

print("RAN_ON", ray.get(on_the_tpu_host.remote()))
"""


def test_kuberay_commands_bring_up_a_cluster_that_runs_a_ray_program(tmp_path):
    ray_dir = _ray_compat_dir(tmp_path)
    token = os.urandom(16).hex()
    base = clean_env(PATH=f"{ray_dir}:{os.environ['PATH']}")
    head_env = base | {"TORUS_TMPDIR": str(tmp_path / "head-pod"), "TORUS_TOKEN": token}
    worker_env = base | {"TORUS_TMPDIR": str(tmp_path / "worker-pod"), "RAY_AUTH_MODE": "token",
                         "RAY_AUTH_TOKEN": token}
    for e in (head_env, worker_env):
        Path(e["TORUS_TMPDIR"]).mkdir()
    ip, port = _outward_ip(), free_port()
    dash, head_agent, worker_agent = free_port(), free_port(), free_port()
    assert shutil.which("ray", path=base["PATH"]) == str(ray_dir / "ray")

    # Nothing there yet: the workers' init container keeps looping.
    hc = ["ray", "health-check", "--address", f"{ip}:{port}"]
    assert run(hc, env=base, check=False).returncode != 0

    head_log, worker_log = tmp_path / "head.log", tmp_path / "worker.log"
    head = subprocess.Popen(
        ["/bin/bash", "-c", "--",
         f"ulimit -n 65536 2>/dev/null; ray start --head --block --port={port} "
         f"--dashboard-agent-listen-port={head_agent} --dashboard-host=0.0.0.0 "
         f"--dashboard-port={dash} --memory=2147483648 --metrics-export-port=8080 --num-cpus=2"],
        env=head_env, stdout=open(head_log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        wait_until(lambda: run(hc, env=base, check=False).returncode == 0, timeout=30,
                   what="ray health-check to pass")
        wait_until(lambda: _probe(f"http://localhost:{dash}/api/gcs_healthz"), timeout=15,
                   what="the head's gcs_healthz probe")
        wait_until(lambda: _probe(f"http://localhost:{head_agent}/api/local_raylet_healthz"),
                   timeout=15, what="the head node's raylet probe")
        worker = subprocess.Popen(
            ["/bin/bash", "-c", "--",
             f"ulimit -n 65536 2>/dev/null; ray start --address={ip}:{port} --block "
             f"--dashboard-agent-listen-port={worker_agent} --memory=1073741824 --num-cpus=1 "
             "--resources='{\"TPU\":4}' --labels=pool=tpu --metrics-export-port=8080"],
            env=worker_env, stdout=open(worker_log, "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        wait_until(lambda: _probe(f"http://localhost:{worker_agent}/api/local_raylet_healthz"),
                   timeout=30, what="the worker's raylet probe")

        out = run_python(DRIVER, shim=True, env=base | {
            "TORUS_TMPDIR": str(tmp_path / "driver"), "TORUS_TOKEN": token,
            "RAY_ADDRESS": f"{ip}:{port}"}).stdout
        assert "RAN_ON" in out, out

        status = run(["ray", "status", "--address", f"{ip}:{port}"],
                     env=base | {"TORUS_TOKEN": token})
        assert "TPU" in status.stdout, status.stdout
        assert head_log.read_text().count("ignoring --metrics-export-port") == 1
    finally:
        for p in (worker, head):  # what the kubelet does when the pod goes
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        codes = [p.wait(timeout=30) for p in (worker, head) if p is not None]
    assert codes == [0] * len(codes), (codes, head_log.read_text()[-2000:],
                                       worker_log.read_text()[-2000:] if worker_log.exists() else "")


def test_ray_refuses_what_it_does_not_provide(tmp_path):
    ray_dir = _ray_compat_dir(tmp_path)
    env = clean_env(PATH=f"{ray_dir}:{os.environ['PATH']}", TORUS_TMPDIR=str(tmp_path))
    p = run(["ray", "submit", "cluster.yaml", "x.py"], env=env, check=False)
    assert p.returncode == 2 and "ray submit is not provided" in p.stderr, p.stderr
    p = run(["ray", "start", "--num-cpus=1"], env=env, check=False)
    assert p.returncode == 2 and "--head" in p.stderr and "--address" in p.stderr, p.stderr
