"""TPU slice reservation on a `torus up` cluster (a simulated v6e 4x4 slice: 4 hosts x 4 chips),
with the issue's canonical program run unchanged through `python -m torus.ray`."""
import json

import pytest

from helpers import cluster_up, one_v6e_slice_manifest, run_python


CANONICAL = """
import json, os
import ray
from ray.util.tpu import slice_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

# The issue's program leaves the bundle index out (any bundle); PIN_BUNDLES=1 pins rank i to
# bundle i, as ray.util.tpu.run_on_slice does.
BUNDLE = ((lambda i: {"placement_group_bundle_index": i}) if os.environ.get("PIN_BUNDLES")
          else (lambda i: {}))

# reserve one whole v6e 4x4 slice (16 chips on 4 hosts), atomically
spg = slice_placement_group(topology="4x4", accelerator_version="v6e")
ray.get(spg.placement_group.ready(), timeout=600)

BARRIER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "barrier")
BARRIER_S = float(os.environ.get("BARRIER_S", "120"))
os.makedirs(BARRIER, exist_ok=True)

@ray.remote(resources={"TPU": 4})
def worker(rank, world):
    # As jax.distributed.initialize does: every rank waits for all the others, so the ranks
    # must run at the same time, one per host of the slice.
    import time
    from ray.util import tpu
    open(os.path.join(BARRIER, str(rank)), "w").close()
    deadline = time.time() + BARRIER_S
    while len(os.listdir(BARRIER)) < world:
        if time.time() > deadline:
            raise TimeoutError(f"rank {rank}: only {os.listdir(BARRIER)} of {world} started")
        time.sleep(0.05)
    ctx = ray.get_runtime_context()
    return {"rank": rank, "world": world, "pod": tpu.get_current_pod_name(),
            "worker_id": os.environ.get("TPU_WORKER_ID"),
            "pod_workers": tpu.get_current_pod_worker_count(),
            "chips": tpu.get_num_tpu_chips_on_node(),
            "visible": os.environ.get("TPU_VISIBLE_CHIPS"),
            "tpu_ids": ctx.get_accelerator_ids()["TPU"],
            "node": ctx.get_node_id(),
            "assigned": ctx.get_assigned_resources()}

tasks = [
    worker.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=spg.placement_group, **BUNDLE(i))
    ).remote(rank=i, world=spg.num_hosts)
    for i in range(spg.num_hosts)
]
results = ray.get(tasks, timeout=600)
print("SLICE", json.dumps({
    "num_hosts": spg.num_hosts, "chips_per_host": spg.chips_per_host,
    "num_bundles": spg.num_bundles, "topology": spg.topology,
    "accelerator_version": spg.accelerator_version, "num_slices": spg.num_slices,
    "bundle_resources": spg.bundle_resources,
    "bundle_label_selector": spg.bundle_label_selector,
    "results": results}))
spg.shutdown()
"""


@pytest.fixture(scope="module")
def v6e_cluster(tmp_path_factory):
    # One v6e 4x4 slice (4 hosts) and the head: the example manifest with one replica.
    with cluster_up(one_v6e_slice_manifest(tmp_path_factory.mktemp("manifest"))) as c:
        yield c


