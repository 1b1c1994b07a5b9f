"""Inputs a hostile or careless client sends (issue 41): JSON nested deep enough to overflow a
thread's stack, and a cluster token with a trailing newline or a control character."""
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import Cluster, clean_env, dashboard_url, free_port, run, run_python, torus_bin, wait_until

@pytest.fixture(scope="module")
def head():
    c = Cluster().start_head("--num-cpus", "2", "--dashboard-port", str(free_port()))
    try:
        c.token = (Path(c.session) / "token").read_text().strip()
        yield c
    finally:
        c.stop()


def http(cluster, method, path, body=None, token=None):
    headers = {"Authorization": "Bearer " + (token or cluster.token)}
    req = urllib.request.Request(dashboard_url(cluster) + path, data=body.encode() if body else None,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def nested_objects(depth):
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


# ---- item 2: one authenticated request killed the head (SIGSEGV copying 100k-deep metadata)

def test_deeply_nested_job_metadata_is_refused_and_the_head_keeps_serving(head):
    deep = nested_objects(100000)
    bodies = [
        '{"entrypoint": "true", "metadata": ' + deep + "}",
        '{"entrypoint": "true", "runtime_env": {"config": ' + deep + "}}",
        "[" * 100000 + "]" * 100000,
        '{"entrypoint": "true", "metadata": ' + nested_objects(65) + "}",
    ]
    for body in bodies:
        code, text = http(head, "POST", "/api/jobs/", body)
        assert code == 400, (code, text[:300])
        assert "JSON nested deeper than 64 levels" in text, text[:300]
    # The sign-in page's body is JSON too (and needs no token).
    req = urllib.request.Request(dashboard_url(head) + "/api/authenticate", method="POST",
                                 data=('{"token": ' + deep + "}").encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 401
    # The head still answers, over HTTP and gRPC, and runs a job.
    assert http(head, "GET", "/api/version")[0] == 200
    code, text = http(head, "POST", "/api/jobs/",
                      json.dumps({"entrypoint": "echo alive", "metadata": {"k": "v"}}))
    assert code == 200, text
    sid = json.loads(text)["submission_id"]
    wait_until(lambda: json.loads(http(head, "GET", f"/api/jobs/{sid}")[1])["status"] == "SUCCEEDED",
               120, what="the job after the deep requests")
    head.torus("status")  # and over gRPC


# ---- item 3: a token with a trailing newline aborted the CLI and the driver, printing it

DRIVER = """
import torus
torus.init()

@torus.remote
def f(x):
    return x + 1

print("RESULT", torus.get(f.remote(41), timeout=120))
"""


def test_token_with_trailing_newline_works_for_cli_driver_and_ray_entry_point(head):
    for tok in (head.token + "\n", head.token + "\r\n", "  " + head.token + "\t\n"):
        env = clean_env(TORUS_TMPDIR=head.root, TORUS_ADDRESS=head.address, TORUS_TOKEN=tok)
        p = run([torus_bin(), "list", "nodes", "--format", "json"], env=env, check=False, timeout=120)
        assert p.returncode == 0, p.stderr
        assert len(json.loads(p.stdout)) == 1
        p = run_python(DRIVER, env=env, check=False, timeout=300)
        assert p.returncode == 0 and "RESULT 42" in p.stdout, p.stderr[-2000:]
    # Ray's variable, as a Kubernetes secret gives it.
    env = clean_env(TORUS_TMPDIR=head.root, RAY_AUTH_TOKEN=head.token + "\n")
    p = run([torus_bin(), "ray", "health-check", "--address", head.address], env=env, check=False,
            timeout=120)
    assert p.returncode == 0, p.stderr
    # The session's token file, as an editor or `echo` leaves it.
    token_file = Path(head.session) / "token"
    try:
        token_file.write_text(head.token + "\r\n")
        env = clean_env(TORUS_TMPDIR=head.root)
        p = run([torus_bin(), "status"], env=env, check=False, timeout=120)
        assert p.returncode == 0, p.stderr
    finally:
        token_file.write_text(head.token)


def test_token_with_a_control_character_is_refused_without_echoing_it(head):
    bad = head.token[:5] + "\x07" + head.token[5:]
    want = "contains a control character (byte 0x07 at offset 5); tokens are printable ASCII"
    env = clean_env(TORUS_TMPDIR=head.root, TORUS_ADDRESS=head.address, TORUS_TOKEN=bad)
    cli = run([torus_bin(), "list", "nodes"], env=env, check=False, timeout=120)
    assert cli.returncode > 0, (cli.returncode, cli.stderr)  # an exit with an error, not a signal
    assert "the cluster token in TORUS_TOKEN " + want in cli.stderr, cli.stderr
    driver = run_python(DRIVER, env=env, check=False, timeout=300)
    assert driver.returncode == 1 and want in driver.stderr, (driver.returncode, driver.stderr[-2000:])
    env = clean_env(TORUS_TMPDIR=head.root, RAY_AUTH_TOKEN=bad)
    ray = run([torus_bin(), "ray", "health-check", "--address", head.address], env=env, check=False,
              timeout=120)
    assert ray.returncode == 2 and "the cluster token in RAY_AUTH_TOKEN " + want in ray.stderr, ray.stderr
    for p in (cli, driver, ray):
        assert head.token[5:] not in p.stdout + p.stderr, p.stderr
    # Not ASCII at all: refused the same way.
    env = clean_env(TORUS_TMPDIR=head.root, TORUS_ADDRESS=head.address,
                    TORUS_TOKEN=head.token[:3] + "\u00e9" + head.token[3:])
    p = run([torus_bin(), "list", "nodes"], env=env, check=False, timeout=120)
    assert p.returncode > 0 and "a byte that is not ASCII (byte 0xc3 at offset 3)" in p.stderr, p.stderr
    assert head.token[3:] not in p.stdout + p.stderr
