# A gang job whose head is kill -9'd right after the submit (while its supervisor reserves the
# slice) and taken over by a standby on etcd: the new active head starts the attempt over and
# must release any reservation the first attempt made. A reservation left behind holds the slice
# for good: the job waits forever ("1 intact, 0 ready") and the group is never removed.
# Builds its own cluster (the one it is given is not used): etcd, an active head and a standby
# (`--state etcd://`), and one v6e 4x4 slice (4 nodes with the TPU environment of their hosts).
import json, os, shutil, signal, socket, subprocess, sys, tempfile, time
TORUS = sys.argv[1]
TRIES = int(sys.argv[2]) if len(sys.argv) > 2 else 40


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


root = tempfile.mkdtemp(prefix="torus-jobpg-")
base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TORUS_ADDRESS", "TORUS_HEAD_ADDRESS")}
base.update(TORUS_TMPDIR=root, TORUS_TPU_METADATA_URL="off")
client, peer, pa, pb = free_port(), free_port(), free_port(), free_port()
etcd = subprocess.Popen(["etcd", "--name", "r", "--data-dir", f"{root}/etcd",
                         "--listen-client-urls", f"http://127.0.0.1:{client}",
                         "--advertise-client-urls", f"http://127.0.0.1:{client}",
                         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-cluster", f"r=http://127.0.0.1:{peer}"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


while not listening(client):
    time.sleep(0.05)
head = {p: [TORUS, "start", "--head", "--port", str(p), "--state", f"etcd://127.0.0.1:{client}/jobpg",
            "--num-cpus", "1"] for p in (pa, pb)}


def run(cmd, **kw):
    return subprocess.run(cmd, env=dict(base, **kw), capture_output=True, text=True, timeout=60)


def state(port):
    try:
        return open(os.path.join(session, f"head_{port}.state")).read()
    except OSError:
        return ""


try:
    run(head[pa])
    run(head[pb])
    session = os.path.realpath(os.path.join(root, "session_latest"))
    tpu = dict(TPU_NAME="job-slice", TPU_ACCELERATOR_TYPE="v6e-16", TPU_TOPOLOGY="4x4",
               TPU_WORKER_HOSTNAMES="h0,h1,h2,h3", TORUS_TPU_CHIPS="4")
    for w in range(4):
        run([TORUS, "start", "--address", f"127.0.0.1:{pa}", "--num-cpus", "1"], TPU_WORKER_ID=str(w), **tpu)
    active, standby = pa, pb
    verdict = f"OK {TRIES} tries: every job SUCCEEDED, no reservation left"
    for k in range(TRIES):
        delay = (k % 40) * 0.003
        addr = f"127.0.0.1:{active}"
        job = run([TORUS, "job", "submit", "--no-wait", "--slice", "4x4", "--accelerator", "v6e", "--", "true"],
                  TORUS_ADDRESS=addr).stdout.strip()
        time.sleep(delay)
        pidfile = os.path.join(session, "pids", f"head-{active}.pid")
        if not os.path.exists(pidfile):
            pidfile = os.path.join(session, "pids", "head.pid")
        os.kill(int(open(pidfile).read().split()[0]), signal.SIGKILL)
        end = time.time() + 30
        while state(standby) != "active" and time.time() < end:
            time.sleep(0.02)
        if state(standby) != "active":
            verdict = f"FAIL try {k}: the standby did not take over within 30 s"
            break
        active, standby = standby, active
        addr = f"127.0.0.1:{active}"
        for _ in range(500):  # the killed head's port: free once all its threads are gone
            if "standing by" in run(head[standby]).stdout:
                break
            time.sleep(0.02)
        end, st = time.time() + 30, {}
        while time.time() < end:
            p = run([TORUS, "job", "status", job, "--format", "json"], TORUS_ADDRESS=addr)
            st = json.loads(p.stdout) if p.returncode == 0 else {}
            if st.get("state") in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        pgs = json.loads(run([TORUS, "list", "placement-groups", "--format", "json"], TORUS_ADDRESS=addr).stdout)
        left = [(g["placement_group_id"], g["state"]) for g in pgs if g["state"] != "REMOVED"]
        if st.get("state") != "SUCCEEDED" or left:
            verdict = (f"FAIL try {k} (active head killed {delay * 1000:.0f} ms after the submit returned): "
                       f"job {job} {st.get('state')}: {st.get('message')}; groups left: {left}")
            break
    print(verdict, flush=True)
finally:
    run([TORUS, "stop"])
    etcd.kill()
    etcd.wait()
    shutil.rmtree(root, ignore_errors=True)
