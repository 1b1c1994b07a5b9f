"""Serve on the head's dashboard page (docs/http.md, src/head/dashboard_page.html) in a real
headless Chromium (as test_dashboard.py): before Serve starts the page says it is not running;
applications deployed by a driver (which exits: Serve's actors are detached) are listed with
their deployments and replicas; names are user input and appear as text, never as markup; after
serve.shutdown() the page says Serve is not running again. On the way, the head's /metrics carries
the real controller's metrics (docs/metrics.md), none of its lines refused by the head's filter."""
import json
import urllib.request
from pathlib import Path

import pytest

from helpers import Cluster, dashboard_url, free_port, run_python, wait_until
from test_dashboard import ARTIFACTS, browser, need_browser

HOSTILE_APP = "<img src=x onerror=alert(1)>"
HOSTILE_DEPLOYMENT = "<b id=boom>dep</b>"

DEPLOY = """
import json, sys
import ray
from ray import serve
ray.init()
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})

@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
def f(request):
    return "x"

@serve.deployment(ray_actor_options={"num_cpus": 0})
def g(request):
    return "y"

serve.run(f.bind(), name="myapp", route_prefix="/x")
serve.run(g.options(name=sys.argv[3]).bind(), name=sys.argv[2], route_prefix="/y")
"""

SHUTDOWN = """
import ray
from ray import serve
ray.init()
serve.shutdown()
"""


@pytest.fixture(scope="module")
def head():
    c = Cluster()
    try:
        c.start_head("--num-cpus", "4", "--dashboard-port", str(free_port()))
        c.token = (Path(c.session) / "token").read_text().strip()
        yield c
    finally:
        c.stop()


def driver(head, code, *args):
    return run_python(code, env=head.driver_env(RAY_ADDRESS=head.address), shim=True, args=args,
                      timeout=240)


def details(head):
    req = urllib.request.Request(dashboard_url(head) + "/api/serve/applications/",
                                 headers={"Authorization": "Bearer " + head.token})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def metrics(head):
    req = urllib.request.Request(dashboard_url(head) + "/metrics",
                                 headers={"Authorization": "Bearer " + head.token})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def requests_counted(head):
    """ray_serve_num_http_requests_total of myapp's route on the head's /metrics."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics(head).splitlines()
               if ln.startswith("ray_serve_num_http_requests_total{") and 'route="/x"' in ln)


def rows(d, table):
    """The cells' texts of each row of `table`, read in one script: the page redraws its tables
    every few seconds, and cells read one by one can belong to a table already replaced."""
    return d.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(tr => "
        "Array.from(tr.querySelectorAll('td')).map(td => td.innerText.trim()));",
        f"#{table} tbody tr")


def test_serve_on_the_dashboard(head):
    webdriver = need_browser()
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    d = browser(webdriver)
    serve_started = False
    try:
        d.get(dashboard_url(head) + "/")
        wait_until(lambda: d.find_element(By.ID, "login").is_displayed(), 20, 0.2, "the sign-in form")
        d.find_element(By.ID, "token").send_keys(head.token)
        d.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait_until(lambda: d.find_element(By.ID, "app").is_displayed(), 20, 0.2, "the dashboard")
        summary = lambda: d.find_element(By.ID, "serve-summary").text
        wait_until(lambda: summary() == "Serve is not running.", 20, 0.2, "'Serve is not running.'")
        assert not d.find_element(By.ID, "serve-body").is_displayed()

        port = free_port()
        serve_started = True
        driver(head, DEPLOY, str(port), HOSTILE_APP, HOSTILE_DEPLOYMENT)
        # The driver has exited; Serve keeps answering.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/x", timeout=30) as r:
            assert r.read().decode() == "x"
        # The controller's metrics reach the head's /metrics (written about once a second), and
        # the head's filter kept every line of them (it logs the lines it drops).
        wait_until(lambda: requests_counted(head) >= 1, 30, 0.3, "the request on /metrics")
        assert "Serve's metrics" not in (Path(head.session) / "logs" / "head.err").read_text()

        def apps():
            got = {r[0]: r for r in rows(d, "serve-apps")}
            return got if {"myapp", HOSTILE_APP} <= got.keys() else None
        by_name = wait_until(apps, 30, 0.3, "both applications on the page")
        assert by_name["myapp"][1:3] == ["RUNNING", "/x"], by_name
        assert by_name[HOSTILE_APP][1:3] == ["RUNNING", "/y"], by_name
        assert by_name["myapp"][3].endswith(" UTC"), by_name  # last deployed
        assert summary().startswith("2 applications, 1 proxy, HTTP on 127.0.0.1:"), summary()

        deployments = {(r[0], r[1]): r for r in rows(d, "serve-deployments")}
        assert deployments[("myapp", "f")][2:4] == ["HEALTHY", "2 / 2"], deployments
        assert deployments[(HOSTILE_APP, HOSTILE_DEPLOYMENT)][2:4] == ["HEALTHY", "1 / 1"], deployments
        replicas = [r for r in rows(d, "serve-replicas") if r[:2] == ["myapp", "f"]]
        assert len(replicas) == 2 and all(r[3] == "RUNNING" for r in replicas), replicas
        # The page shows what the head's API holds, replica by replica.
        want = details(head)["applications"]["myapp"]["deployments"]["f"]["replicas"]
        assert sorted(r[2] for r in replicas) == sorted(x["replica_id"] for x in want)
        assert sorted(r[4] for r in replicas) == sorted(str(x["pid"]) for x in want)
        assert all(r[6].startswith("SERVE_REPLICA::myapp#f#") for r in replicas), replicas

        # User-given names are text: no element was made from them and no handler ran.
        assert d.execute_script(
            "return document.querySelectorAll('#serve img, #serve b, #boom').length") == 0
        with pytest.raises(NoAlertPresentException):
            d.switch_to.alert.text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(ARTIFACTS / "serve_dashboard.png"))
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors

        driver(head, SHUTDOWN)
        serve_started = False
        wait_until(lambda: summary() == "Serve is not running.", 30, 0.3,
                   "'Serve is not running.' after serve.shutdown()")
        assert not d.find_element(By.ID, "serve-body").is_displayed()
        assert "ray_serve_" not in metrics(head)  # the controller's last text is not shown
    finally:
        d.quit()
        if serve_started:
            driver(head, SHUTDOWN)
