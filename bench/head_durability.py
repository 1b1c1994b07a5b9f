"""The head's durable state, measured on a real cluster on this machine (docs/fault_tolerance.md):

  - the cost on the paths that write it: placement-group create+ready and remove, actor
    creation (create until its first call returns), job submission (`torus job submit --no-wait`);
  - the time from a `kill -9` of the head to the cluster serving again: the resuming
    `torus start --head` command, and until a new driver has called a named actor;
  - with --etcd HOST:PORT (a running etcd): the same costs with the state in etcd, and instead
    of a restart, the failover: a standby head started next to the active one, the active head
    killed, and the time until the standby serves (`torus status` through it answers as the
    active head), until the node is back, and until a new driver has called a named actor.

Usage: python bench/head_durability.py [--torus BIN] [--rounds N] [--skip-restart] [--etcd HOST:PORT]
  BIN: the `torus` binary of the build to measure (default build/torus); run it twice, once per
  build, to compare (the Python driver is the installed `torus` package either way; the head,
  nodes and CLI come from BIN). Prints one JSON line per measurement (medians, microseconds).
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

DRIVER = """
import json, sys, time
import ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(namespace="bench")
rounds = int(sys.argv[1])

@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1

out = {}
for _ in range(5):  # warm-up
    pg = placement_group([{"CPU": 0.01}]); ray.get(pg.ready()); remove_placement_group(pg)
create, remove = [], []
for _ in range(rounds):
    t0 = time.perf_counter()
    pg = placement_group([{"CPU": 0.01}])
    ray.get(pg.ready())
    t1 = time.perf_counter()
    remove_placement_group(pg)
    t2 = time.perf_counter()
    create.append((t1 - t0) * 1e6)
    remove.append((t2 - t1) * 1e6)
actors = []
for i in range(max(5, rounds // 10)):
    t0 = time.perf_counter()
    a = A.options(name=f"a{i}").remote()
    ray.get(a.ping.remote())
    actors.append((time.perf_counter() - t0) * 1e6)
    ray.kill(a)
c = A.options(name="keep", lifetime="detached").remote()
ray.get(c.ping.remote())
print(json.dumps({"pg_create": create, "pg_remove": remove, "actor_create": actors}))
"""

CHECK = """
import ray
ray.init(namespace="bench")
ray.get(ray.get_actor("keep").ping.remote())
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs):
    return round(statistics.median(xs), 1)


def failover(cli, py, env, root, port, state, build, times):
    """A standby next to the active head; kill -9 the active one; time the takeover. Then the
    killed head's command again (it stands by for the new active head), `times` times."""
    session = (Path(root) / "session_latest").resolve()
    active, active_pid_file = port, "head"
    standby = str(free_port())
    cli("start", "--head", "--port", standby, *state)
    took = {"failover_kill9_to_standby_active_us": [], "failover_kill9_to_node_back_us": []}
    for i in range(times):
        pid = int((session / "pids" / f"{active_pid_file}.pid").read_text().split()[0])
        time.sleep(1.5)  # the node learns the standby from a heartbeat reply (list re-read every ~0.7 s)
        os.kill(pid, signal.SIGKILL)
        t0 = time.perf_counter()
        while True:
            try:
                os.kill(pid, 0)
                time.sleep(0.002)
            except ProcessLookupError:
                break
        while "active" not in (session / f"head_{standby}.state").read_text():
            time.sleep(0.005)
        t1 = time.perf_counter()
        while True:
            out = cli("list", "nodes", "--format", "json", "--address", f"127.0.0.1:{standby}", check=False).stdout
            if '"state": "ALIVE"' in out:
                break
            time.sleep(0.005)
        t2 = time.perf_counter()
        took["failover_kill9_to_standby_active_us"].append((t1 - t0) * 1e6)
        took["failover_kill9_to_node_back_us"].append((t2 - t0) * 1e6)
        if i == times - 1:
            break
        # The killed head's own command again: it stands by for the new active head.
        killed = active
        active, active_pid_file = standby, f"head-{standby}"
        standby = killed
        cli("start", "--head", "--port", standby, *state)
    env["RAY_ADDRESS"] = f"127.0.0.1:{standby}"  # the dead head's address no longer answers
    py(CHECK)
    t3 = time.perf_counter()
    for name, xs in took.items():
        print(json.dumps({"name": name, "median": median(xs), "max": round(max(xs), 1), "n": len(xs),
                          "build": build}))
    print(json.dumps({"name": "failover_last_kill9_to_named_actor_call_us", "value": round((t3 - t0) * 1e6, 1),
                      "build": build}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torus", default=str(Path(__file__).resolve().parents[1] / "build" / "torus"))
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--skip-restart", action="store_true")
    ap.add_argument("--etcd", default="", help="HOST:PORT of a running etcd: state there, measure failover")
    ap.add_argument("--failovers", type=int, default=1, help="with --etcd: kill the active head this many times")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="torus-durability-")
    env = {k: v for k, v in os.environ.items() if k not in ("TORUS_ADDRESS", "RAY_ADDRESS", "TORUS_TOKEN")}
    port = str(free_port())
    env.update(TORUS_TMPDIR=root, TORUS_TPU_METADATA_URL="off", RAY_ADDRESS=f"127.0.0.1:{port}")
    torus = [args.torus]

    def cli(*a, check=True):
        return subprocess.run(torus + list(a), env=env, capture_output=True, text=True, check=check)

    def py(code, *a):
        f = Path(root) / "prog.py"
        f.write_text(textwrap.dedent(code))
        return subprocess.run([sys.executable, "-m", "torus.ray", str(f), *a], env=env,
                              capture_output=True, text=True, check=True)

    state = ["--state", f"etcd://{args.etcd}/bench-{os.getpid()}"] if args.etcd else []
    cli("start", "--head", "--port", port, "--num-cpus", "2", *state)
    try:
        res = json.loads(py(DRIVER, str(args.rounds)).stdout.strip().splitlines()[-1])
        submit = []
        for _ in range(20):
            t0 = time.perf_counter()
            cli("job", "submit", "--no-wait", "--", "true")
            submit.append((time.perf_counter() - t0) * 1e6)
        build = str(Path(args.torus).resolve().parent)
        for name, key in (("pg_create_ready_us", "pg_create"), ("pg_remove_us", "pg_remove"),
                          ("actor_create_first_call_us", "actor_create")):
            print(json.dumps({"name": name, "median": median(res[key]), "n": len(res[key]), "build": build}))
        print(json.dumps({"name": "job_submit_no_wait_us", "median": median(submit), "n": len(submit),
                          "build": build}))
        if args.skip_restart:
            return
        if args.etcd:
            failover(cli, py, env, root, port, state, build, args.failovers)
            return
        session = (Path(root) / "session_latest").resolve()
        pid = int((session / "pids" / "head.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        while True:
            try:
                os.kill(pid, 0)
                time.sleep(0.005)
            except ProcessLookupError:
                break
        t0 = time.perf_counter()
        p = cli("start", "--head", "--port", port, "--num-cpus", "2")
        t1 = time.perf_counter()
        py(CHECK)
        t2 = time.perf_counter()
        print(json.dumps({"name": "head_kill9_to_start_returned_us", "value": round((t1 - t0) * 1e6, 1),
                          "resumed": "resumed" in p.stdout, "build": build}))
        print(json.dumps({"name": "head_kill9_to_named_actor_call_us", "value": round((t2 - t0) * 1e6, 1),
                          "note": "includes a new driver's start (python -m torus.ray)", "build": build}))
    finally:
        cli("stop", check=False)


if __name__ == "__main__":
    main()
