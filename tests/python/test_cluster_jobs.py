"""A cluster of processes (`torus start`): detached actors outlive their driver; Python drivers
run as jobs (`torus job submit -- python ...`) and connect with torus.init()."""
import sys

import pytest

from helpers import cluster_head, run_python


@pytest.fixture(scope="module")
def head():
    with cluster_head("--num-cpus", "4") as c:
        yield c


def test_detached_actor_outlives_driver(head):
    run_python("""
        import torus
        torus.init(namespace="keep")
        @torus.remote
        class Store:
            def __init__(self):
                self.d = {}
            def set(self, k, v):
                self.d[k] = v
            def get(self, k):
                return self.d.get(k)
        s = Store.options(name="store", lifetime="detached").remote()
        torus.get(s.set.remote("answer", 42))
        t = Store.options(name="scratch").remote()      # dies with this driver
        torus.get(t.set.remote("x", 1))
    """, env=head.driver_env())
    p = run_python("""
        import torus
        torus.init(namespace="keep")
        s = torus.get_actor("store")
        print("VALUE", torus.get(s.get.remote("answer")))
        try:
            torus.get_actor("scratch")
            print("SCRATCH ALIVE")
        except ValueError:
            print("SCRATCH GONE")
        try:
            torus.get_actor("store", namespace="other")
            print("WRONG NS FOUND")
        except ValueError:
            print("NS OK")
        torus.kill(s)
    """, env=head.driver_env())
    assert "VALUE 42" in p.stdout and "NS OK" in p.stdout, p.stdout + p.stderr
    assert "SCRATCH GONE" in p.stdout, p.stdout


def test_python_driver_as_job(head, tmp_path):
    drv = tmp_path / "driver.py"
    drv.write_text(
        "import os, torus\n"
        "torus.init()\n"
        "@torus.remote\n"
        "def sq(x):\n"
        "    return x * x\n"
        "print('JOB', os.environ.get('TORUS_SUBMISSION_ID', '?')[:4], "
        "sum(torus.get([sq.remote(i) for i in range(10)])))\n")
    p = head.torus("job", "submit", "--working-dir", str(tmp_path), "--",
                   sys.executable, str(drv), timeout=300)
    assert "JOB job_ 285" in p.stdout, p.stdout + p.stderr


def test_auto_address_and_env_address(head):
    env = head.driver_env()
    env.pop("TORUS_ADDRESS")
    p = run_python("""
        import torus
        torus.init(address="auto")
        print("NODES", len(torus.nodes()))
    """, env=env)
    assert "NODES 1" in p.stdout, p.stdout + p.stderr
    p = run_python("""
        import torus
        @torus.remote
        def one():
            return 1
        print("AUTOINIT", torus.get(one.remote()), torus.get_runtime_context().gcs_address)
    """, env=dict(head.driver_env(), RAY_ADDRESS=head.address, TORUS_ADDRESS=""))
    assert f"AUTOINIT 1 {head.address}" in p.stdout, p.stdout + p.stderr
