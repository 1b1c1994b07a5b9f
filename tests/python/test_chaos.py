"""The chaos run (bench/chaos.py, issue #16 item 6): a mixed workload, a reservation of a simulated
v6e 4x4 slice every round and gang jobs on that slice, while 20 workers, 20 node daemons (slice
hosts included) and 20 heads are killed with SIGKILL; every result and every gang job checked,
nothing wrong, missing, hung or leaked (resources, placement groups, actors, jobs, the slice,
/dev/shm back to their starting values). Then the same with the head's state on etcd and a
standby head, the active head being the one killed (failover). Measured on 2 cores: ~170 s and
~235 s, the file ~6.7 min."""
import json
import subprocess
import sys
import time

from helpers import REPO, clean_env, torus_bin

KILLS = 20


def _chaos(*args, timeout):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--kills-per-kind", str(KILLS),
                        "--torus", torus_bin(), "--python", sys.executable, "--json", *args],
                       env=clean_env(), capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    out = p.stdout
    lines = [l for l in out.splitlines() if l.startswith("{")]
    assert lines, f"no JSON summary (exit {p.returncode})\n{out[-6000:]}\n{p.stderr[-3000:]}"
    s = json.loads(lines[-1])
    human = "\n".join(l for l in out.splitlines() if l.startswith("chaos:"))
    assert s["kills"] == {"workers": KILLS, "nodes": KILLS, "head": KILLS}, human
    assert s["wrong"] == 0 and s["missing"] == 0 and s["hung"] == 0, human
    assert s["checked"] > 1000 and s["rounds"] >= 3, human
    c = s["counts"]
    assert c.get("placement_groups", 0) >= 3 and c.get("actor_calls", 0) > 0, human
    assert c.get("slice_reservations", 0) >= 3 and c.get("slice_tasks", 0) == 4 * c["slice_reservations"], human
    assert c.get("gang_jobs", 0) > 0 and s["gang"]["checked"] == c["gang_jobs"], human
    assert s["slice_host_kills"] > 0, human  # by the seeded draw, almost surely; the run says how many
    assert s["leaks"] == [], human
    assert p.returncode == 0 and s["ok"], human
    print(f"chaos run {' '.join(args)}: {took:.0f} s\n{human}")
    return s


def test_chaos_20_kills_of_each_kind_nothing_wrong_missing_or_leaked():
    _chaos(timeout=720)


def test_chaos_on_etcd_20_kills_of_each_kind_active_head_failovers():
    s = _chaos("--etcd", timeout=900)
    assert s["etcd"] and len(s["recovery"]["standby_active"]) == KILLS, s["recovery"]
