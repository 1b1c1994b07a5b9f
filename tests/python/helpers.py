"""Helpers of the Python suite: the `torus` CLI, real clusters in temporary session roots,
drivers in subprocesses."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def torus_bin() -> str:
    """The `torus` command: $TORUS_BIN, the one installed beside this interpreter, PATH, build/."""
    cands = [os.environ.get("TORUS_BIN"), str(Path(sys.executable).parent / "torus"),
             shutil.which("torus"), str(REPO / "build" / "torus")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise RuntimeError("no `torus` command found (set TORUS_BIN)")


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORUS_ADDRESS", "RAY_ADDRESS", "TORUS_TOKEN", "TORUS_RAY_SHIM",
                        "TORUS_WORKER_MODE")}
    env.setdefault("TORUS_TPU_METADATA_URL", "off")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, env=None, timeout=300, check=True, cwd=None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


def run_python(code: str, env=None, timeout=300, check=True, args=(), shim=False,
               cwd=None) -> subprocess.CompletedProcess:
    """Runs `code` as a script in a fresh interpreter (through `python -m torus.ray` if shim)."""
    d = tempfile.mkdtemp(prefix="torus-py-")
    script = Path(d) / "prog.py"
    script.write_text(textwrap.dedent(code))
    cmd = [sys.executable] + (["-m", "torus.ray"] if shim else []) + [str(script), *args]
    return run(cmd, env=env if env is not None else clean_env(), timeout=timeout, check=check,
               cwd=cwd or d)


class Cluster:
    """A cluster of separate processes in its own session root (TORUS_TMPDIR)."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="torus-pytest-")
        os.chmod(self.root, 0o700)
        self.env = clean_env(TORUS_TMPDIR=self.root)
        self.address = ""
        self.session = ""
        self.kind = ""

    def torus(self, *args, timeout=300, check=True):
        return run([torus_bin(), *args], env=self.env, timeout=timeout, check=check)

    def start_head(self, *extra):
        for attempt in range(3):  # the port may be taken between free_port() and the bind
            p = self.torus("start", "--head", "--port", str(free_port()), *extra,
                           check=attempt == 2)
            if p.returncode == 0:
                break
        self.kind = "start"
        self._parse(p.stdout)
        return self

    def add_node(self, *extra):
        self.torus("start", "--address", self.address, *extra)

    def up(self, manifest: str, timeout=200):
        self.kind = "up"
        out = self.torus("up", manifest, "--wait", "--timeout", str(timeout - 30), "--port",
                         str(free_port()), timeout=timeout).stdout
        self._parse(out)
        return self

    def _parse(self, out: str):
        m = re.search(r"address: (\S+)", out) or re.search(r"started at (\S+)", out)
        s = re.search(r"session: (\S+)", out)
        if m:
            self.address = m.group(1)
        if s:
            self.session = s.group(1)
        if not self.address:
            latest = Path(self.root) / "session_latest"
            self.address = (latest / "head_address").read_text().strip()
            self.session = str(latest.resolve())

    def driver_env(self, **extra) -> dict:
        env = dict(self.env)
        env["TORUS_ADDRESS"] = self.address
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def stop(self):
        if self.kind == "up":
            self.torus("down", check=False, timeout=120)
        elif self.kind == "start":
            self.torus("stop", check=False, timeout=120)
        self.kind = ""
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def cluster_up(manifest: str, timeout=200):
    c = Cluster()
    try:
        yield c.up(manifest, timeout)
    finally:
        c.stop()


def one_v6e_slice_manifest(directory) -> str:
    """The example manifest (examples/clusters/v6e-4x4-3-slices.yaml) with one replica: the head
    and one v6e 4x4 slice of 4 hosts, written into `directory`; returns its path."""
    text = (REPO / "examples" / "clusters" / "v6e-4x4-3-slices.yaml").read_text()
    path = Path(directory) / "v6e-4x4.yaml"
    path.write_text(text.replace("replicas: 3", "replicas: 1").replace("maxReplicas: 3",
                                                                       "maxReplicas: 1"))
    return str(path)


@contextlib.contextmanager
def cluster_head(*extra):
    c = Cluster()
    try:
        yield c.start_head(*extra)
    finally:
        c.stop()


def free_port() -> int:
    """A port free on every interface, below the kernel's ephemeral range: a port the kernel
    handed out (bind to 0) can be taken as the source port of any outgoing connection before the
    daemon binds it ("Address already in use"); one below the range never is."""
    import random
    import socket
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200):
        port = random.randint(10000, max(10001, low - 1))
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid="self", field="RssAnon") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def wait_until(pred, timeout=30.0, interval=0.1, what="condition"):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # retried until the deadline
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last!r})"
                                                             if last else ""))


def wait_actor_dead(call, timeout=30.0, call_timeout=10.0):
    """Waits until `call()` (an actor method's .remote()) raises RayActorError on get."""
    import torus
    from torus import exceptions as exc

    def dead():
        try:
            torus.get(call(), timeout=call_timeout)
            return False
        except exc.RayActorError:
            return True

    wait_until(dead, timeout=timeout, what="the actor to die")


def ray_client_bin() -> Path:
    """The bin/ of the pinned real Ray client (python/requirements-ray-client.txt):
    $TORUS_RAY_CLIENT_BIN or .venv-ray/bin. Without it the HTTP tests skip, but not under CI."""
    import pytest
    d = Path(os.environ.get("TORUS_RAY_CLIENT_BIN", REPO / ".venv-ray" / "bin"))
    if not (d / "ray").exists():
        if os.environ.get("CI"):
            raise AssertionError(f"no Ray client at {d} (scripts/test.sh installs it)")
        pytest.skip(f"no Ray client at {d} (pip install -r python/requirements-ray-client.txt)")
    return d


def dashboard_url(cluster) -> str:
    return "http://" + (Path(cluster.session) / "dashboard_address").read_text().strip()


def ray_env(cluster, token=None, **extra) -> dict:
    """The environment of a Ray client talking to `cluster` with its token (as Ray 2.60's
    token auth: RAY_AUTH_MODE=token, RAY_AUTH_TOKEN)."""
    env = clean_env(**extra)
    env.pop("RAY_API_SERVER_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN"] = token if token is not None else (Path(cluster.session) / "token").read_text().strip()
    env["PATH"] = str(ray_client_bin()) + os.pathsep + env.get("PATH", "")
    return env


def ray_job(cluster, *args, env=None, timeout=300, check=True):
    """`ray job ARGS --address http://<the cluster's dashboard>` with the real Ray CLI."""
    cmd = [str(ray_client_bin() / "ray"), "job", args[0], "--address", dashboard_url(cluster), *args[1:]]
    return run(cmd, env=env or ray_env(cluster), timeout=timeout, check=check)
