"""The dashboard page (docs/http.md) in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium): sign in with the token, see a reserved slice and a running
job's log lines, no console errors; a screenshot is kept as a test artifact."""
import json
import os
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import cluster_up, dashboard_url, one_v6e_slice_manifest, wait_until

ARTIFACTS = Path(os.environ.get("TORUS_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "torus-test-artifacts"))


def need_browser():
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        if os.environ.get("CI"):
            raise AssertionError("chromium/chromedriver missing (scripts/deps.sh installs them)")
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    return pytest.importorskip("selenium.webdriver")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cluster_up(one_v6e_slice_manifest(tmp_path_factory.mktemp("manifest"))) as c:
        c.token = (Path(c.session) / "token").read_text().strip()
        yield c


def call(cluster, method, path, body=None):
    req = urllib.request.Request(dashboard_url(cluster) + path, method=method, data=body,
                                 headers={"Authorization": "Bearer " + cluster.token})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def browser(webdriver):
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1800"):
        opts.add_argument(a)
    opts.binary_location = shutil.which("chromium")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


def test_dashboard_in_chromium(cluster):
    webdriver = need_browser()
    from selenium.webdriver.common.by import By
    # A gang job on the whole slice: the slice is reserved while it runs, and it logs.
    sid = call(cluster, "POST", "/api/jobs/", json.dumps({
        "entrypoint": "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do "
                      "echo tick-$i from $TPU_WORKER_ID; sleep 1; done",
        "metadata": {"torus.slice": "4x4", "torus.accelerator": "v6e"}}).encode())["submission_id"]
    wait_until(lambda: call(cluster, "GET", f"/api/jobs/{sid}")["status"] == "RUNNING", 60, 0.2, "RUNNING")
    d = browser(webdriver)
    try:
        d.get(dashboard_url(cluster) + "/")
        wait_until(lambda: d.find_element(By.ID, "login").is_displayed(), 20, 0.2, "the sign-in form")
        # The token signs in (a cookie); a wrong one: test_page_is_public_and_the_data_is_not.
        d.find_element(By.ID, "token").send_keys(cluster.token)
        d.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait_until(lambda: d.find_element(By.ID, "app").is_displayed(), 20, 0.2, "the dashboard")
        assert any(c["name"] == "torus_token" for c in d.get_cookies())

        def slice_row():
            rows = d.find_elements(By.CSS_SELECTOR, "#slices tbody tr")
            return [r.text for r in rows if "reserved" in r.text]
        reserved = wait_until(slice_row, 30, 0.3, "a reserved slice in the table")
        assert "4x4" in reserved[0], reserved
        assert "5 nodes alive" in d.find_element(By.ID, "summary").text
        job_row = wait_until(lambda: d.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-job="{sid}"]'),
                             30, 0.3, "the job's row")
        assert "RUNNING" in job_row[0].text
        job_row[0].click()
        wait_until(lambda: "tick-2 from" in d.find_element(By.ID, "log").text, 30, 0.3, "log lines")
        hosts = {ln.rsplit(" ", 1)[-1] for ln in d.find_element(By.ID, "log").text.splitlines()
                 if "tick-" in ln}
        assert hosts >= {"0", "1", "2", "3"}, hosts
        nodes = d.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")
        assert len(nodes) == 5
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        d.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        d.quit()
        call(cluster, "POST", f"/api/jobs/{sid}/stop")


def test_page_is_public_and_the_data_is_not(cluster):
    with urllib.request.urlopen(dashboard_url(cluster) + "/", timeout=10) as r:
        page = r.read().decode()
    assert "Sign in to this Torus cluster" in page
    for path in ("/api/dashboard/nodes", "/api/dashboard/overview", "/api/dashboard/tasks"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(dashboard_url(cluster) + path, timeout=10)
        assert e.value.code == 401
    nodes = call(cluster, "GET", "/api/dashboard/nodes?limit=2&offset=1")
    assert nodes["total"] == 5 and len(nodes["rows"]) == 2 and nodes["offset"] == 1
    only = call(cluster, "GET", "/api/dashboard/nodes?q=tpu-worker-id%3D3")
    assert only["total"] == 1, only
    # Sign-in: a wrong token is refused and sets no cookie; the right one sets it.
    def sign_in(token):
        req = urllib.request.Request(dashboard_url(cluster) + "/api/authenticate", method="POST",
                                     data=json.dumps({"token": token}).encode())
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.headers.get("Set-Cookie", "")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Set-Cookie", "")
    code, cookie = sign_in("0" * 32)
    assert code == 403 and cookie == ""
    code, cookie = sign_in(cluster.token)
    assert code == 200 and "torus_token=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    signed = urllib.request.Request(dashboard_url(cluster) + "/api/dashboard/session",
                                    headers={"Cookie": cookie.split(";")[0]})
    assert json.loads(urllib.request.urlopen(signed, timeout=10).read()) == {"signed_in": True}
