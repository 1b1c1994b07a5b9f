"""The head's durable state (docs/fault_tolerance.md): after a kill -9 of the head, the same
`torus start --head` command resumes the session; named detached actors keep their state and
are reachable by name, placement groups keep their nodes, a running driver rides out the gap."""
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers import Cluster, clean_env, free_port, run_python, torus_bin


def _kill_head(c: Cluster):
    pid = int((Path(c.session) / "pids" / "head.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError("the head did not die")


def _head(num_cpus: str):
    """A head of a new session on a free port: (cluster, port, driver environment)."""
    c = Cluster()
    port = str(free_port())
    c.torus("start", "--head", "--port", port, "--num-cpus", num_cpus)
    c.session = str((Path(c.root) / "session_latest").resolve())
    return c, port, c.env | {"RAY_ADDRESS": f"127.0.0.1:{port}"}


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
    def value(self):
        return self.n
c = Counter.options(name="ctr", lifetime="detached").remote()
assert ray.get(c.inc.remote()) == 1
assert ray.get(c.inc.remote()) == 2
from ray.util.placement_group import placement_group
pg = placement_group([{"CPU": 0.5}], name="keep", lifetime="detached")
ray.get(pg.ready())
print("CREATED", pg.id.hex())
"""

RIDER = """
import time, ray
ray.init(namespace="rider")
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
n = 1
while n < 60:
    n = ray.get(a.add.remote())
    time.sleep(0.05)
# Asked while the head may be away: the lookup waits for the head to come back. A read: the
# test's own check counts the increments, whichever of the two comes first.
assert ray.get(ray.get_actor("ctr", namespace="app").value.remote()) >= 2
print("DONE", n, flush=True)
"""

CHECK = """
import ray
ray.init(namespace="app")
c = ray.get_actor("ctr")
print("INC", ray.get(c.inc.remote()))
from ray.util import placement_group_table
print("PGS", {v["name"]: v["state"] for v in placement_group_table().values()})
"""


def test_kill9_head_then_same_start_command_resumes_the_session():
    c, port, env = _head("2")
    try:
        out = run_python(CREATE, env=env, shim=True).stdout
        assert "CREATED" in out
        # A driver that runs across the head's absence: its actor calls go to the worker
        # directly and keep working; it re-registers its job with the resumed head.
        rider_script = Path(c.root) / "rider.py"
        rider_script.write_text(textwrap.dedent(RIDER))
        rider = subprocess.Popen([sys.executable, "-m", "torus.ray", str(rider_script)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert rider.stdout.readline().strip() == "READY"
        _kill_head(c)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "2")
        assert "resumed" in p.stdout, p.stdout
        assert "resuming session" in p.stderr and "2 actors" in p.stderr and "1 driver" in p.stderr, p.stderr
        assert str(Path(c.session)) in p.stdout  # the same session, not a new one
        out = run_python(CHECK, env=env, shim=True).stdout
        # The actor's worker never stopped: its state carried on.
        assert "INC 3" in out, out
        assert "'keep': 'CREATED'" in out, out
        listed = c.torus("list", "actors", "--format", "json").stdout
        assert '"ctr"' in listed and '"ALIVE"' in listed
        out, err = rider.communicate(timeout=120)
        assert rider.returncode == 0, err
        assert "DONE 60" in out, out + err
    finally:
        c.torus("stop", check=False)


def test_new_session_says_what_it_abandons_and_starts_afresh():
    c, port, env = _head("1")
    try:
        old = c.session
        run_python(CREATE, env=env, shim=True)
        _kill_head(c)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1", "--new-session")
        assert "abandoning session " + old in p.stderr, p.stderr
        assert "1 actor" in p.stderr and "1 placement group" in p.stderr
        assert "started" in p.stdout and old not in p.stdout
        listed = c.torus("list", "actors", "--format", "json").stdout
        assert '"ctr"' not in listed
    finally:
        c.torus("stop", check=False)


def test_session_dir_without_state_is_refused_with_a_clear_error(tmp_path):
    c = Cluster()
    p = c.torus("start", "--head", "--port", str(free_port()), "--session-dir", str(tmp_path),
                check=False)
    assert p.returncode != 0
    assert "no durable head state" in p.stderr and str(tmp_path) in p.stderr


def test_a_running_job_keeps_running_and_its_log_has_every_line_once():
    c, port, env = _head("1")
    try:
        prog = "import time\nfor i in range(40):\n    print('line', i, flush=True); time.sleep(0.1)\n"
        out = c.torus("job", "submit", "--no-wait", "--", sys.executable, "-c", prog).stdout
        job_id = re.search(r"job_[0-9a-f]+", out).group(0)
        log = Path(c.session) / "logs" / f"job-{job_id}.log"
        for _ in range(100):  # some output copied before the head dies
            if log.exists() and log.read_text().count("line") >= 5:
                break
            time.sleep(0.05)
        _kill_head(c)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1")
        assert "1 job" in p.stderr, p.stderr
        status = ""
        for _ in range(200):
            status = c.torus("job", "status", job_id).stdout
            if "SUCCEEDED" in status or "FAILED" in status:
                break
            time.sleep(0.1)
        assert f"{job_id}: SUCCEEDED" in status, status
        lines = c.torus("job", "logs", job_id).stdout.splitlines()
        assert lines == [f"line {i}" for i in range(40)], lines
    finally:
        c.torus("stop", check=False)


def test_a_damaged_state_file_is_refused_whole_with_a_clear_error():
    c, port, env = _head("1")
    try:
        run_python(CREATE, env=env, shim=True)
        _kill_head(c)
        state = Path(c.session) / "head_state.sqlite3"
        # Fold the log into the file (as a checkpoint would), then cut the file short.
        import sqlite3
        con = sqlite3.connect(state)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        os.truncate(state, 5000)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1", check=False)
        assert p.returncode != 0
        assert str(state) in p.stderr and "damaged" in p.stderr, p.stderr
        assert "--new-session" in p.stderr
    finally:
        c.torus("stop", check=False)


def test_after_torus_stop_the_next_head_starts_afresh_and_a_resume_needs_the_same_port():
    c, port, env = _head("1")
    try:
        run_python(CREATE, env=env, shim=True)
        _kill_head(c)
        other = str(free_port())
        p = c.torus("start", "--head", "--port", other, "--num-cpus", "1", check=False)
        assert p.returncode != 0 and f"--port {port}" in p.stderr, p.stderr
        # Nothing of the session was stopped by the refusal: its node still runs.
        assert "node-head" in c.torus("status", "--address", f"127.0.0.1:{port}", check=False).stdout \
            or (Path(c.session) / "pids" / "node-head.pid").exists()
        c.torus("stop")
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1")
        assert "started" in p.stdout and "resum" not in p.stderr, p.stderr
        assert c.session not in p.stdout
    finally:
        c.torus("stop", check=False)


SLOW_ACTOR = """
import os, sys, time
import ray
ray.init(namespace="app")
@ray.remote
class Slow:
    def __init__(self, path):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(3)
    def pid(self):
        return os.getpid()
Slow.options(name="slow", lifetime="detached").remote(sys.argv[1])
print("SUBMITTED", flush=True)
"""


def test_an_actor_being_constructed_when_the_head_dies_is_not_started_twice():
    c, port, env = _head("2")
    try:
        marks = Path(c.root) / "constructed.txt"
        run_python(SLOW_ACTOR, env=env, shim=True, args=(str(marks),))
        for _ in range(200):  # the constructor has begun on the node
            if marks.exists() and marks.read_text().strip():
                break
            time.sleep(0.05)
        _kill_head(c)
        c.torus("start", "--head", "--port", port, "--num-cpus", "2")
        out = run_python("""
import ray
ray.init(namespace="app")
print("PID", ray.get(ray.get_actor("slow").pid.remote()))
""", env=env, shim=True).stdout
        pids = marks.read_text().split()
        assert len(pids) == 1, pids  # one constructor run, not two
        assert f"PID {pids[0]}" in out, out
    finally:
        c.torus("stop", check=False)


GROUP = """
import sys
import ray
from ray.util.placement_group import placement_group
ray.init(namespace="app")
pg = placement_group([{"CPU": 2}], name=sys.argv[1], lifetime="detached")
ray.get(pg.ready())
print("CREATED", pg.id.hex())
"""

REMOVE = """
import ray
from ray.util.placement_group import get_placement_group, remove_placement_group
ray.init(namespace="app")
remove_placement_group(get_placement_group("a"))
"""

IN_A = """
import ray
from ray.util.placement_group import get_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(namespace="app")
@ray.remote(num_cpus=2)
def inside():
    return "RAN"
s = PlacementGroupSchedulingStrategy(placement_group=get_placement_group("a"))
print(ray.get(inside.options(scheduling_strategy=s).remote(), timeout=60))
"""


def _groups(c: Cluster) -> dict:
    out = c.torus("list", "placement-groups", "--format", "json").stdout
    return {g["name"]: g for g in json.loads(out) if g["state"] != "REMOVED"}


def _cpu_available(c: Cluster):
    """The CPUs the alive nodes' own ledgers have free; None before a node registered."""
    nodes = json.loads(c.torus("list", "nodes", "--format", "json").stdout)
    alive = [n for n in nodes if n["state"] == "ALIVE"]
    return sum(n["resources_available"].get("CPU", 0) for n in alive) if alive else None


def test_a_head_restored_from_an_older_state_reconciles_bundles_with_its_nodes():
    """Issue 41: a head whose state is older than the nodes' reality (a restored backup, commits
    lost in a power cut) listed a group CREATED that no node held, and a group the nodes held
    but it did not know was dropped at once. Now, when the node registers: the group it records
    but the node lacks (A) is RESCHEDULING and placed again for real; the bundle the node holds
    that it does not know (B's) is released after the stray grace."""
    c, port, env = _head("2")
    grace = ["--stray-bundle-grace-ms", "3000"]
    try:
        run_python(GROUP, env=env, shim=True, args=("a",))
        # A copy of the state while A is CREATED (SQLite's online backup: consistent under WAL).
        state = Path(c.session) / "head_state.sqlite3"
        backup = Path(c.root) / "backup.sqlite3"
        src, dst = sqlite3.connect(state), sqlite3.connect(backup)
        src.backup(dst)
        dst.close()
        src.close()
        run_python(REMOVE, env=env, shim=True)
        run_python(GROUP, env=env, shim=True, args=("b",))
        assert set(_groups(c)) == {"b"}
        _kill_head(c)
        for suffix in ("-wal", "-shm"):  # the later commits must not be replayed
            Path(str(state) + suffix).unlink(missing_ok=True)
        shutil.copyfile(backup, state)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "2", *grace)
        assert "resumed" in p.stdout, p.stdout + p.stderr
        # A stays listed until it is whole again; the node holds B's 2 CPUs until the grace ends.
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            groups = _groups(c)
            state_a = groups["a"]["state"]
            if not seen or seen[-1] != state_a:
                seen.append(state_a)
            if state_a == "CREATED" and "RESCHEDULING" in seen and _cpu_available(c) == 0:
                break
            time.sleep(0.05)
        assert "RESCHEDULING" in seen and seen[-1] == "CREATED", seen
        assert "b" not in groups, groups
        node = [n for n in json.loads(c.torus("list", "nodes", "--format", "json").stdout)
                if n["state"] == "ALIVE"]
        assert [b["node_id"] for b in groups["a"]["bundles"]] == [node[0]["node_id"]], groups["a"]
        # The node really holds A's bundle: its 2 CPUs are reserved, and work in A runs there.
        assert node[0]["resources_available"].get("CPU", 0) == 0, node
        assert "RAN" in run_python(IN_A, env=env, shim=True).stdout
    finally:
        c.torus("stop", check=False)
