"""Prometheus metrics (docs/metrics.md) on the head and a node: the text checked by `promtool
check metrics`, and scraped by a real Prometheus server (Debian's `prometheus`) whose HTTP API
gives the values back."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from helpers import cluster_head, dashboard_url, free_port, run, run_python, wait_until

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def head():
    agent = free_port()
    with cluster_head("--num-cpus", "4", "--resources", '{"custom": 3}', "--dashboard-port",
                      str(free_port()), "--dashboard-agent-listen-port", str(agent)) as c:
        c.agent_url = f"http://127.0.0.1:{agent}"
        c.token = (Path(c.session) / "token").read_text().strip()
        yield c


def scrape(url, token):
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def sample(text, name_and_labels):
    """The value of the sample line that starts with `name_and_labels` (None if absent)."""
    for line in text.splitlines():
        if line.startswith(name_and_labels + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def need_tools():
    if not (PROMETHEUS and PROMTOOL):
        if os.environ.get("CI"):
            raise AssertionError("prometheus/promtool missing (scripts/deps.sh installs them)")
        pytest.skip("Debian's prometheus package is not installed")


def run_some_work(head):
    """Tasks, an actor and a job, so that their metrics have something to count."""
    run_python("""
        import torus
        torus.init()
        @torus.remote
        def f(x):
            return x + 1
        assert torus.get([f.remote(i) for i in range(20)]) == list(range(1, 21))
        @torus.remote
        class A:
            def ping(self):
                return "pong"
        a = A.options(name="metrics-actor", lifetime="detached").remote()
        assert torus.get(a.ping.remote()) == "pong"
    """, env=head.driver_env())
    head.torus("job", "submit", "--", "true")


def test_text_is_valid_and_counts_what_runs(head):
    need_tools()
    run_some_work(head)
    for url in (dashboard_url(head), head.agent_url):
        text = scrape(url, head.token)
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
    h = scrape(dashboard_url(head), head.token)
    assert sample(h, 'torus_nodes{state="alive"}') == 1
    assert sample(h, 'torus_cluster_resource_capacity{resource="custom"}') == 3
    assert sample(h, 'torus_actors{state="ALIVE"}') >= 1
    assert sample(h, 'torus_jobs{state="SUCCEEDED"}') >= 1
    assert sample(h, 'torus_rpc_server_requests_total{method="Head.RegisterNode",status="ok"}') >= 1
    n = scrape(head.agent_url, head.token)
    assert sample(n, f'torus_object_store_capacity_bytes{{node_id="{_node_id(head)}"}}') > 0
    assert sample(n, f'torus_workers{{node_id="{_node_id(head)}",state="actor"}}') >= 1
    # The token rule holds for /metrics too.
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(dashboard_url(head) + "/metrics", timeout=10)
    assert e.value.code == 401


def _node_id(head):
    out = json.loads(head.torus("list", "nodes", "--format", "json").stdout)
    return out[0]["node_id"]


def test_scraped_by_a_real_prometheus(head, tmp_path):
    need_tools()
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(head.token)
    targets = [dashboard_url(head)[len("http://"):], head.agent_url[len("http://"):]]
    (tmp_path / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: torus
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: {json.dumps(targets)}
""")
    p = run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    log = open(tmp_path / "prometheus.log", "w")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    api = f"http://127.0.0.1:{port}/api/v1/query?query="

    def query(q):
        with urllib.request.urlopen(api + urllib.parse.quote(q), timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    try:
        ups = wait_until(lambda: [r for r in query("up") if r["value"][1] == "1"]
                         if len(query("up")) == 2 else None, 60, 0.5, "both targets scraped")
        assert len(ups) == 2, query("up")
        alive = wait_until(lambda: query('torus_nodes{state="alive"}'), 30, 0.5, "torus_nodes")
        assert alive[0]["value"][1] == "1"
        cpu = query('torus_node_resource_capacity{resource="CPU"}')   # from the node itself
        assert [r["value"][1] for r in cpu] == ["4"], cpu
        total = query('torus_cluster_resource_capacity{resource="custom"}')   # from the head
        assert [r["value"][1] for r in total] == ["3"], total
        beats = wait_until(lambda: query('increase(torus_rpc_server_requests_total'
                                         '{method="Head.Heartbeat",status="ok"}[10s]) > 0'),
                           30, 0.5, "heartbeats counted")
        assert beats
        # Every query of the example Grafana dashboard is valid PromQL over these metrics.
        dash = json.loads((Path(__file__).resolve().parents[2] / "examples" / "grafana" /
                           "torus-dashboard.json").read_text())
        exprs = [t["expr"] for panel in dash["panels"] for t in panel["targets"]]
        assert len(exprs) >= 10
        for e in exprs:
            query(e)   # raises on a query Prometheus refuses
        assert query('sum(torus_slices)') and query('sum(torus_tasks)')
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()


def test_task_counts_outlive_their_driver(head):
    need_tools()
    before = scrape(dashboard_url(head), head.token)
    fin0 = sample(before, 'torus_tasks_ended_total{state="FINISHED"}')
    fail0 = sample(before, 'torus_tasks_ended_total{state="FAILED"}')
    p = run_python("""
        import os, torus
        torus.init()
        @torus.remote
        def ok(x):
            return x
        @torus.remote(max_retries=0)
        def dies():
            os._exit(1)
        @torus.remote
        def after(x):
            return x
        assert torus.get([ok.remote(i) for i in range(5)]) == list(range(5))
        try:
            torus.get(after.remote(dies.remote()))
        except Exception as e:
            print("FAILED AS EXPECTED", type(e).__name__)
    """, env=head.driver_env())
    assert "FAILED AS EXPECTED" in p.stdout, p.stdout + p.stderr
    # The driver has exited: its final counts were handed to the head (FinishJob).
    after = scrape(dashboard_url(head), head.token)
    assert sample(after, 'torus_tasks_ended_total{state="FINISHED"}') >= fin0 + 5
    # `dies` failed and `after` failed because its argument did (not left PENDING_ARGS).
    assert sample(after, 'torus_tasks_ended_total{state="FAILED"}') >= fail0 + 2
    assert sample(after, 'torus_tasks{state="PENDING_ARGS"}') == 0


# Serve's controller writes this kind of text into KV serve/metrics; the head appends what is a
# `ray_serve_` sample or its HELP/TYPE (src/head/serve_metrics.h), nothing a user could use to
# forge the head's own series.
SERVE_TEXT = (
    "# HELP ray_serve_num_http_requests_total HTTP requests the proxies answered.\n"
    "# TYPE ray_serve_num_http_requests_total counter\n"
    'ray_serve_num_http_requests_total{application="app",route="/x",status_code="200"} 12\n'
    "torus_fake 1\n"
    "# HELP torus_nodes forged\n"
    "# TYPE torus_fake gauge\n"
    'ray_serve_deployment_replica_healthy{__name__="torus_fake"} 1\n'
    "ray_serve_broken{\n"
    "# HELP ray_serve_deployment_replica_healthy 1 for a running, healthy replica.\n"
    "# TYPE ray_serve_deployment_replica_healthy gauge\n"
    'ray_serve_deployment_replica_healthy{application="app",deployment="f",replica="r1"} 1'
)

SERVE_KEPT = [
    "# HELP ray_serve_num_http_requests_total HTTP requests the proxies answered.",
    "# TYPE ray_serve_num_http_requests_total counter",
    'ray_serve_num_http_requests_total{application="app",route="/x",status_code="200"} 12',
    "# HELP ray_serve_deployment_replica_healthy 1 for a running, healthy replica.",
    "# TYPE ray_serve_deployment_replica_healthy gauge",
    'ray_serve_deployment_replica_healthy{application="app",deployment="f",replica="r1"} 1',
]


def test_serves_metrics_are_appended_filtered(head):
    need_tools()

    def serve_lines(text):
        return [ln for ln in text.splitlines() if "ray_serve_" in ln or "torus_fake" in ln]

    # The text alone (a controller gone leaves its last text behind): not shown.
    run_python(f"""
        import torus
        from torus._private import worker
        torus.init()
        worker.core().kv_put("serve", "metrics", {SERVE_TEXT!r}.encode(), True)
    """, env=head.driver_env())
    assert serve_lines(scrape(dashboard_url(head), head.token)) == []
    # With a live controller (here a stand-in under its name, which writes nothing itself).
    run_python("""
        import torus
        torus.init()
        @torus.remote(num_cpus=0)
        class Controller:
            def ping(self):
                return "pong"
        c = Controller.options(name="SERVE_CONTROLLER_ACTOR", namespace="serve",
                               lifetime="detached").remote()
        assert torus.get(c.ping.remote()) == "pong"
    """, env=head.driver_env())
    text = scrape(dashboard_url(head), head.token)
    assert serve_lines(text) == SERVE_KEPT, text
    assert text.endswith("\n") and text.index("ray_serve_") > text.index("torus_nodes")
    assert sample(text, "torus_fake") is None
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    # Not valid UTF-8: none of it.
    run_python("""
        import torus
        from torus._private import worker
        torus.init()
        worker.core().kv_put("serve", "metrics", b"ray_serve_x{a=\\"\\xff\\"} 1\\n", True)
    """, env=head.driver_env())
    assert serve_lines(scrape(dashboard_url(head), head.token)) == []
    # Controller gone: nothing, whatever the KV holds.
    run_python(f"""
        import torus
        from torus._private import worker
        torus.init()
        worker.core().kv_put("serve", "metrics", {SERVE_TEXT!r}.encode(), True)
        torus.kill(torus.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve"))
    """, env=head.driver_env())
    wait_until(lambda: serve_lines(scrape(dashboard_url(head), head.token)) == [], 30, 0.2,
               "Serve's metrics gone with the controller")
