"""A worker process serves one job: a later driver never gets a worker (and its imports,
module globals and environment) from an earlier one, and a job's idle workers are stopped once
the job ends."""
import json

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
