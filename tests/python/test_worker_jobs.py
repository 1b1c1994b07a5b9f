"""A worker process serves one job: a later driver never gets a worker (and its imports,
module globals and environment) from an earlier one, and a job's idle workers are stopped once
the job ends."""
import json
import time

import sys

from helpers import Cluster, run, wait_until

DRIVER = """
import os, sys, time, ray
ray.init()

@ray.remote
def mark(tag):
    import builtins
    seen = getattr(builtins, "_torus_test_mark", None)
    builtins._torus_test_mark = tag     # a process-wide global a reused worker would keep
    os.environ["TORUS_TEST_MARK"] = tag
    time.sleep(0.2)  # the tasks overlap: the node starts a worker per CPU
    return os.getpid(), seen

@ray.remote
class Holder:
    def pid(self):
        return os.getpid()

tag = sys.argv[1]
h = Holder.remote()
actor_pid = ray.get(h.pid.remote())
res = ray.get([mark.remote(tag) for _ in range(4)])
print("PIDS", sorted({p for p, _ in res} | {actor_pid}))
print("SEEN", sorted({s or "-" for _, s in res}))
print("JOB", ray.get_runtime_context().get_job_id())
"""


def _field(out, name):
    return [l.split(" ", 1)[1] for l in out.splitlines() if l.startswith(name + " ")][0]


def test_a_later_job_gets_fresh_workers_and_a_finished_jobs_idle_workers_stop(tmp_path):
    c = Cluster().start_head("--num-cpus", "2")
    try:
        env = c.driver_env(RAY_ADDRESS=c.address)
        script = tmp_path / "driver.py"  # one program run twice: the same code, the same workers' key
        script.write_text(DRIVER)
        cmd = [sys.executable, "-m", "torus.ray", str(script)]
        first = run(cmd + ["first"], env=env, cwd=tmp_path).stdout
        second = run(cmd + ["second"], env=env, cwd=tmp_path).stdout
        pids1, pids2 = set(json.loads(_field(first, "PIDS"))), set(json.loads(_field(second, "PIDS")))
        assert pids1 and pids2 and not (pids1 & pids2), (first, second)
        # No task of the second job ran where the first job had left its mark.
        assert "first" not in _field(second, "SEEN"), second
        job1, job2 = _field(first, "JOB"), _field(second, "JOB")
        assert job1 != job2

        def workers():
            return json.loads(c.torus("list", "workers", "--format", "json").stdout)

        # Both jobs ended: every worker of theirs is stopped (none idles on for the next job).
        wait_until(lambda: not [w for w in workers() if w["job_id"] in (job1, job2)],
                   timeout=20, what="the finished jobs' workers to stop")
    finally:
        c.stop()


WARM_DRIVER = """
import os, sys, time, ray
ray.init()
print("JOB", ray.get_runtime_context().get_job_id(), flush=True)
sys.stdin.readline()  # the test has listed the workers

@ray.remote(num_cpus=0)
class A:
    def pid(self):
        return os.getpid()

actors = [A.remote() for _ in range(2)]
print("ACTORS", sorted(ray.get([a.pid.remote() for a in actors])), flush=True)
sys.stdin.readline()
"""


def test_a_python_drivers_node_keeps_warm_workers_for_its_job_until_it_ends(tmp_path):
    """Like Ray's prestarted workers: once a Python driver connects, its node starts three
    workers of its job, so its first actors run in interpreters that were already up; actors
    that take them are replaced (tasks only borrow them); they go when the job ends, and
    RAY_prestart_worker_first_driver=0 turns them off."""
    import subprocess
    c = Cluster().start_head("--num-cpus", "2")
    try:
        script = tmp_path / "warm.py"
        script.write_text(WARM_DRIVER)

        def workers(job):
            ws = json.loads(c.torus("list", "workers", "--format", "json").stdout)
            return [w for w in ws if w["job_id"] == job]

        def start(**env):
            p = subprocess.Popen([sys.executable, "-m", "torus.ray", str(script)],
                                 env=c.driver_env(RAY_ADDRESS=c.address, **env),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd=tmp_path)
            line = p.stdout.readline()
            assert line.startswith("JOB "), line
            return p, line.split()[1]

        p, job = start()
        try:
            wait_until(lambda: len([w for w in workers(job) if w["state"] == "idle"]) == 3,
                       timeout=30, what="three warm workers of the driver's job")
            warm = {w["pid"] for w in workers(job)}
            p.stdin.write("\n")
            p.stdin.flush()
            line = p.stdout.readline()
            assert line.startswith("ACTORS "), line
            actor_pids = set(json.loads(line.split(" ", 1)[1]))
            # Both actors run in warm workers started before they were created.
            assert actor_pids <= warm, (actor_pids, warm)
            # The two taken are replaced: three idle again beside the two actors.
            wait_until(lambda: len([w for w in workers(job) if w["state"] == "idle"]) == 3,
                       timeout=30, what="the warm workers the actors took to be replaced")
            assert len([w for w in workers(job) if w["state"] == "actor"]) == 2
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.wait(timeout=60) == 0
        finally:
            p.kill()
        wait_until(lambda: not workers(job), timeout=30,
                   what="the finished job's warm workers to stop")

        p, job = start(RAY_prestart_worker_first_driver="0")
        try:
            time.sleep(1.5)
            assert workers(job) == [], workers(job)
            p.stdin.write("\n\n")
            p.stdin.flush()
            assert p.wait(timeout=60) == 0
        finally:
            p.kill()
    finally:
        c.stop()
