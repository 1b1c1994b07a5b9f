"""Ray's Jobs REST API on the head (docs/http.md), driven by the real Ray 2.60 client: the
`ray job` CLI and JobSubmissionClient from python/requirements-ray-client.txt, against a
`torus start` cluster; the same jobs as `torus job`. Also the token rule and the health probes,
and bad requests that leave the server serving."""
import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import (cluster_head, dashboard_url, free_port, ray_client_bin, ray_env, ray_job,
                     run, wait_until)


@pytest.fixture(scope="module")
def head():
    ray_client_bin()  # skip early without the client
    agent = free_port()
    with cluster_head("--num-cpus", "4", "--dashboard-port", str(free_port()),
                      "--dashboard-agent-listen-port", str(agent)) as c:
        c.agent_port = agent
        yield c


def out(p):
    return p.stdout + p.stderr


def http(cluster, method, path, body=None, token="cluster", headers=None, url=None):
    """(status, body text) of one request; token "cluster" = the cluster's, None = no header."""
    h = dict(headers or {})
    if token == "cluster":
        token = (Path(cluster.session) / "token").read_text().strip()
    if token is not None:
        h["Authorization"] = "Bearer " + token
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request((url or dashboard_url(cluster)) + path, data=data, method=method,
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def status_of(cluster, job_id):
    code, text = http(cluster, "GET", f"/api/jobs/{job_id}")
    assert code == 200, text
    return json.loads(text)


def test_submit_status_logs_list_delete_with_ray_cli(head):
    p = ray_job(head, "submit", "--submission-id", "cli-ok", "--runtime-env-json",
                '{"env_vars": {"GREETING": "hi there"}}', "--metadata-json", '{"team": "tpu"}',
                "--", "sh", "-c", 'echo "$GREETING from job"; echo second line')
    assert "hi there from job" in out(p) and "second line" in out(p), out(p)
    assert "Job 'cli-ok' succeeded" in out(p), out(p)
    p = ray_job(head, "status", "cli-ok")
    assert "Job 'cli-ok' succeeded" in out(p), out(p)
    p = ray_job(head, "logs", "cli-ok")
    assert "hi there from job\nsecond line" in out(p), out(p)
    d = status_of(head, "cli-ok")
    assert d["type"] == "SUBMISSION" and d["submission_id"] == "cli-ok"
    assert d["entrypoint"] == "sh -c 'echo \"$GREETING from job\"; echo second line'", d
    assert d["metadata"] == {"team": "tpu"} and d["driver_exit_code"] == 0
    assert d["runtime_env"]["env_vars"] == {"GREETING": "hi there"}
    assert int(d["driver_info"]["pid"]) > 0 and d["start_time"] <= d["end_time"]

    # A failing entrypoint: the CLI exits 1 and says why.
    p = ray_job(head, "submit", "--submission-id", "cli-bad", "--", "sh", "-c",
                "echo about to fail; exit 3", check=False)
    assert p.returncode == 1 and "about to fail" in out(p), out(p)
    assert "Job 'cli-bad' failed" in out(p), out(p)
    d = status_of(head, "cli-bad")
    assert d["status"] == "FAILED" and d["driver_exit_code"] == 3 and "3" in d["message"], d

    # The same jobs through Torus's own CLI (one job manager).
    listing = head.torus("job", "list").stdout
    assert "cli-ok  SUCCEEDED" in listing and "cli-bad  FAILED" in listing, listing
    p = ray_job(head, "list")
    assert "submission_id='cli-ok'" in out(p) and "submission_id='cli-bad'" in out(p), out(p)

    # A submission id is taken once.
    p = ray_job(head, "submit", "--submission-id", "cli-ok", "--", "true", check=False)
    assert p.returncode != 0 and "exists already" in out(p), out(p)

    p = ray_job(head, "delete", "cli-bad")
    assert "deleted successfully" in out(p), out(p)
    p = ray_job(head, "status", "cli-bad", check=False)
    assert p.returncode != 0 and "does not exist" in out(p), out(p)
    assert "cli-bad" not in head.torus("job", "list").stdout


def test_follow_logs_and_stop_with_ray_cli(head):
    ray_job(head, "submit", "--no-wait", "--submission-id", "cli-long", "--", "sh", "-c",
            "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done")
    env = ray_env(head)
    follow = subprocess.Popen([str(ray_client_bin() / "ray"), "job", "logs", "--follow", "--address",
                               dashboard_url(head), "cli-long"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: "tick 3" in ray_job(head, "logs", "cli-long").stdout, 60, what="ticks")
        # Deleting a running job is refused; the job goes on.
        p = ray_job(head, "delete", "cli-long", check=False)
        assert p.returncode != 0 and "only a finished job can be deleted" in out(p), out(p)
        p = ray_job(head, "stop", "cli-long", timeout=120)
        assert "was stopped" in out(p), out(p)
        assert status_of(head, "cli-long")["status"] == "STOPPED"
        text, _ = follow.communicate(timeout=60)
    finally:
        follow.kill()
    # --follow ended by itself once the job stopped, after the lines written until then.
    assert follow.returncode == 0, text
    assert "tick 1\ntick 2\ntick 3\n" in text, text
    assert "closed unexpectedly" not in text, text


SDK_PROGRAM = r"""
import asyncio, json, sys, time
from ray.job_submission import JobSubmissionClient, JobStatus
c = JobSubmissionClient(sys.argv[1])
sid = c.submit_job(entrypoint="python3 -c 'import os; print(os.environ[\"X\"], 6 * 7)'",
                   runtime_env={"env_vars": {"X": "answer"}}, metadata={"who": "sdk"},
                   entrypoint_num_cpus=1)
while c.get_job_status(sid) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
    time.sleep(0.1)
info = c.get_job_info(sid)
logs = c.get_job_logs(sid)

async def tail(job):
    got = []
    async for chunk in c.tail_job_logs(job):
        got.append(chunk)
    return "".join(got)

tailed = asyncio.run(tail(sid))
long = c.submit_job(entrypoint="sleep 600")
while c.get_job_status(long) != JobStatus.RUNNING:
    time.sleep(0.1)
stopped = c.stop_job(long)
while c.get_job_status(long) != JobStatus.STOPPED:
    time.sleep(0.1)
ids = [j.submission_id for j in c.list_jobs()]
deleted = c.delete_job(sid)
print("RESULT", json.dumps({
    "status": str(info.status), "metadata": info.metadata, "exit": info.driver_exit_code,
    "logs": logs, "tailed": tailed, "stopped": stopped, "listed": sid in ids and long in ids,
    "deleted": deleted, "after": sid in [j.submission_id for j in c.list_jobs()]}))
"""


def test_job_submission_client_sdk(head, tmp_path):
    prog = tmp_path / "sdk.py"
    prog.write_text(SDK_PROGRAM)
    p = run([str(ray_client_bin() / "python"), str(prog), dashboard_url(head)], env=ray_env(head),
            timeout=300)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, out(p)
    r = json.loads(line[0][len("RESULT "):])
    assert r["status"] == "SUCCEEDED" and r["exit"] == 0, r
    assert r["metadata"] == {"who": "sdk"}
    assert r["logs"] == "answer 42\n" and r["tailed"] == "answer 42\n", r
    assert r["stopped"] is True and r["listed"] is True
    assert r["deleted"] is True and r["after"] is False


def test_token_rule_and_health_probes(head):
    before = len(json.loads(http(head, "GET", "/api/jobs/")[1]))
    sub = json.dumps({"entrypoint": "echo should-not-run"})
    code, text = http(head, "POST", "/api/jobs/", sub, token=None)
    assert code == 401 and "Unauthorized" in text, (code, text)
    code, text = http(head, "POST", "/api/jobs/", sub, token="not-the-token")
    assert code == 403 and "Forbidden" in text, (code, text)
    assert http(head, "GET", "/api/version", token=None)[0] == 401
    assert len(json.loads(http(head, "GET", "/api/jobs/")[1])) == before  # nothing was submitted
    # The Ray CLI with a wrong token: Ray's authentication error.
    p = ray_job(head, "list", env=ray_env(head, token="0" * 32), check=False)
    assert p.returncode != 0 and "Authentication failed" in out(p), out(p)
    # Probes need no token (KubeRay's probes send none).
    assert http(head, "GET", "/api/gcs_healthz", token=None) == (200, "success")
    agent = f"http://127.0.0.1:{head.agent_port}"
    assert http(head, "GET", "/api/local_raylet_healthz", token=None, url=agent) == (200, "success")
    code, text = http(head, "GET", "/api/version")
    v = json.loads(text)
    assert code == 200 and v["ray_version"] == "2.60.0" and int(v["version"]) >= 1, v


def test_bad_requests_are_refused_and_the_server_keeps_serving(head):
    cases = [
        ("{not json", 400, "not valid JSON"),
        ("[1, 2]", 400, "JSON object"),
        (json.dumps({"runtime_env": {}}), 400, "'entrypoint'"),
        (json.dumps({"entrypoint": "true", "surprise": 1}), 400, "unknown field 'surprise'"),
        (json.dumps({"entrypoint": "true", "runtime_env": {"pip": ["x"]}}), 400,
         "runtime_env['pip'] is not supported"),
        (json.dumps({"entrypoint": "true", "metadata": {"k": 1}}), 400, "metadata['k']"),
        (json.dumps({"entrypoint": "true", "submission_id": "../../etc"}), 400, "submission_id"),
        (json.dumps({"entrypoint": "true", "entrypoint_num_cpus": -1}), 400, "entrypoint_num_cpus"),
        (json.dumps({"entrypoint": "true", "metadata": {"torus.slice": "3x3",
                                                        "torus.accelerator": "v6e"}}), 400, "3x3"),
    ]
    for body, want, words in cases:
        code, text = http(head, "POST", "/api/jobs/", body)
        assert (code, words in text) == (want, True), (body, code, text)
    # A body over the limit (16 MiB) is refused from its Content-Length, before it is read.
    import socket
    host, port = dashboard_url(head)[len("http://"):].split(":")
    token = (Path(head.session) / "token").read_text().strip()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST /api/jobs/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {17 << 20}\r\n\r\n{{".encode())
        answer = s.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer
    assert http(head, "GET", "/api/jobs/nope")[0] == 404
    assert http(head, "POST", "/api/jobs/nope/stop")[0] == 404
    assert http(head, "DELETE", "/api/jobs/nope")[0] == 404
    # Still serving: a good submission runs.
    code, text = http(head, "POST", "/api/jobs/", json.dumps({"entrypoint": "echo still-here"}))
    assert code == 200, text
    sid = json.loads(text)["submission_id"]
    wait_until(lambda: status_of(head, sid)["status"] == "SUCCEEDED", 60, what="the job")
    assert json.loads(http(head, "GET", f"/api/jobs/{sid}/logs")[1]) == {"logs": "still-here\n"}


def test_driver_placement_from_entrypoint_resources(head):
    # No node has 64 CPUs: the job waits (PENDING, saying why) until stopped.
    p = ray_job(head, "submit", "--no-wait", "--submission-id", "too-big", "--entrypoint-num-cpus",
                "64", "--", "echo", "never")
    assert p.returncode == 0
    time.sleep(1.0)
    d = status_of(head, "too-big")
    assert d["status"] == "PENDING" and "resources" in d["message"], d
    ray_job(head, "stop", "too-big", timeout=60)
    assert status_of(head, "too-big")["status"] == "STOPPED"
    p = ray_job(head, "submit", "--entrypoint-num-cpus", "2", "--entrypoint-resources",
                '{"CPU": 1}', "--", "echo", "placed")
    assert "placed" in out(p), out(p)


def _open_tail(cluster, job_id):
    """A raw websocket handshake on the job's log tail; (socket, status line)."""
    import base64
    import os
    import socket
    host, port = dashboard_url(cluster)[len("http://"):].split(":")
    token = (Path(cluster.session) / "token").read_text().strip()
    s = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /api/jobs/{job_id}/logs/tail HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
              f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
              f"Authorization: Bearer {token}\r\n\r\n".encode())
    return s, s.recv(4096).decode(errors="replace").split("\r\n")[0]


def test_log_tails_are_bounded_and_dropped_ones_are_freed(head):
    # A job that stays PENDING (nothing to tail for a while): no node has 64 CPUs.
    ray_job(head, "submit", "--no-wait", "--submission-id", "quiet", "--entrypoint-num-cpus", "64",
            "--", "true")
    socks = []
    try:
        for _ in range(24):
            s, status = _open_tail(head, "quiet")
            socks.append(s)
            assert status.startswith("HTTP/1.1 101"), status
        s, status = _open_tail(head, "quiet")   # over the cap: refused, the server answers
        s.close()
        assert status.startswith("HTTP/1.1 503"), status
        assert http(head, "GET", "/api/gcs_healthz", token=None) == (200, "success")
    finally:
        for s in socks:       # dropped without a close frame
            s.close()
    # The server notices the peers are gone (pings) and takes tails again.
    def tail_ok():
        s, status = _open_tail(head, "quiet")
        s.close()
        return status.startswith("HTTP/1.1 101")
    wait_until(tail_ok, 30, interval=0.5, what="the dropped tails to be freed")
    ray_job(head, "stop", "quiet", timeout=60)
