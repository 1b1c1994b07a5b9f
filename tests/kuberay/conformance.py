"""KubeRay conformance: the pods KubeRay v1.5.0's own operator code makes for a RayCluster run
Torus, become ready by KubeRay's own probes, run a Ray program, and a pod killed and recreated as
the operator recreates it rejoins (docs/kuberay.md).

    conformance.py --operator BIN --cluster YAML --ray-compat DIR --python PY \
                   --program PROG --expect TEXT [--expect-count N] [--recreate]

BIN is tests/kuberay/operator built (`kuberay-pods`): it runs the real RayClusterReconciler against
a fake API server and prints the Pods and Services it created. The pods run under pods.Kubelet
(own network, mount, UTS and PID namespaces). PROG runs like `kubectl exec` into the head pod as
`PY -m torus.ray PROG`; its output must contain TEXT N times. With --recreate, one worker pod
(host 1 of a multi-host replica, else the first worker) is killed, the operator is run again on
the pods left, and the pods it creates must become ready and PROG must pass again.
Prints one JSON line of timings. Needs root.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import pods as kube  # noqa: E402


def operator(binary, cluster, existing=None):
    cmd = [binary, "--cluster", cluster]
    if existing is not None:
        f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(existing, f)
        f.close()
        cmd += ["--existing", f.name]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        if existing is not None:
            os.unlink(f.name)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: the operator refused {cluster}: {r.stderr[-3000:]}")
    return json.loads(r.stdout)


def group_hosts(cluster_yaml: str) -> tuple[str, dict]:
    """The RayCluster's name and each worker group's numOfHosts (a line-based read of the
    manifests this test uses; the operator itself parses them properly)."""
    text = Path(cluster_yaml).read_text()
    name = re.search(r"^metadata:\s*\n\s+name:\s*(\S+)", text, re.M).group(1)
    hosts, group = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*-?\s*groupName:\s*(\S+)", line)
        if m:
            group = m.group(1)
            hosts[group] = 1
        m = re.match(r"\s*numOfHosts:\s*(\d+)", line)
        if m and group:
            hosts[group] = int(m.group(1))
    return name, hosts


def check_pod_specs(objs):
    """What the rest of the test relies on, from KubeRay's own pod specs."""
    heads = [p for p in objs["pods"] if p["metadata"]["labels"].get("ray.io/node-type") == "head"]
    workers = [p for p in objs["pods"] if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
    assert len(heads) == 1, [p["metadata"]["name"] for p in objs["pods"]]
    cmd = " ".join(heads[0]["spec"]["containers"][0].get("command", []) +
                   heads[0]["spec"]["containers"][0].get("args", []))
    assert "ray start --head" in cmd, cmd
    for w in workers:
        init = " ".join(" ".join(c.get("command", []) + c.get("args", []))
                        for c in w["spec"].get("initContainers", []))
        assert "ray health-check" in init, init
    return heads[0], workers


def run_program(k, head, python, program, expect, count, timeout=900, env=None):
    t0 = time.monotonic()
    r = k.exec(head, [python, "-m", "torus.ray", program], timeout=timeout, extra_env=env)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    n = out.count(expect)
    if r.returncode != 0 or n < count:
        print(out[-6000:])
        raise SystemExit(f"FAIL: {program} exited {r.returncode}, '{expect}' seen {n} of {count} times")
    print(out.strip()[-2000:], flush=True)
    return took


WAIT_NODES = """
import sys, time, ray
ray.init()
want, deadline = int(sys.argv[1]), time.time() + 120
while len([n for n in ray.nodes() if n["Alive"]]) != want:
    assert time.time() < deadline, [(n["NodeManagerAddress"], n["Alive"]) for n in ray.nodes()]
    time.sleep(0.2)
print("NODES", want)
"""


def wait_nodes(k, head, python, n):
    """Waits in the head pod until the cluster lists exactly n alive nodes (the killed pod's node
    declared dead, its successor joined), as an operator would before running work again."""
    script = k.workdir / "wait_nodes.py"
    script.write_text(WAIT_NODES)
    r = k.exec(head, [python, "-m", "torus.ray", str(script), str(n)], timeout=180)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: the cluster did not settle at {n} alive nodes: {r.stderr[-2000:]}")


def recreate(k, a, gone):
    """Kills pod `gone`, runs the operator on the pods left, starts what it creates; returns the
    new pods once ready."""
    k.kill(gone)
    again = operator(a.operator, a.cluster, existing=[p.obj for p in k.pods.values()])
    new = [p for p in again["pods"] if p["metadata"]["name"] not in k.pods]
    assert new, "the operator recreated no pod"
    print(f"killed {gone}; the operator created {[p['metadata']['name'] for p in new]}", flush=True)
    k.add_services(again["services"])
    made = k.create(new)
    k.wait_ready(made, a.ready_timeout)
    return made


def victim(workers):
    """Host 1 of a multi-host slice (as the webhook named it), else the first worker."""
    for w in sorted(workers, key=lambda p: p["metadata"]["name"]):
        if w["spec"].get("hostname", "").endswith("-0-1"):
            return w
    return sorted(workers, key=lambda p: p["metadata"]["name"])[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--operator", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--ray-compat", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--program", required=True)
    ap.add_argument("--expect", required=True)
    ap.add_argument("--expect-count", type=int, default=1)
    ap.add_argument("--token", default="")
    ap.add_argument("--recreate", action="store_true")
    ap.add_argument("--program-after", help="also run after the recreate, after PROG again")
    ap.add_argument("--expect-after", help="what --program-after prints (once)")
    ap.add_argument("--head-program", help="PHASE=before, kill and recreate the head pod, PHASE=after")
    ap.add_argument("--ready-timeout", type=float, default=300)
    a = ap.parse_args()
    # A CI timeout or cancel (SIGTERM) still runs the teardown below; a SIGKILLed run's leftovers
    # are swept by the next run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("conformance: terminated"))
    kube.Kubelet.sweep_stale()
    a.program = str(Path(a.program).resolve())
    after = (str(Path(a.program_after).resolve()), a.expect_after, 1) if a.program_after else None
    if a.head_program:
        a.head_program = str(Path(a.head_program).resolve())

    token = a.token or os.urandom(16).hex()
    objs = operator(a.operator, a.cluster)
    head, workers = check_pod_specs(objs)
    name, hosts = group_hosts(a.cluster)
    print(f"operator: {len(objs['pods'])} pods, services "
          f"{[s['metadata']['name'] for s in objs['services']]}", flush=True)

    image_path = ":".join([str(Path(a.ray_compat).resolve()), str(Path(a.python).parent),
                           "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    # Outside /tmp: each pod gets a /tmp of its own, which would hide the volumes kept here.
    work = Path(tempfile.mkdtemp(prefix="torus-kuberay-", dir="/var/tmp"))
    k = kube.Kubelet(work, image_path, {"torus-token/token": token}, name, hosts)
    result = {"cluster": Path(a.cluster).name, "pods": len(objs["pods"])}
    ok = False
    try:
        k.setup()
        k.add_services(objs["services"])
        started = k.create(objs["pods"])
        k.wait_ready(started, a.ready_timeout)
        first = min(p.started for p in started)
        result["first_pod_to_all_ready_s"] = round(max(p.ready for p in started) - first, 2)
        result["head_ready_s"] = round(k.pods[head["metadata"]["name"]].ready - first, 2)
        print(f"all {len(started)} pods ready {result['first_pod_to_all_ready_s']} s after the "
              "first started", flush=True)
        for p in started:
            assert k.probe(p, "livenessProbe"), f"{p.name}: liveness probe fails"
        result["program_s"] = round(run_program(k, head["metadata"]["name"], a.python, a.program,
                                                a.expect, a.expect_count), 2)
        if a.recreate:
            t0 = time.monotonic()
            made = recreate(k, a, victim(workers)["metadata"]["name"])
            result["recreated"] = [p.name for p in made]
            result["kill_to_recreated_ready_s"] = round(max(p.ready for p in made) - t0, 2)
            wait_nodes(k, head["metadata"]["name"], a.python, len(k.pods))
            result["kill_to_cluster_whole_s"] = round(time.monotonic() - t0, 2)
            # The same program again, as a new job: it must not get the first job's workers.
            result["program_after_recreate_s"] = round(
                run_program(k, head["metadata"]["name"], a.python, a.program, a.expect,
                            a.expect_count), 2)
            if after:
                run_program(k, head["metadata"]["name"], a.python, *after)
        if a.head_program:
            head_name = head["metadata"]["name"]
            run_program(k, head_name, a.python, a.head_program, "HEAD STATE BEFORE OK", 1,
                        env={"PHASE": "before"})
            t0 = time.monotonic()
            made = recreate(k, a, head_name)
            result["head_kill_to_ready_s"] = round(max(p.ready for p in made) - t0, 2)
            new_head = next(p.name for p in made if p.labels.get("ray.io/node-type") == "head")
            run_program(k, new_head, a.python, a.head_program, "HEAD STATE AFTER OK", 1,
                        env={"PHASE": "after"})
            result["head_kill_to_actor_reached_s"] = round(time.monotonic() - t0, 2)
        ok = True
    finally:
        if not ok:
            for n in list(k.pods):
                print(f"--- log of pod {n} (last lines)\n{k.log(n)[-2000:]}")
        k.teardown()
        if ok and not os.environ.get("KUBERAY_TEST_KEEP"):
            subprocess.run(["rm", "-rf", str(work)])
        else:
            print(f"pod logs and volumes kept in {work}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
