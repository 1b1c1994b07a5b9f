"""Standby heads on etcd (docs/fault_tolerance.md "Standby heads"): `torus start --head --state
etcd://...` run twice makes an active head and a standby; callers of the standby reach the active
head; after a kill -9 of the active head the standby takes over within seconds, with the named
actors and placement groups the first one kept, and the nodes and drivers carry on."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from helpers import Cluster, free_port, run_python, wait_until


@pytest.fixture
def etcd():
    """A real etcd (Debian's etcd-server) on free ports: yields its client endpoint."""
    exe = shutil.which("etcd")
    assert exe, "etcd is not installed (scripts/deps.sh installs etcd-server)"
    data = tempfile.mkdtemp(prefix="torus-etcd-")
    client, peer = free_port(), free_port()
    proc = subprocess.Popen(
        [exe, "--name", "t", "--data-dir", data,
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"t=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import socket

    def up():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", client)) == 0
    wait_until(up, timeout=30, what="etcd to listen")
    try:
        yield f"127.0.0.1:{client}", proc
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def _pid(session: str, name: str) -> int:
    return int((Path(session) / "pids" / f"{name}.pid").read_text().split()[0])


def _kill9(pid: int):
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or
               Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=10,
               what=f"process {pid} to die")


CREATE = """
import ray
ray.init(namespace="app")
@ray.remote
class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n
c = Counter.options(name="ctr", lifetime="detached").remote()
assert ray.get(c.inc.remote()) == 1
assert ray.get(c.inc.remote()) == 2
from ray.util.placement_group import placement_group
pg = placement_group([{"CPU": 0.5}], name="keep", lifetime="detached")
ray.get(pg.ready())
print("CREATED", flush=True)
"""

RIDER = """
import time, ray
ray.init(namespace="rider")
@ray.remote
def sq(x):
    return x * x
@ray.remote
class Acc:
    def __init__(self):
        self.n = 0
    def add(self):
        self.n += 1
        return self.n
a = Acc.remote()
ray.get(a.add.remote())
print("READY", flush=True)
n, total = 1, 0
while n < 120:
    n = ray.get(a.add.remote())
    total += sum(ray.get([sq.remote(i) for i in range(4)]))
    time.sleep(0.05)
# Needs the head: the lookup reaches whichever head is active now.
v = ray.get(ray.get_actor("ctr", namespace="app").inc.remote())
print("DONE", n, total, v, flush=True)
"""

CHECK = """
import ray
ray.init(namespace="app")
c = ray.get_actor("ctr")
print("INC", ray.get(c.inc.remote()))
from ray.util import placement_group_table
print("PGS", {v["name"]: v["state"] for v in placement_group_table().values()})
@ray.remote
def f():
    return 7
print("TASK", ray.get(f.remote()))
"""


def test_standby_takes_over_after_kill9_of_the_active_head(etcd):
    c = Cluster()
    url = f"etcd://{etcd[0]}/failover-test"
    pa, pb = free_port(), free_port()
    a_addr, b_addr = f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"
    try:
        p = c.torus("start", "--head", "--port", str(pa), "--state", url, "--num-cpus", "2")
        assert f"started at {a_addr}" in p.stdout, p.stdout + p.stderr
        c.kind = "start"
        session = str((Path(c.root) / "session_latest").resolve())
        # A driver started before any standby exists: it learns of the new head from its node
        # when its head cannot be reached.
        rider_script = Path(c.root) / "rider.py"
        rider_script.write_text(textwrap.dedent(RIDER))
        rider = subprocess.Popen([sys.executable, "-m", "torus.ray", str(rider_script)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=c.env | {"RAY_ADDRESS": a_addr})
        assert rider.stdout.readline().strip() == "READY"
        p = c.torus("start", "--head", "--port", str(pb), "--state", url)
        assert "standing by" in p.stdout and a_addr in p.stdout, p.stdout + p.stderr

        # The nodes learn of the standby from the active head's heartbeat replies (it re-reads
        # the heads every 2/3 s); a node that never heard of it could not move to it.
        time.sleep(1.5)
        # A driver given the standby's address reaches the active head through it.
        out = run_python(CREATE, env=c.env | {"RAY_ADDRESS": b_addr}, shim=True).stdout
        assert "CREATED" in out
        status = c.torus("status", "--address", b_addr).stdout
        assert "1 alive, 0 dead" in status, status


        killed = time.monotonic()
        _kill9(_pid(session, "head"))

        def b_active():
            return (Path(session) / f"head_{pb}.state").read_text() == "active"
        wait_until(b_active, timeout=20, interval=0.02, what="the standby to become active")
        took = time.monotonic() - killed
        assert took < 10, f"the standby took {took:.1f} s to take over"

        # The node moved to the new head: it is listed alive there.
        def node_back():
            out = c.torus("list", "nodes", "--format", "json", "--address", b_addr, check=False).stdout
            return '"state": "ALIVE"' in out
        try:
            wait_until(node_back, timeout=30, what="the node to register with the new head")
        except AssertionError:
            logs = Path(session) / "logs"
            raise AssertionError("\n".join(f"== {f.name}\n" + f.read_text()[-3000:]
                                           for f in sorted(logs.glob("*.err"))))

        out = run_python(CHECK, env=c.env | {"RAY_ADDRESS": b_addr}, shim=True).stdout
        check_inc = int(out.split("INC ")[1].split()[0])
        assert "'keep': 'CREATED'" in out, out
        assert "TASK 7" in out, out

        out, err = rider.communicate(timeout=180)
        assert rider.returncode == 0, err
        assert "DONE 120" in out, out + err
        # The actor's worker never stopped: its state carried on (2 before, one call each after).
        assert {check_inc, int(out.split()[-1])} == {3, 4}, out

        # The old head's port again: it stands by for the new active head.
        p = c.torus("start", "--head", "--port", str(pa), "--state", url)
        assert "standing by" in p.stdout and b_addr in p.stdout, p.stdout + p.stderr
    finally:
        c.stop()


def test_a_head_on_an_unreachable_etcd_fails_clearly():
    c = Cluster()
    try:
        p = c.torus("start", "--head", "--port", str(free_port()), "--state",
                    f"etcd://127.0.0.1:{free_port()}", check=False)
        assert p.returncode != 0
        assert "--state etcd://" in p.stderr and "nothing was started" in p.stderr, p.stderr
        p = c.torus("start", "--head", "--state", "etcd://nohostport", check=False)
        assert p.returncode != 0 and "--state" in p.stderr, p.stderr
    finally:
        c.stop()


def test_a_head_cut_off_from_etcd_stops_serving_and_a_new_one_resumes(etcd):
    """Fencing by time: an active head that cannot renew its lease exits before etcd lets
    another head take over; the same start command then resumes the state kept in etcd."""
    endpoint, proc = etcd
    c = Cluster()
    url = f"etcd://{endpoint}/cut-off"
    port = free_port()
    try:
        c.torus("start", "--head", "--port", str(port), "--state", url, "--num-cpus", "2")
        c.kind = "start"
        session = str((Path(c.root) / "session_latest").resolve())
        out = run_python(CREATE, env=c.env | {"RAY_ADDRESS": f"127.0.0.1:{port}"}, shim=True).stdout
        assert "CREATED" in out
        head = _pid(session, "head")
        proc.send_signal(signal.SIGSTOP)  # etcd stops answering (a partition)
        stopped = time.monotonic()
        try:
            wait_until(lambda: not Path(f"/proc/{head}").exists() or
                       Path(f"/proc/{head}/stat").read_text().split()[2] == "Z",
                       timeout=15, interval=0.05, what="the cut-off head to exit")
            took = time.monotonic() - stopped
        finally:
            proc.send_signal(signal.SIGCONT)
        # It must step down before its 2 s lease can run out in etcd.
        assert took < 2.0, f"the cut-off head served {took:.2f} s"
        err = (Path(session) / "logs" / "head.err").read_text()
        assert "lost its leadership" in err, err[-2000:]
        p = c.torus("start", "--head", "--port", str(port), "--state", url, "--num-cpus", "2")
        assert "resum" in p.stdout + p.stderr, p.stdout + p.stderr
        out = run_python(CHECK, env=c.env | {"RAY_ADDRESS": f"127.0.0.1:{port}"}, shim=True).stdout
        assert "INC 3" in out and "TASK 7" in out, out
    finally:
        c.stop()