def _run_canonical(cluster, **env):
    p = run_python(CANONICAL, env=cluster.driver_env(**env), shim=True, timeout=900)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("SLICE ")]
    assert line, p.stdout + p.stderr
    info = json.loads(line[0][len("SLICE "):])
    assert info["num_hosts"] == 4 and info["chips_per_host"] == 4
    assert info["num_bundles"] == 4 and info["topology"] == "4x4"
    assert info["accelerator_version"] == "v6e" and info["num_slices"] == 1
    assert info["bundle_resources"] == {"CPU": 1, "TPU": 4}
    res = sorted(info["results"], key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == [0, 1, 2, 3] and all(r["world"] == 4 for r in res)
    pods = {r["pod"] for r in res}
    assert len(pods) == 1 and None not in pods          # one slice ...
    assert sorted(r["worker_id"] for r in res) == ["0", "1", "2", "3"]   # ... all its hosts
    assert len({r["node"] for r in res}) == 4
    for r in res:
        assert r["pod_workers"] == 4 and r["chips"] == 4
        assert r["visible"] is None                     # a whole host: all chips (tpu.md §7)
        assert r["tpu_ids"] == ["0", "1", "2", "3"]
        assert r["assigned"].get("TPU") == 4
    sels = info["bundle_label_selector"]
    assert len(sels) == 4 and all(s.get("ray.io/tpu-slice-name") == res[0]["pod"] for s in sels)


def test_canonical_program(v6e_cluster):
    """The issue's program as written (any bundle): the 4 ranks must run at once."""
    _run_canonical(v6e_cluster, BARRIER_S=20)


def test_canonical_program_bundles_pinned(v6e_cluster):
    """The same program with rank i pinned to bundle i (what run_on_slice does)."""
    _run_canonical(v6e_cluster, PIN_BUNDLES=1)


def test_reservation_is_atomic_and_released(v6e_cluster):
    p = run_python("""
        import torus
        from torus.util import tpu
        torus.init()
        a = tpu.slice_placement_group(topology="4x4", accelerator_version="v6e")
        assert torus.get(a.placement_group.ready(), timeout=120) == a.placement_group
        assert tpu.get_num_ready_tpu_slices("4x4", "TPU-V6E") == 0
        assert tpu.get_num_tpu_slices("4x4", "TPU-V6E") == 1
        # The only slice is held: a second request waits and holds nothing.
        b = tpu.slice_placement_group(topology="4x4", accelerator_version="v6e")
        assert not b.placement_group.wait(2)
        assert torus.available_resources().get("TPU", 0) == 0
        a.shutdown()
        assert torus.get(b.placement_group.ready(), timeout=120) == b.placement_group
        b.shutdown()
        # run_on_slice: one task per host, on its own reservation.
        @torus.remote
        def host():
            return tpu.get_current_pod_name(), torus.get_runtime_context().get_node_id()
        got = torus.get(tpu.run_on_slice(host, topology="4x4", accelerator_version="v6e"),
                        timeout=300)
        assert len(got) == 4 and len({n for _, n in got}) == 4 and len({p for p, _ in got}) == 1
        for bad in (dict(topology="3x3", accelerator_version="v6e"),
                    dict(topology="4x4", accelerator_version="v9z")):
            try:
                tpu.slice_placement_group(**bad)
            except ValueError as e:
                print("refused:", e)
            else:
                raise AssertionError(bad)
        print("ATOMIC OK")
    """, env=v6e_cluster.driver_env(), timeout=900)
    assert "ATOMIC OK" in p.stdout, p.stdout + p.stderr
    assert "Invalid accelerator topology: '3x3'" in p.stdout


def test_gang_job_of_python_drivers(v6e_cluster, tmp_path):
    drv = tmp_path / "gang.py"
    drv.write_text(
        "import os, torus\n"
        "torus.init()\n"
        "print('RANK', os.environ['TORUS_PROCESS_ID'], os.environ['TORUS_NUM_PROCESSES'], "
        "len(torus.nodes()), flush=True)\n")
    p = v6e_cluster.torus("job", "submit", "--slice", "4x4", "--accelerator", "v6e",
                          "--working-dir", str(tmp_path), "--", __import__("sys").executable,
                          str(drv), timeout=600)
    ranks = sorted(ln.split("RANK ")[1].split()[0] for ln in p.stdout.splitlines()
                   if "RANK " in ln)
    assert ranks == ["0", "1", "2", "3"], p.stdout + p.stderr
    assert all(" 4 5" in ln for ln in p.stdout.splitlines() if "RANK " in ln), p.stdout


def test_slice_job_through_ray_job_cli(v6e_cluster, tmp_path):
    # Ray's CLI has no slice flag: Torus reads the slice from metadata (docs/http.md); the
    # command then runs once on every host of a whole v6e 4x4 slice, as `torus job --slice`.
    from helpers import ray_job
    p = ray_job(v6e_cluster, "submit", "--metadata-json",
                '{"torus.slice": "4x4", "torus.accelerator": "v6e"}', "--", "sh", "-c",
                'echo "HOST $TPU_WORKER_ID of $TORUS_NUM_PROCESSES on $TPU_NAME"', timeout=600)
    text = p.stdout + p.stderr
    hosts = sorted(ln.split("HOST ")[1] for ln in text.splitlines() if "HOST " in ln)
    assert [h.split()[0] for h in hosts] == ["0", "1", "2", "3"], text
    assert all(h.split()[2] == "4" for h in hosts) and len({h.split()[-1] for h in hosts}) == 1, text
    assert "succeeded" in text, text


def test_slice_metrics(v6e_cluster):
    # The head's /metrics counts the simulated slice (free while nothing holds it).
    import urllib.request
    from pathlib import Path
    from helpers import dashboard_url
    token = (Path(v6e_cluster.session) / "token").read_text().strip()
    req = urllib.request.Request(dashboard_url(v6e_cluster) + "/metrics",
                                 headers={"Authorization": "Bearer " + token})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    lines = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
             if ln and not ln.startswith("#")}
    assert lines['torus_slices{state="free"}'] == 1, text[:2000]
    assert lines['torus_slices{state="broken"}'] == 0
    assert lines['torus_cluster_resource_capacity{resource="TPU"}'] == 16
    assert lines['torus_nodes{state="alive"}'] == 5


