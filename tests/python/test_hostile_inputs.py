"""Inputs a hostile or careless client sends (issue 41): JSON nested deep enough to overflow a
thread's stack."""
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import Cluster, dashboard_url, free_port, wait_until

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
