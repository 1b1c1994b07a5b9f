"""The chaos run (bench/chaos.py, issue #16 item 6): a mixed workload while 20 workers, 20 node
daemons and 20 heads are killed with SIGKILL; every result checked, nothing wrong, missing, hung
or leaked (resources, placement groups, actors, /dev/shm back to their starting values)."""
import json
import subprocess
import sys
import time

import pytest

from helpers import REPO, clean_env, torus_bin

KILLS = 20


# Not yet: at 20 kills of each kind the run finds runtime defects that lose or hang results
# (issue #16, session 21 note: tasks pipelined onto a worker blocked in ray.get; a failed lease
# request failing queued tasks despite max_retries; a task whose node died not retried; a put
# judged lost right after a head restart; a hot lineage retry loop; placement-group create and
# remove not idempotent across a head kill). Run it by hand: bench/chaos --kills-per-kind 20.
@pytest.mark.skip(reason="bench/chaos finds open runtime defects at 20 kills per kind (issue #16)")
def test_chaos_20_kills_of_each_kind_nothing_wrong_missing_or_leaked():
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--kills-per-kind", str(KILLS),
                        "--torus", torus_bin(), "--python", sys.executable, "--json"],
                       env=clean_env(), capture_output=True, text=True, timeout=720)
    took = time.monotonic() - t0
    out = p.stdout
    lines = [l for l in out.splitlines() if l.startswith("{")]
    assert lines, f"no JSON summary (exit {p.returncode})\n{out[-6000:]}\n{p.stderr[-3000:]}"
    s = json.loads(lines[-1])
    human = "\n".join(l for l in out.splitlines() if l.startswith("chaos:"))
    assert s["kills"] == {"workers": KILLS, "nodes": KILLS, "head": KILLS}, human
    assert s["wrong"] == 0 and s["missing"] == 0 and s["hung"] == 0, human
    assert s["checked"] > 1000 and s["rounds"] >= 3, human
    assert s["counts"].get("placement_groups", 0) >= 3 and s["counts"].get("actor_calls", 0) > 0, human
    assert s["leaks"] == [], human
    assert p.returncode == 0 and s["ok"], human
    print(f"chaos run: {took:.0f} s\n{human}")