def test_fifty_http_clients_while_a_slice_job_runs(v6e_cluster):
    # 50 clients poll the job list and /metrics while a gang job runs on the slice: every answer
    # is a 200 and the job succeeds (its latency under this load: bench/http_load.py).
    import json
    import threading
    import urllib.request
    from pathlib import Path
    from helpers import dashboard_url, wait_until
    token = (Path(v6e_cluster.session) / "token").read_text().strip()
    base = dashboard_url(v6e_cluster)

    def call(method, path, body=None):
        req = urllib.request.Request(base + path, method=method, data=body,
                                     headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()

    code, body = call("POST", "/api/jobs/", json.dumps({
        "entrypoint": "sleep 2; echo done-$TPU_WORKER_ID",
        "metadata": {"torus.slice": "4x4", "torus.accelerator": "v6e"}}).encode())
    assert code == 200, body
    sid = json.loads(body)["submission_id"]
    stop = threading.Event()
    errors, done = [], [0]
    lock = threading.Lock()

    def poll(i):
        path = "/api/jobs/" if i % 2 else "/metrics"
        while not stop.is_set():
            try:
                code, _ = call("GET", path)
                if code != 200:
                    raise RuntimeError(f"{path}: {code}")
                with lock:
                    done[0] += 1
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    errors.append(repr(e))
    threads = [threading.Thread(target=poll, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: json.loads(call("GET", f"/api/jobs/{sid}")[1])["status"]
                   in ("SUCCEEDED", "FAILED", "STOPPED"), 120, 0.2, "the slice job")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    assert done[0] > 50
    d = json.loads(call("GET", f"/api/jobs/{sid}")[1])
    assert d["status"] == "SUCCEEDED", d
    logs = json.loads(call("GET", f"/api/jobs/{sid}/logs")[1])["logs"]
    assert sorted(ln.split("done-")[1] for ln in logs.splitlines() if "done-" in ln) == ["0", "1", "2", "3"]


TIMELINE_PROGRAM = """
import json, os, sys, time
import ray
from ray.util.tpu import slice_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

spg = slice_placement_group(topology="4x4", accelerator_version="v6e")
ray.get(spg.placement_group.ready(), timeout=600)

@ray.remote
def leaf(i):
    time.sleep(0.05)
    return i

@ray.remote(resources={"TPU": 4})
def step(rank):
    print(f"step-marker-{rank}", flush=True)
    print(f"step-err-{rank}", file=sys.stderr, flush=True)
    time.sleep(0.2)
    assert ray.get(leaf.remote(rank)) == rank          # nested: submitted by this worker
    return {"rank": rank, "worker": ray.get_runtime_context().get_worker_id(),
            "node": ray.get_runtime_context().get_node_id()}

@ray.remote
def broken():
    raise ValueError("broken on purpose")

@ray.remote
class Counter:
    def __init__(self):
        self.n = 0
    def incr(self):
        self.n += 1
        return self.n

out = ray.get([step.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
    placement_group=spg.placement_group, placement_group_bundle_index=i)).remote(i)
    for i in range(4)], timeout=600)
c = Counter.remote()
assert ray.get([c.incr.remote() for _ in range(3)]) == [1, 2, 3]
try:
    ray.get(broken.remote())
except Exception:
    pass
events = ray.timeline()
ray.timeline(os.path.join(os.getcwd(), "trace.json"))
print("RESULT", json.dumps({"steps": out, "events": events}))
spg.shutdown()
"""


def test_timeline_of_a_slice_program(v6e_cluster, tmp_path):
    # ray.timeline() and `torus timeline` after a program ran one step per slice host (each
    # submitting a nested task), actor calls and a failing task: one complete event per task,
    # on the row of its worker inside the row group of its node, with the executor's times.
    from helpers import run, torus_bin
    p = run_python(TIMELINE_PROGRAM, env=v6e_cluster.driver_env(), shim=True, timeout=900,
                   cwd=str(tmp_path))
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, p.stdout + p.stderr
    res = json.loads(line[0][len("RESULT "):])
    events, steps = res["events"], res["steps"]
    assert json.loads((tmp_path / "trace.json").read_text()) != []
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    ran = [e for e in events if e["ph"] == "X"]
    by_name = {}
    for e in ran:
        by_name.setdefault(e["name"], []).append(e)
        assert e["pid"] in procs and (e["pid"], e["tid"]) in threads, e
        assert e["ts"] > 1.6e15 and e["dur"] >= 0, e   # µs since the epoch
        assert procs[e["pid"]].startswith("Node " + e["args"]["node_id"][:12]), (procs, e)
        assert threads[(e["pid"], e["tid"])] == "Worker " + e["args"]["worker_id"][:12]
    step_events = [e for name, evs in by_name.items() if name.endswith("step") for e in evs]
    assert len(step_events) == 4
    # Each step on its own host: four node rows, each holding the worker that returned it.
    assert len({e["pid"] for e in step_events}) == 4
    assert {e["args"]["node_id"] for e in step_events} == {s["node"] for s in steps}
    assert {e["args"]["worker_id"] for e in step_events} == {s["worker"] for s in steps}
    assert all(e["dur"] >= 200_000 and e["args"]["state"] == "FINISHED" for e in step_events)
    leaves = [e for name, evs in by_name.items() if name.endswith("leaf") for e in evs]
    assert len(leaves) == 4                     # submitted inside tasks, gathered from workers
    incr = by_name.get("Counter.incr", [])
    assert len(incr) == 3 and all(e["cat"] == "actor_task" for e in incr)
    assert len({(e["pid"], e["tid"]) for e in incr}) == 1   # one actor, one worker row
    failed = [e for name, evs in by_name.items() if name.endswith("broken") for e in evs]
    assert len(failed) == 1 and failed[0]["args"]["state"] == "FAILED"
    assert failed[0]["cname"] == "terrible"
    # The CLI: finished drivers are gone, but the workers that ran the nested tasks still
    # answer; the file is valid trace JSON.
    out = tmp_path / "cli-trace.json"
    r = run([torus_bin(), "timeline", "--output", str(out)], env=v6e_cluster.driver_env())
    assert "task event(s)" in r.stdout
    cli_events = json.loads(out.read_text())
    assert isinstance(cli_events, list)
    assert all({"ph", "pid"} <= set(e) for e in cli_events)


def test_logs_of_every_host_from_anywhere(v6e_cluster, tmp_path):
    # `torus logs` lists each live node's files, reads a worker's stdout and stderr on whichever
    # host ran it, follows a growing file, and refuses names outside its catalog.
    import subprocess
    import time
    from helpers import torus_bin
    prog = """
import json, sys, time
import ray
ray.init(namespace="logs-test")
@ray.remote(resources={"TPU": 4})
class Printer:
    def where(self):
        ctx = ray.get_runtime_context()
        return {"worker": ctx.get_worker_id(), "node": ctx.get_node_id(), "actor": ctx.get_actor_id()}
    def say(self, n):
        for i in range(n):
            print(f"printer-line-{i}", flush=True)
            time.sleep(0.1)
        print("printer-to-stderr", file=sys.stderr, flush=True)
        return n
p = Printer.options(name="printer", lifetime="detached").remote()
print("WHERE", json.dumps(ray.get(p.where.remote())), flush=True)
ray.get(p.say.remote(3))
p.say.remote(40)
time.sleep(1)
"""
    env = v6e_cluster.driver_env()
    r = run_python(prog, env=env, shim=True, timeout=300)
    where = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("WHERE ")][0][6:])
    tb = torus_bin()

    def logs(*args, check=True):
        p = subprocess.run([tb, "logs", *args], env=env, capture_output=True, text=True, timeout=120)
        if check:
            assert p.returncode == 0, (args, p.stdout, p.stderr)
        return p

    listing = logs().stdout
    assert listing.count("Node ") == 5, listing           # head and the 4 slice hosts
    names = [ln.split()[0] for ln in listing.splitlines() if ln.startswith("  ")]
    assert names.count("head.err") == 1                   # the session's files: head's node only
    assert "worker-" + where["worker"][:12] + ".out" in listing
    out = logs("--actor", where["actor"][:10]).stdout
    assert "printer-line-0" in out and "printer-line-2" in out
    assert "printer-to-stderr" in logs("--worker", where["worker"][:10], "--err").stdout
    # NODE FILE: the node by id prefix, the file by name; --tail counts lines.
    name = "worker-" + where["worker"][:12] + ".out"
    tail = logs(where["node"][:8], name, "--tail", "1").stdout
    assert tail.count("\n") == 1
    # --follow shows lines written after it started.
    f = subprocess.Popen([tb, "logs", where["node"][:8], name, "--follow", "--tail", "0"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    f.terminate()
    followed, _ = f.communicate(timeout=30)
    assert "printer-line-" in followed
    # Names outside the catalog, unknown nodes and bad flags: refused with a clear message.
    for args, msg in [(("../token",), "no live node or log file is named"),
                      ((where["node"][:8], "../../token"), "no log file matches"),
                      (("no-such-node", "head.err"), "no live node is named"),
                      (("--tail", "x"), "--tail must be"),
                      (("--follow",), "need a FILE"),
                      (("--actor", "0000000000"), "no actor")]:
        p = logs(*args, check=False)
        assert p.returncode != 0 and msg in p.stderr, (args, p.stderr)
    # The session's token file is not a log: never readable through `torus logs`.
    assert logs("token", check=False).returncode != 0
    run_python("import ray\nray.init(namespace='logs-test')\nray.kill(ray.get_actor('printer'))\n",
               env=env, shim=True)
