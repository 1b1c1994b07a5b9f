"""`torus stop` (and so `ray stop`) stops a head and a node run in the foreground
(`torus start --block`, as KubeRay runs `ray start --block`): each is one of its session's
daemons while it runs, and exits cleanly on the stop."""
import subprocess
import tempfile

from helpers import clean_env, free_port, run, torus_bin, wait_until


def test_torus_stop_stops_a_foreground_head_and_node():
    with tempfile.TemporaryDirectory() as tmp:
        env = clean_env(TORUS_TMPDIR=tmp)
        port = free_port()
        head = subprocess.Popen([torus_bin(), "start", "--head", "--block", "--port", str(port),
                                 "--num-cpus", "1", "--include-dashboard", "false"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        node = None
        try:
            wait_until(lambda: run([torus_bin(), "status", "--address", f"127.0.0.1:{port}"],
                                   env=env, check=False).returncode == 0, timeout=30, what="the head up")
            node = subprocess.Popen([torus_bin(), "start", "--address", f"127.0.0.1:{port}", "--block",
                                     "--num-cpus", "1"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wait_until(lambda: run([torus_bin(), "list", "nodes", "--format", "json", "--address",
                                    f"127.0.0.1:{port}"], env=env, check=False).stdout.count('"ALIVE"') == 2,
                       timeout=30, what="the foreground node registered")
            out = run([torus_bin(), "stop"], env=env).stdout
            assert "Stopped 2 Torus process(es)" in out, out
            assert head.wait(timeout=30) == 0
            assert node.wait(timeout=30) == 0
        finally:
            for p in (head, node):
                if p and p.poll() is None:
                    p.kill()
                    p.wait()
