"""Chaos: a mixed workload, slice reservations and gang jobs on a private cluster while workers,
node daemons and the head are killed (`kill -9`) at random, then every result, the actors' state,
the gang jobs' logs, resources, placement groups, slices and shared memory checked (issue #16
item 6; docs/fault_tolerance.md, docs/objects.md, docs/tpu.md, docs/jobs.md).

Usage: bench/chaos [--kills-per-kind N (20)] [--seed S] [--kinds workers,nodes,head]
                   [--nodes K (3)] [--interval MIN,MAX (0.3,1.5 s)] [--etcd] [--torus BIN]
                   [--python PY] [--json] [--keep]

1. Starts a cluster in a private session root: `torus start --head --port P --num-cpus 2`, K
   nodes `torus start --address 127.0.0.1:P --num-cpus 2`, and one simulated v6e 4x4 slice:
   4 more nodes started the same way, each with the environment of its host (TPU_NAME
   chaos-slice, TPU_WORKER_ID 0..3, TPU_ACCELERATOR_TYPE v6e-16, TPU_TOPOLOGY 4x4,
   TPU_WORKER_HOSTNAMES, TORUS_TPU_CHIPS=4; docs/tpu.md section 4). 4x4 is the smallest
   multi-host v6e slice a gang job can ask for (v6e 2x4 is one 8-chip host unless
   chips_per_vm=4, which `torus job submit` has no flag for). Every node has an explicit
   `--memory` and `--object-store-memory` (by default a node divides the host's budget by the
   nodes it sees, so a node restarted next to others would come back smaller and "resources
   back to their starting values" could not hold). Records total/available resources,
   placement groups, actors, unfinished jobs, slices and the session's /dev/shm segments.
   With --etcd: a private etcd (data in the session root, free ports), the head started with
   `--state etcd://127.0.0.1:E/chaos-<random>` and a standby head with the same command on
   another port (docs/fault_tolerance.md "Standby heads on etcd"); drivers get both heads'
   addresses (RAY_ADDRESS=A,B), nodes are started with the first head's (a standby relays to
   the active one) and learn the list from the active head.
2. Runs the workload driver (DRIVER below, under `python -m torus.ray`) in rounds until a flag
   file appears: ~200 tasks with object-ref arguments (ray.put values and other tasks' outputs,
   40% of them 160 KB arrays kept in the nodes' stores), nested refs (a list of refs in an
   argument, ray.get inside the task) and a 10-deep chain; calls to two actors and one detached
   named actor; a placement group created, used by a task, and removed; and a reservation of
   the whole slice (`ray.util.tpu.slice_placement_group`), waited for (it waits while a killed
   host is down), one task per host (bundle i, `resources={"TPU": 4}`) returning its host's
   TPU_WORKER_ID and node id (bundle i must be on host i, the 4 on 4 distinct nodes), then
   removed. Every value is compared with the one computed locally.
3. Meanwhile the controller keeps one gang job going (`torus job submit --slice 4x4
   --accelerator v6e --max-retries 1000`, the next one submitted when the previous one ended):
   each process prints its TORUS_PROCESS_ID, TORUS_NUM_PROCESSES, TPU_WORKER_ID and
   TORUS_PLACEMENT_GROUP_ID, sleeps 1.5 s and exits 0. And it kills, at random (seeded)
   intervals and in random order, until each kind has N:
   - workers: a random worker process of the cluster (`torus list workers`; busy ones first);
   - nodes: a random non-head node daemon, slice hosts included (`torus list nodes` pid), then
     the command that started it again, with the same environment (a slice host comes back
     as the same host of the slice); recovered when the new node is ALIVE and the killed one
     DEAD in `torus list nodes`;
   - head: the head's pid (`<session>/pids/head.pid`), then the same `torus start --head`
     command, which must resume the session; recovered when every live node is ALIVE again.
     With --etcd: the ACTIVE head (the one whose `head_<port>.state` says active), recovered
     (failover) when the standby's state says active and every live node is ALIVE on it; then
     the killed head's command again, which must come back as a standby.
   The next node/head kill waits for the previous one's recovery (bounded).
4. After the last kill, lets the driver finish two more rounds, stops it, waits (bounded) for the
   last gang job, checks the detached named actor from a new driver, checks every gang job
   (`torus job status`: SUCCEEDED, else missing with its message; `torus job logs`: one line
   per rank 0..3 from the processes of its last attempt, i.e. with its current reservation's
   id, each from the host of that rank), then waits (bounded) for resources, placement groups,
   actors, jobs, the slice (free, 4 of 4 hosts) and /dev/shm to return to their starting
   values; `torus stop` (no process of the session may be left); stops etcd; prints the
   summary. A change of the runtime's files (torus binary, Python core, the libtorus.so they
   load) during the run fails it: processes started after a rebuild run other code.

What may fail, and why nothing may: tasks have `max_retries=-1` (a worker death is retried
forever; a value lost with a node is rebuilt from lineage, docs/objects.md; a task in a slice
reservation that loses a host is retried in the re-granted slice); every object is owned by the
driver, which is attached to the head's node (never killed), so no OwnerDiedError; actors have
`max_restarts=-1, max_task_retries=-1` (a call whose worker died runs again on the restarted
instance); calls to the head retry while it is unreachable for 30 s
(`HeadClient::RetryWhileHeadAway`) and the head is back within seconds; a placement group's
creation repeated that way is idempotent (the driver mints the group's id); a gang job whose
attempt fails (a host or its node killed) is re-run whole, and jobs survive a head restart or
failover (docs/jobs.md, docs/fault_tolerance.md). Every exception from `ray.get`, a placement
group or an actor call is counted as missing, by type, and fails the run; a `ray.get` that
times out is a hang, named; a gang job that ends other than SUCCEEDED is missing, one still
not finished is hung.

Actor state: a restarted actor starts afresh (its constructor runs again; Ray's semantics), so an
actor's state is checked per instance: each reply is (instance, n, sum); the replies of one
instance must be n = 1, 2, ... with no gap or repeat, each sum the previous one plus that
call's value, and an older instance never answers after a newer one did. The detached named
actor's final state, read by name from a new driver, must be its last instance's.

Exit status: 0 when every kind had N kills, nothing was wrong, missing, hung or leaked, and
every recovery finished within its bound; 1 otherwise (the summary says what).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

NODE_MEMORY = 2 << 30          # each node's `memory` resource (bytes)
NODE_STORE = 512 << 20         # each node's object store (bytes)
RECOVERY_TIMEOUT_S = 60.0      # a node or head kill not recovered by then is a failure
ROUND_TIMEOUT_S = 90.0         # the driver's bound on one round (what is not done by then hung)
SETTLE_TIMEOUT_S = 60.0        # bound on resources/groups/shm returning after the run
SLICE_NAME = "chaos-slice"     # TPU_NAME of the simulated slice's hosts
SLICE_VERSION = "v6e"
SLICE_TOPOLOGY = "4x4"         # the smallest multi-host v6e slice: 4 hosts x 4 chips (2x4 is one
SLICE_HOSTS, SLICE_CHIPS = 4, 4  # 8-chip host unless chips_per_vm=4, which gang jobs cannot ask)
GANG_MAX_RETRIES = 1000        # a gang job's attempts end with each kill of a slice host or its worker
GANG_TIMEOUT_S = 120.0         # bound on the last gang job finishing after the kills
GANG_PROGRAM = ("import os, time; print('GANG', os.environ['TORUS_PROCESS_ID'], "
                "os.environ['TORUS_NUM_PROCESSES'], os.environ.get('TPU_WORKER_ID'), "
                "os.environ.get('TORUS_PLACEMENT_GROUP_ID'), flush=True); time.sleep(1.5)")

DRIVER = r'''
import json, os, sys, time, traceback, uuid
from collections import Counter
import numpy as np
import ray
from ray.util.placement_group import placement_group, remove_placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

BIG = 20_000  # int64 elements: 160 KB, above the 100 KiB inline limit, so kept in a node's store
N_A, N_B, N_C, CHAIN, ACTOR_CALLS, NAMED_CALLS = 120, 60, 20, 10, 15, 10
STOP, STATUS, RESULT = sys.argv[1], sys.argv[2], sys.argv[3]
ROUND_TIMEOUT = float(sys.argv[4])
NESTED_EARLY = sys.argv[5] == "1"
if sys.argv[6] == "1":  # --no-nested (diagnosis only)
    N_C = 0
SLICE_TOPOLOGY, SLICE_VERSION = sys.argv[7], sys.argv[8]  # "" topology: no slice in the cluster
if SLICE_TOPOLOGY:
    from ray.util.tpu import slice_placement_group

checked = 0
wrong = []          # details
missing = Counter() # exception type -> count
missing_detail = []
hung = []
t_start = time.time()


def ts():
    t = time.time()
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def note_missing(what, e):
    name = type(e).__name__
    missing[name] += 1
    if len(missing_detail) < 50:
        missing_detail.append(f"{what}: {name}: {str(e)[:600]}")
    print(f"{ts()} MISSING {what}: {name}: {str(e)[:600]}", flush=True)


def note_wrong(what, detail):
    wrong.append(f"{what}: {detail}")
    print(f"{ts()} WRONG {what}: {detail}", flush=True)


def show(v):
    if isinstance(v, np.ndarray):
        return f"array(shape={v.shape}, dtype={v.dtype}, head={v[:3].tolist()}, sum={int(v.sum())})"
    return repr(v)[:200]


def same(v, e):
    if isinstance(e, np.ndarray):
        return isinstance(v, np.ndarray) and v.shape == e.shape and bool(np.array_equal(v, e))
    return not isinstance(v, np.ndarray) and v == e


@ray.remote(max_retries=-1)
def scale(x, k):
    return x * k


@ray.remote(max_retries=-1)
def add(a, b):
    return a + b


@ray.remote(max_retries=-1)
def total(refs):
    # Nested refs: a list of refs inside an argument, read here (this task borrows them).
    return int(sum(int(np.sum(v)) for v in ray.get(refs, timeout=ROUND_TIMEOUT - 20)))


@ray.remote(max_retries=-1)
def where():
    # A task in bundle i of a slice reservation: on host i of the slice.
    return (os.environ.get("TPU_WORKER_ID"), ray.get_runtime_context().get_node_id())


@ray.remote(max_restarts=-1, max_task_retries=-1)
class Log:
    def __init__(self):
        self.inst = uuid.uuid4().hex[:12]
        self.n = 0
        self.s = 0

    def append(self, v):
        self.n += 1
        self.s += v
        return (self.inst, self.n, self.s)

    def state(self):
        return (self.inst, self.n, self.s)


class ActorCheck:
    """The replies of one actor, per instance: n = 1, 2, ... with each sum the previous one
    plus the call's value; an older instance never answers after a newer one did."""

    def __init__(self, name):
        self.name = name
        self.insts = {}   # instance -> {n: (sum, value)}
        self.order = []   # instances, first reply first
        self.calls = 0

    def record(self, what, v, reply):
        global checked
        checked += 1
        self.calls += 1
        try:
            inst, n, s = reply
        except Exception:
            note_wrong(what, f"reply {reply!r} is not (instance, n, sum)")
            return
        if inst not in self.insts:
            self.insts[inst] = {}
            self.order.append(inst)
        elif inst != self.order[-1]:
            note_wrong(what, f"instance {inst} answered after the newer {self.order[-1]}")
        d = self.insts[inst]
        if n in d:
            note_wrong(what, f"instance {inst} answered n={n} twice")
        d[n] = (s, v)

    def verify(self):
        for inst, d in self.insts.items():
            ns = sorted(d)
            if ns != list(range(1, len(ns) + 1)):
                note_wrong(self.name, f"instance {inst}: replies n={ns[:20]}... are not 1..{len(ns)}")
                continue
            prev = 0
            for n in ns:
                s, v = d[n]
                if s != prev + v:
                    note_wrong(self.name, f"instance {inst}: n={n} sum {s} != {prev} + {v}")
                prev = s

    def last(self):
        if not self.order:
            return None
        inst = self.order[-1]
        d = self.insts[inst]
        n = max(d)
        return [inst, n, d[n][0]]


deadline = time.monotonic() + ROUND_TIMEOUT


def left():
    """Seconds left of this round's bound (every wait of a round shares it)."""
    return max(0.0, deadline - time.monotonic())


def collect(items, round_no):
    """items: (label, ref, expected); checks every value, counts what raised or hung."""
    global checked
    refs = [r for _, r, _ in items]
    t0 = time.monotonic()
    try:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=left())
    except Exception as e:
        note_missing(f"round {round_no}: ray.wait", e)
        ready = []
    ready = set(ready)
    for label, ref, _ in items:
        if ref not in ready:
            hung.append(f"round {round_no} {label} ({ref.hex()}) not ready after "
                        f"{time.monotonic() - t0:.0f} s")
            print(ts(), "HUNG", hung[-1], flush=True)
    todo = [(l, r, e) for l, r, e in items if r in ready]
    values = None
    try:
        values = ray.get([r for _, r, _ in todo], timeout=left())
    except Exception:
        values = None  # one of them raised: get each to tell which
    for i, (label, ref, exp) in enumerate(todo):
        if values is not None:
            v = values[i]
        else:
            try:
                v = ray.get(ref, timeout=left())
            except ray.exceptions.GetTimeoutError as e:
                hung.append(f"round {round_no} {label} ({ref.hex()}): get timed out: {e}")
                print(ts(), "HUNG", hung[-1], flush=True)
                continue
            except Exception as e:
                note_missing(f"round {round_no} {label} ({ref.hex()})", e)
                continue
        if callable(exp):
            exp(label, v)
        else:
            checked += 1
            if not same(v, exp):
                note_wrong(f"round {round_no} {label}", f"expected {show(exp)}, got {show(v)}")


def head_call(what, fn):
    try:
        return fn()
    except Exception as e:
        note_missing(what, e)
        return None


allowed = Counter()  # failures the semantics allow: none (kept in the summary's format)


def create_group(r):
    """The round's group (None, noted missing, if its creation failed)."""
    try:
        return placement_group([{"CPU": 0.5}, {"CPU": 0.5}], strategy="SPREAD", name=f"chaos-{r}")
    except Exception as e:
        note_missing(f"round {r}: placement_group", e)
        return None


def create_slice(r):
    """The round's reservation of the whole slice (None, noted missing, if its creation failed)."""
    try:
        return slice_placement_group(topology=SLICE_TOPOLOGY, accelerator_version=SLICE_VERSION,
                                     name=f"chaos-slice-{r}")
    except Exception as e:
        note_missing(f"round {r}: slice_placement_group", e)
        return None


def run_slice(r, spg):
    """Waits for the reservation (a killed host holds it back until it is restarted), runs one
    task per host (bundle i), checks bundle i ran on host i (TPU_WORKER_ID) and the n hosts are n
    distinct nodes, then removes the reservation."""
    global checked
    label = f"slice reservation chaos-slice-{r} ({spg.placement_group.id.hex()})"
    try:
        try:
            ray.get(spg.placement_group.ready(), timeout=left())
        except ray.exceptions.GetTimeoutError as e:
            hung.append(f"round {r} {label} not ready: {e}")
            print(ts(), "HUNG", hung[-1], flush=True)
            return
        except Exception as e:
            note_missing(f"round {r}: {label} ready", e)
            return
        counts["slice_reservations"] += 1
        n = spg.num_hosts
        got = {}

        def expect(i):
            def f(lbl, v):
                global checked
                checked += 1
                got[i] = v
            return f
        items = [(f"slice-task#{i}", where.options(
            resources={"TPU": spg.chips_per_host}, scheduling_strategy=PlacementGroupSchedulingStrategy(
                spg.placement_group, placement_group_bundle_index=i)).remote(), expect(i)) for i in range(n)]
        counts["slice_tasks"] += n
        collect(items, r)
        if len(got) == n:  # what did not come back is counted missing or hung already
            checked += 1
            ranks = [got[i][0] if isinstance(got[i], tuple) else None for i in range(n)]
            nodes = {got[i][1] for i in range(n) if isinstance(got[i], tuple)}
            if ranks != [str(i) for i in range(n)] or len(nodes) != n:
                note_wrong(f"round {r} {label}", "bundle -> (TPU_WORKER_ID, node): "
                           + ", ".join(f"{i} -> {got[i]!r}" for i in range(n)))
    finally:
        head_call(f"round {r}: remove {label}", lambda: remove_placement_group(spg.placement_group))


ray.init(namespace="chaos")
actors = [(Log.remote(), ActorCheck(f"actor{i}")) for i in range(2)]
named = Log.options(name="chaos-named", lifetime="detached").remote()
named_check = ActorCheck("chaos-named")
keep = placement_group([{"CPU": 0.25}], name="chaos-keep")
ray.get(keep.ready(), timeout=left())
counts = Counter()
round_no = 0
round_times = []


def status(final=False):
    doc = {"rounds": round_no, "checked": checked, "wrong": len(wrong), "missing": sum(missing.values()),
           "hung": len(hung), "counts": dict(counts), "t": time.time(),
           "round_s": round_times[-1] if round_times else None}
    if final:
        doc.update(wrong_detail=wrong[:50], missing_by_type=dict(missing), allowed=dict(allowed), missing_detail=missing_detail,
                   hung_detail=hung[:50], named=named_check.last(), round_times=round_times,
                   actors={c.name: {"calls": c.calls, "instances": len(c.order)} for _, c in actors + [(None, named_check)]})
    path = RESULT if final else STATUS
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def actor_expect(check, v):
    return lambda label, reply: check.record(label, v, reply)


while not os.path.exists(STOP):
    round_no += 1
    r = round_no
    t_round = time.monotonic()
    deadline = t_round + ROUND_TIMEOUT
    items = []
    small = [ray.put(r * 1000 + j) for j in range(6)]
    small_v = [r * 1000 + j for j in range(6)]
    big_v = [np.arange(BIG, dtype=np.int64) + r * 1000 + j for j in range(4)]
    big = [ray.put(a) for a in big_v]
    base, base_v = small + big, small_v + big_v
    # A: tasks on ray.put values (small ones inline, big ones in the driver's node's store).
    A, A_v = [], []
    for i in range(N_A):
        k = i % 5 + 1
        A.append(scale.remote(base[i % len(base)], k))
        A_v.append(base_v[i % len(base)] * k)
        items.append((f"scale#{i}", A[-1], A_v[-1]))
    # B: tasks on other tasks' outputs.
    B, B_v = [], []
    for j in range(N_B):
        B.append(add.remote(A[2 * j], A[2 * j + 1]))
        B_v.append(A_v[2 * j] + A_v[2 * j + 1])
        items.append((f"add#{j}", B[-1], B_v[-1]))
    # C: nested refs (a list of refs in an argument: task outputs and ray.put values), read with
    # ray.get inside the task. Submitted at once (NESTED_EARLY, unless --nested-late): a task
    # blocked in ray.get may have short tasks of the same shape pipelined behind it on its
    # worker, which must hand them back (docs/architecture.md, path of a task, step 6).
    if not NESTED_EARLY:
        ready, _ = ray.wait(A + B, num_returns=len(A + B), timeout=left(), fetch_local=False)
        if len(ready) < len(A + B):  # counted, by name, in collect()
            print(f"{ts()} HUNG round {r}: {len(A + B) - len(ready)} of the A and B tasks not ready "
                  f"after {ROUND_TIMEOUT:.0f} s", flush=True)
    for m in range(N_C):
        sel = [(B[(m * 3 + t) % N_B], B_v[(m * 3 + t) % N_B]) for t in range(3)]
        sel += [(A[(m * 7) % N_A], A_v[(m * 7) % N_A]), (base[m % len(base)], base_v[m % len(base)])]
        items.append((f"total#{m}", total.remote([x for x, _ in sel]),
                      int(sum(int(np.sum(v)) for _, v in sel))))
    # D: a chain: each link's argument is the previous link's output (lineage depth CHAIN).
    x, x_v = scale.remote(big[0], 1), big_v[0] * 1
    for t in range(CHAIN):
        x, x_v = add.remote(x, small[t % len(small)]), x_v + small_v[t % len(small)]
    items.append(("chain", x, x_v))
    # Actors: calls with values whose sums the replies carry.
    for a, c in actors:
        for q in range(ACTOR_CALLS):
            v = r * 100 + q
            items.append((f"{c.name}.append#{q}", a.append.remote(v), actor_expect(c, v)))
    for q in range(NAMED_CALLS):
        v = r * 10 + q
        items.append((f"chaos-named.append#{q}", named.append.remote(v), actor_expect(named_check, v)))
    counts["tasks"] += N_A + N_B + N_C + CHAIN + 1
    counts["actor_calls"] += 2 * ACTOR_CALLS + NAMED_CALLS
    # A placement group: created, ready, a task in it, removed.
    pg = create_group(r)
    spg = create_slice(r) if SLICE_TOPOLOGY else None
    if pg is not None:
        try:
            ray.get(pg.ready(), timeout=left())
            counts["placement_groups"] += 1
            checked += 1
            ref = scale.options(num_cpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=1)).remote(r, 3)
            items.append(("pg-task", ref, 3 * r))
            counts["tasks"] += 1
        except ray.exceptions.GetTimeoutError as e:
            hung.append(f"round {r} placement group chaos-{r} ({pg.id.hex()}) not ready: {e}")
            print(ts(), "HUNG", hung[-1], flush=True)
        except Exception as e:
            note_missing(f"round {r}: placement group ready", e)
    if spg is not None:  # meanwhile the round's other work runs
        run_slice(r, spg)
    collect(items, r)
    if pg is not None:
        head_call(f"round {r}: remove_placement_group", lambda: remove_placement_group(pg))
    del items, A, B, small, big, base, x
    round_times.append(round(time.monotonic() - t_round, 2))
    status()

# The end: every actor's replies, the long-lived group, the named actor's state.
for _, c in actors:
    c.verify()
named_check.verify()
deadline = time.monotonic() + ROUND_TIMEOUT
got = head_call("final named state", lambda: ray.get(named.state.remote(), timeout=left()))
if got is not None:
    checked += 1
    if list(got) != named_check.last():
        note_wrong("chaos-named final state", f"expected {named_check.last()}, got {list(got)}")
table = head_call("placement_group_table", placement_group_table) or {}
st = table.get(keep.id.hex(), {}).get("state")
checked += 1
if st != "CREATED":
    note_wrong("placement group chaos-keep", f"state {st!r}, expected CREATED")
head_call("remove chaos-keep", lambda: remove_placement_group(keep))
status(final=True)
print(f"DRIVER DONE rounds={round_no} checked={checked} wrong={len(wrong)} "
      f"missing={sum(missing.values())} hung={len(hung)}", flush=True)
'''

CHECK_NAMED = r'''
import json, sys
import ray
ray.init(namespace="chaos")
a = ray.get_actor("chaos-named")
print("NAMED", json.dumps(list(ray.get(a.state.remote(), timeout=60))), flush=True)
ray.kill(a)
'''


def log(msg):
    print(f"chaos: {msg}", flush=True)


def free_port() -> int:
    """A free port below the ephemeral range: the head's port is bound again after each kill,
    and a port in that range can meanwhile be taken as the local end of some connection (even
    of a reconnect to the head's own address: a TCP self-connect), which refuses the restart."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port below the ephemeral range")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def ppid_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def kill9(pid: int, timeout=10.0) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.01)
    return False


def port_free(port: int, timeout=10.0) -> bool:
    """Waits until 127.0.0.1:port can be bound (SO_REUSEADDR, as a server binds): a process
    killed with SIGKILL shows as a zombie once its main thread is gone, while its other threads
    may still hold its sockets for a moment."""
    end = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                return True
            except OSError:
                if time.monotonic() > end:
                    return False
        time.sleep(0.01)


def runtime_files(torus: str, python: str) -> dict:
    """{path: (inode, size, mtime ns)} of the runtime under test: the torus binary, the Python
    package's core module and the libtorus.so each loads (as the loader resolves it now, so with
    LD_LIBRARY_PATH and RUNPATH). A rebuild or reinstall during a run mixes versions: processes
    restarted after it run other code than the ones they talk to."""
    files = [torus]
    try:
        p = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('torus._core').origin)"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode == 0 and p.stdout.strip():
            files.append(p.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    for f in list(files):
        try:
            out = subprocess.run(["ldd", f], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        files += [m.group(1) for m in re.finditer(r"libtorus[^ ]* => (/\S+)", out)]
    ids = {}
    for f in dict.fromkeys(files):
        try:
            st = os.stat(f)
            ids[f] = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            ids[f] = None
    return ids


def summarize(xs):
    if not xs:
        return "n/a"
    return f"median {statistics.median(xs):.2f} s, max {max(xs):.2f} s"


def free_ports(n: int) -> list:
    ports = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


class Cluster:
    def __init__(self, torus: str, root: str, nodes: int, slice_: bool, etcd: bool):
        self.torus = torus
        self.root = root
        self.etcd = etcd
        ports = free_ports(4 if etcd else 1)
        self.port = ports[0]
        self.port_b = ports[1] if etcd else None   # the standby's
        self.etcd_ports = ports[2:]                # etcd's client and peer ports
        self.address = f"127.0.0.1:{self.port}"
        self.k = nodes
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("TORUS_ADDRESS", "RAY_ADDRESS", "TORUS_TOKEN", "TORUS_RAY_SHIM",
                                 "TORUS_WORKER_MODE", "TORUS_HEAD_ADDRESS")
                    and not k.startswith(("TPU_", "MEGASCALE_", "TORUS_TPU_"))}
        self.env.update(TORUS_TMPDIR=root, TORUS_TPU_METADATA_URL="off", TORUS_ADDRESS=self.address)
        sizes = ["--num-cpus", "2", "--memory", str(NODE_MEMORY), "--object-store-memory", str(NODE_STORE)]
        self.etcd_proc = None
        if etcd:
            # Two heads on one etcd prefix: the first command run is active, the other stands by.
            self.state_url = f"etcd://127.0.0.1:{self.etcd_ports[0]}/chaos-{os.urandom(4).hex()}"
            self.head_cmds = {p: [torus, "start", "--head", "--port", str(p), "--state", self.state_url, *sizes]
                              for p in (self.port, self.port_b)}
            self.driver_address = f"{self.address},127.0.0.1:{self.port_b}"
        else:
            self.head_cmds = {self.port: [torus, "start", "--head", "--port", str(self.port), *sizes]}
            self.driver_address = self.address
        self.head_cmd = self.head_cmds[self.port]
        # `torus start --address` takes one head (its own check of the cluster does not split a
        # list); the node learns the other head from the active head's replies, and the head
        # given is always up when a node is (re)started: active, or a standby relaying to it.
        self.node_cmd = [torus, "start", "--address", self.address, *sizes]
        # The simulated slice: one node per host, with the environment GKE's TPU webhook gives a
        # host (docs/tpu.md section 4), and the other nodes' sizes: 2 CPUs, of which a slice
        # bundle takes 1 ({CPU: 1, TPU: 4}), so the workload's groups (CPU 0.25 and 0.5 bundles,
        # which may land on a slice host) cannot keep the slice from being reserved.
        self.slice_hosts = SLICE_HOSTS if slice_ else 0
        self.slice_cmd = self.node_cmd
        hostnames = ",".join(f"{SLICE_NAME}-{w}" for w in range(SLICE_HOSTS))
        self.slice_env = [{"TPU_NAME": SLICE_NAME, "TPU_WORKER_ID": str(w),
                           "TPU_ACCELERATOR_TYPE": f"{SLICE_VERSION}-{SLICE_HOSTS * SLICE_CHIPS}",
                           "TPU_TOPOLOGY": SLICE_TOPOLOGY, "TPU_WORKER_HOSTNAMES": hostnames,
                           "TORUS_TPU_CHIPS": str(SLICE_CHIPS)} for w in range(self.slice_hosts)]
        self.session = None
        self.seen_nodes: set = set()

    def run(self, cmd, timeout=60, check=True, env=None):
        e = dict(self.env, **(env or {}))
        if self.etcd and self.session is not None:
            e["TORUS_ADDRESS"] = self.cli_address()
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stdout}{p.stderr}")
        return p

    def start_etcd(self):
        exe = shutil.which("etcd")
        if not exe:
            raise RuntimeError("--etcd needs the etcd binary (Debian: etcd-server)")
        client, peer = self.etcd_ports
        data = Path(self.root, "etcd")
        self.etcd_log = open(Path(self.root, "etcd.log"), "w")
        self.etcd_proc = subprocess.Popen(
            [exe, "--name", "chaos", "--data-dir", str(data),
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"chaos=http://127.0.0.1:{peer}"],
            stdout=self.etcd_log, stderr=subprocess.STDOUT)

        def up():
            if self.etcd_proc.poll() is not None:
                raise RuntimeError(f"etcd exited {self.etcd_proc.returncode} (see {self.root}/etcd.log)")
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", client)) == 0
        self.wait(up, 30, "etcd to listen")

    def stop_etcd(self):
        if self.etcd_proc is not None and self.etcd_proc.poll() is None:
            self.etcd_proc.terminate()
            try:
                self.etcd_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd_proc.kill()
                self.etcd_proc.wait()
            self.etcd_log.close()

    def heads(self) -> dict:
        """{port: (pid, state)} of the live head processes ("active", "standby ...", or "" when
        the state file is not there); a killed head's state file says what it was."""
        out = {}
        for f in (self.session / "pids").glob("head*.pid"):
            try:
                pid = int(f.read_text().split()[0])
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if not pid_alive(pid) or b"head" not in argv or b"--port" not in argv:
                continue
            try:
                port = int(argv[argv.index(b"--port") + 1])
                st = (self.session / f"head_{port}.state").read_text().strip()
            except (ValueError, IndexError):
                continue
            except OSError:
                st = ""
            out[port] = (pid, st)
        return out

    def cli_address(self) -> str:
        """The active head's address (a standby would relay to it), else any live head's."""
        hs = self.heads()
        for port, (_, st) in sorted(hs.items()):
            if st == "active":
                return f"127.0.0.1:{port}"
        return f"127.0.0.1:{min(hs)}" if hs else self.address

    def cli_json(self, *args, timeout=15):
        p = self.run([self.torus, *args, "--format", "json"], timeout=timeout)
        return json.loads(p.stdout)

    def nodes(self):
        ns = self.cli_json("list", "nodes")
        self.seen_nodes.update(n["node_id"] for n in ns)
        return ns

    def alive(self):
        return [n for n in self.nodes() if n["state"] == "ALIVE"]

    def start(self):
        if self.etcd:
            self.start_etcd()
        p = self.run(self.head_cmd)
        self.session = Path(self.root, "session_latest").resolve()
        if self.etcd:
            st = self.heads().get(self.port, (0, ""))[1]
            if st != "active":
                raise RuntimeError(f"the first head is not active (state {st!r}): {p.stdout}{p.stderr}")
            p = self.run(self.head_cmds[self.port_b])
            if "standing by" not in p.stdout:
                raise RuntimeError(f"the second head does not stand by: {p.stdout}{p.stderr}")
            time.sleep(1.5)  # the head's own node learns of the standby from a heartbeat reply
        for _ in range(self.k):
            self.run(self.node_cmd)
        for w in range(self.slice_hosts):
            self.run(self.slice_cmd, env=self.slice_env[w])
        n = 1 + self.k + self.slice_hosts
        self.wait(lambda: len(self.alive()) == n, 30, "nodes alive")
        if self.slice_hosts:
            self.wait(lambda: self.slices() == [[SLICE_NAME, "free", SLICE_HOSTS, SLICE_HOSTS, ""]], 30,
                      "the slice intact and free")

    def slices(self):
        return sorted([s["slice_name"], s["state"], s["hosts_alive"], s["hosts_expected"], s["holder"]]
                      for s in self.cli_json("list", "slices"))

    def restart_of(self, node) -> tuple:
        """The command and environment that started this node (by its slice labels)."""
        labels = node.get("labels") or {}
        if labels.get("torus.io/tpu-slice-name") == SLICE_NAME:
            return self.slice_cmd, self.slice_env[int(labels["torus.io/tpu-worker-id"])]
        return self.node_cmd, None

    def node_pids(self) -> set:
        pids = set()
        for f in (self.session / "pids").glob("node-*.pid"):
            try:
                pids.add(int(f.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
        return pids

    def session_processes(self) -> list:
        """Live daemons named in the session's pid files (after `torus stop`: none)."""
        left = []
        for f in (self.session / "pids").glob("*.pid"):
            try:
                pid = int(f.read_text().split()[0])
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if pid_alive(pid) and str(self.session).encode() in argv:
                left.append(f"{f.name}: {pid}")
        return sorted(left)

    def head_pid(self) -> int:
        return int((self.session / "pids" / "head.pid").read_text().split()[0])

    @staticmethod
    def wait(pred, timeout, what):
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            try:
                v = pred()
                if v:
                    return v
            except Exception as e:  # the head may be away: retried until the deadline
                last = e
            time.sleep(0.05)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                           + (f" (last error: {last})" if last else ""))

    def snapshot(self):
        """Resources summed over alive nodes, live placement groups, live actors, shm."""
        alive = self.alive()
        tot, avail = {}, {}
        for n in alive:
            for k, v in n["resources_total"].items():
                tot[k] = tot.get(k, 0.0) + v
            for k, v in n["resources_available"].items():
                avail[k] = avail.get(k, 0.0) + v
        pgs = sorted(g["name"] or g["placement_group_id"]
                     for g in self.cli_json("list", "placement-groups") if g["state"] != "REMOVED")
        jobs = sorted(f"{j['job_id']}:{j['state']}" for j in self.cli_json("job", "list")
                      if j["state"] not in ("SUCCEEDED", "FAILED", "STOPPED"))
        actors = sorted(f"{a['name'] or a['actor_id']}:{a['state']}"
                        for a in self.cli_json("list", "actors") if a["state"] != "DEAD")
        return {"alive": len(alive), "total": tot, "available": avail, "pgs": pgs, "actors": actors,
                "jobs": jobs, "slices": self.slices() if self.slice_hosts else [],
                "shm": self.shm({n["node_id"] for n in alive})}

    def shm(self, alive_ids: set):
        """The session's /dev/shm segments: {"alive": {node12: [suffixes]}, "dead": [names],
        "bytes": allocated bytes of the alive nodes' segments}."""
        ids = {i[:12] for i in self.seen_nodes | alive_ids}
        lockdir = self.session / "shm"
        if lockdir.is_dir():
            ids |= {m.group(1) for f in lockdir.iterdir()
                    if (m := re.match(r"torus\.([0-9a-f]{12})\.lock$", f.name))}
        alive12 = {i[:12] for i in alive_ids}
        out, dead, used = {}, [], 0
        for f in os.listdir("/dev/shm"):
            m = re.match(r"torus\.([0-9a-f]{12})\.(.+)$", f)
            if not m or m.group(1) not in ids:
                continue
            if m.group(1) in alive12:
                out.setdefault(m.group(1), []).append(m.group(2))
                try:
                    used += os.stat(f"/dev/shm/{f}").st_blocks * 512
                except OSError:
                    pass
            else:
                dead.append(f)
        return {"alive": {k: sorted(v) for k, v in out.items()}, "dead": sorted(dead), "bytes": used}


def compare(start, now):
    """What differs from the starting snapshot (leaks), as strings."""
    diffs = []
    if now["alive"] != start["alive"]:
        diffs.append(f"alive nodes {now['alive']} != {start['alive']}")
    for key in ("total", "available"):
        a, b = start[key], now[key]
        for r in sorted(set(a) | set(b)):
            if abs(a.get(r, 0.0) - b.get(r, 0.0)) > 1e-6:
                diffs.append(f"{key} {r}: {b.get(r, 0.0):g} != {a.get(r, 0.0):g} at start")
    if now["pgs"] != start["pgs"]:
        diffs.append(f"placement groups left: {now['pgs']} (at start {start['pgs']})")
    if now["actors"] != start["actors"]:
        diffs.append(f"actors not dead: {now['actors']} (at start {start['actors']})")
    if now["jobs"] != start["jobs"]:
        diffs.append(f"jobs not finished: {now['jobs']} (at start {start['jobs']})")
    if now["slices"] != start["slices"]:
        diffs.append(f"slices [name, state, hosts alive, expected, holder]: {now['slices']} "
                     f"(at start {start['slices']})")
    want = sorted(set(s for v in start["shm"]["alive"].values() for s in v))
    for node, suffixes in now["shm"]["alive"].items():
        if suffixes != want:
            diffs.append(f"/dev/shm segments of node {node}: {suffixes} != {want}")
    if len(now["shm"]["alive"]) != now["alive"]:
        diffs.append(f"{len(now['shm']['alive'])} alive nodes with segments, {now['alive']} alive")
    if now["shm"]["dead"]:
        diffs.append(f"dead nodes' /dev/shm segments left: {now['shm']['dead']}")
    return diffs


class StallWatch:
    """Saves what the cluster is doing (`torus list tasks` not finished, `torus list workers`)
    once the driver has not finished a round for `after` seconds, to name what hung."""

    def __init__(self, cluster: Cluster, run_dir: Path, rounds, after=30.0):
        self.c, self.dir, self.rounds, self.after = cluster, run_dir, rounds, after
        self.last = (-1, time.monotonic())
        self.saved = []

    def poll(self):
        r = self.rounds()
        if r != self.last[0]:
            self.last = (r, time.monotonic())
            return
        if time.monotonic() - self.last[1] < self.after or r in [s[0] for s in self.saved]:
            return
        path = self.dir / f"stall-round{r + 1}.json"
        doc = {"round": r + 1, "stalled_s": round(time.monotonic() - self.last[1], 1)}
        for kind in ("tasks", "workers", "nodes", "actors", "placement-groups", "slices", "objects"):
            try:
                rows = self.c.cli_json("list", kind, timeout=30)
                doc[kind] = [t for t in rows if t.get("state") != "FINISHED"] if kind == "tasks" else rows
            except Exception as e:
                doc[kind] = f"failed: {e}"
        path.write_text(json.dumps(doc, indent=1))
        self.saved.append((r, str(path)))
        log(f"the driver has not finished round {r + 1} for {doc['stalled_s']} s: saved {path}")


class GangJobs:
    """Gang jobs on the slice, one at a time from the controller: `torus job submit --slice`
    with retries; each process prints its rank, the number of processes, its host's worker id
    and its attempt's reservation, then sleeps. At the end every job must have SUCCEEDED and its
    log must have one line per rank from the processes of its last attempt."""

    TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
    LINE = re.compile(r"^\[(?P<slice>[^/\]]+)/(?P<host>\d+)\] GANG (?P<rank>\d+) (?P<n>\d+) "
                      r"(?P<worker>\S+) (?P<pg>\S+)$")

    def __init__(self, cluster: Cluster, python: str, run_dir: Path):
        self.c = cluster
        self.cmd = [cluster.torus, "job", "submit", "--no-wait", "--slice", SLICE_TOPOLOGY,
                    "--accelerator", SLICE_VERSION, "--max-retries", str(GANG_MAX_RETRIES),
                    "--working-dir", str(run_dir), "--", python, "-c", GANG_PROGRAM]
        self.ids = []          # submitted, in order
        self.current = None    # the one not known finished
        self.submit_errors = []

    def status(self, job_id):
        return self.c.cli_json("job", "status", job_id)

    def poll(self, submit=True):
        """Notes whether the current job finished; submits the next one when it did."""
        if self.current is not None:
            try:
                st = self.status(self.current)
            except Exception:
                return  # the head is away: later
            if st["state"] not in self.TERMINAL:
                return
            self.current = None
        if not submit:
            return
        try:
            p = self.c.run(self.cmd, timeout=30)
            self.current = p.stdout.strip()
            self.ids.append(self.current)
        except Exception as e:
            self.submit_errors.append(str(e)[:300])

    def wait_last(self, timeout):
        end = time.monotonic() + timeout
        while self.current is not None and time.monotonic() < end:
            self.poll(submit=False)
            time.sleep(0.2)

    def verify(self):
        """(summary, problems): every job SUCCEEDED, with one line per rank of its last attempt;
        also any job the head knows that a failed submit made after all."""
        problems = []
        checked = 0
        attempts = []
        try:
            known = [j["job_id"] for j in self.c.cli_json("job", "list")]
        except Exception as e:
            known = []
            problems.append(f"error: torus job list: {e}")
        extra = [j for j in known if j not in self.ids]
        for job_id in self.ids + extra:
            try:
                st = self.status(job_id)
            except Exception as e:
                problems.append(f"missing: gang job {job_id}: torus job status: {str(e)[:300]}")
                continue
            attempts.append(st.get("attempt", 0))
            if st["state"] != "SUCCEEDED":
                kind = "hung" if st["state"] not in self.TERMINAL else "missing"
                problems.append(f"{kind}: gang job {job_id} (attempt {st.get('attempt')}): {st['state']}: "
                                f"{st.get('message', '')}")
                continue
            try:
                logs = self.c.run([self.c.torus, "job", "logs", job_id], timeout=30).stdout
            except Exception as e:
                problems.append(f"missing: gang job {job_id}: torus job logs: {str(e)[:300]}")
                continue
            checked += 1
            pg = st.get("placement_group_id", "")
            lines = [m for m in (self.LINE.match(l) for l in logs.splitlines()) if m and m["pg"] == pg]
            got = sorted((int(m["rank"]), int(m["n"]), m["slice"], m["host"], m["worker"]) for m in lines)
            want = [(r, SLICE_HOSTS, SLICE_NAME, str(r), str(r)) for r in range(SLICE_HOSTS)]
            if not pg or got != want:
                tail = "\n".join(logs.splitlines()[-12:])
                problems.append(f"wrong: gang job {job_id}: the lines of its last attempt (reservation "
                                f"{pg!r}) as (rank, processes, slice, host, TPU_WORKER_ID): {got} != {want}; "
                                f"log tail:\n{tail}")
        summary = {"submitted": len(self.ids), "checked": checked, "retries": sum(attempts),
                   "max_attempt": max(attempts, default=0), "unknown_jobs": extra,
                   "submit_errors": self.submit_errors[:10]}
        return summary, problems


class Killer:
    def __init__(self, cluster: Cluster, rng: random.Random, driver_pid: int):
        self.c = cluster
        self.rng = rng
        self.driver_pid = driver_pid
        self.kills = {"workers": 0, "nodes": 0, "head": 0}
        self.slice_host_kills = 0
        self.recovery = {"nodes": [], "head": [], "node_dead_detected": [], "head_restart_cmd": [],
                         "standby_active": []}
        self.failures = []   # recoveries that did not happen
        self.events = []

    def kill(self, kind):
        return getattr(self, "kill_" + kind)()

    def event(self, what):
        t = time.time()
        self.events.append(time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d} {what}")

    def kill_workers(self):
        node_pids = self.c.node_pids()
        ws = [w for w in self.c.cli_json("list", "workers")
              if w["pid"] != self.driver_pid and ppid_of(w["pid"]) in node_pids]
        busy = [w for w in ws if w["state"] in ("leased", "actor", "blocked")]
        pool = busy or [w for w in ws if w["state"] != "starting"] or ws
        if not pool:
            return False
        w = self.rng.choice(sorted(pool, key=lambda w: w["pid"]))
        if not kill9(w["pid"]):
            self.failures.append(f"worker {w['pid']} did not die")
        self.kills["workers"] += 1
        self.event(f"kill worker pid {w['pid']} ({w['state']}{' ' + w['actor_id'][:8] if w['actor_id'] else ''})")
        return True

    def kill_nodes(self):
        node_pids = self.c.node_pids()
        cands = [n for n in self.c.alive() if not n["is_head_node"] and n["pid"] in node_pids]
        if not cands:
            return False
        n = self.rng.choice(sorted(cands, key=lambda n: n["node_id"]))
        cmd, env = self.c.restart_of(n)
        before = {m["node_id"] for m in self.c.nodes()}
        t0 = time.monotonic()
        if not kill9(n["pid"]):
            self.failures.append(f"node {n['node_id'][:12]} pid {n['pid']} did not die")
            return True
        self.kills["nodes"] += 1
        self.slice_host_kills += env is not None
        self.event(f"kill node {n['node_id'][:12]} pid {n['pid']}"
                   + (f" (slice host {env['TPU_WORKER_ID']})" if env else ""))
        try:
            self.c.run(cmd, timeout=RECOVERY_TIMEOUT_S, env=env)
        except Exception as e:
            self.failures.append(f"restarting a node after killing {n['node_id'][:12]}: {e}")
        back = dead = None
        end = t0 + RECOVERY_TIMEOUT_S
        while time.monotonic() < end and (back is None or dead is None):
            try:
                ns = self.c.nodes()
            except Exception:
                time.sleep(0.05)
                continue
            now = time.monotonic() - t0
            if back is None and any(m["node_id"] not in before and m["state"] == "ALIVE" for m in ns):
                back = now
            if dead is None and all(m["node_id"] != n["node_id"] or m["state"] == "DEAD" for m in ns):
                dead = now
            time.sleep(0.05)
        if back is None or dead is None:
            self.failures.append(f"node kill {self.kills['nodes']} ({n['node_id'][:12]}): "
                                 f"replacement alive {back}, killed node declared dead {dead} "
                                 f"(bound {RECOVERY_TIMEOUT_S:.0f} s)")
        else:
            self.event(f"node {n['node_id'][:12]}: replacement alive after {back:.2f} s, declared dead after {dead:.2f} s")
            self.recovery["nodes"].append(back)
            self.recovery["node_dead_detected"].append(dead)
        return True

    def kill_head(self):
        return self.kill_active_head() if self.c.etcd else self.kill_restart_head()

    def kill_active_head(self):
        """--etcd: kills the active head; the standby must take over (its state file says
        "active"), every node must be ALIVE on it, and the killed head's command must come back
        as a standby."""
        heads = self.c.heads()
        active = [p for p, (_, st) in heads.items() if st == "active"]
        if len(heads) != 2 or len(active) != 1:
            self.event(f"head: no kill (heads {heads})")
            return False
        port = active[0]
        pid = heads[port][0]
        other = next(p for p in heads if p != port)
        expect = {n["node_id"] for n in self.c.alive()}
        t0 = time.monotonic()
        if not kill9(pid):
            self.failures.append(f"active head pid {pid} did not die")
            return True
        self.kills["head"] += 1
        self.event(f"kill active head :{port} pid {pid}")
        n = self.kills["head"]
        end = t0 + RECOVERY_TIMEOUT_S
        try:
            self.c.wait(lambda: self.c.heads().get(other, (0, ""))[1] == "active", end - time.monotonic(),
                        f"the standby :{other} to become active")
            self.recovery["standby_active"].append(time.monotonic() - t0)
            self.c.wait(lambda: expect <= {m["node_id"] for m in self.c.alive()}, end - time.monotonic(),
                        "every node ALIVE on the new active head")
            self.recovery["head"].append(time.monotonic() - t0)
            self.event(f"head :{other} active after {self.recovery['standby_active'][-1]:.2f} s, "
                       f"every node ALIVE on it after {self.recovery['head'][-1]:.2f} s")
        except TimeoutError as e:
            self.failures.append(f"head kill {n}: {e}")
        if not port_free(port):
            self.event(f"head port {port} still in use 10 s after the kill")
        try:
            t1 = time.monotonic()
            p = self.c.run(self.c.head_cmds[port], timeout=RECOVERY_TIMEOUT_S)
            self.recovery["head_restart_cmd"].append(time.monotonic() - t1)
            if "standing by" not in p.stdout:
                self.failures.append(f"head kill {n}: the killed head's command did not come back as a "
                                     f"standby: {p.stdout.strip()} {p.stderr.strip()}")
        except Exception as e:
            self.failures.append(f"head kill {n}: restarting :{port} failed: {e}")
        return True

    def kill_restart_head(self):
        pid = self.c.head_pid()
        expect = {n["node_id"] for n in self.c.alive()}
        t0 = time.monotonic()
        if not kill9(pid):
            self.failures.append(f"head pid {pid} did not die")
            return True
        self.kills["head"] += 1
        self.event(f"kill head pid {pid}")
        if not port_free(self.c.port):
            self.event(f"head port {self.c.port} still in use 10 s after the kill")
        try:
            p = self.c.run(self.c.head_cmd, timeout=RECOVERY_TIMEOUT_S)
            self.recovery["head_restart_cmd"].append(time.monotonic() - t0)
            if "resumed" not in p.stdout:
                self.failures.append(f"head kill {self.kills['head']}: the restarted head did not "
                                     f"resume the session: {p.stdout.strip()} {p.stderr.strip()}")
        except Exception as e:
            self.failures.append(f"head kill {self.kills['head']}: restart failed: {e}")
            return True
        try:
            self.c.wait(lambda: expect <= {n["node_id"] for n in self.c.alive()},
                        RECOVERY_TIMEOUT_S - (time.monotonic() - t0), "every node re-registered")
            self.recovery["head"].append(time.monotonic() - t0)
            self.event(f"head serving again, every node re-registered, after {self.recovery['head'][-1]:.2f} s")
        except TimeoutError as e:
            self.failures.append(f"head kill {self.kills['head']}: {e}")
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills-per-kind", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kinds", default="workers,nodes,head")
    ap.add_argument("--nodes", type=int, default=3, help="nodes besides the head's")
    ap.add_argument("--interval", default="0.3,1.5", help="MIN,MAX seconds between kills")
    ap.add_argument("--torus", default=os.environ.get("TORUS_BIN") or str(REPO / "build" / "torus"))
    venv = REPO / ".venv-py" / "bin" / "python"
    ap.add_argument("--python", default=str(venv) if venv.exists() else sys.executable)
    ap.add_argument("--nested-late", action="store_true",
                    help="diagnosis only: submit the nested-ref tasks once the tasks they read "
                         "have finished (by default they go at once, so they block in ray.get on "
                         "tasks that may be pipelined behind them)")
    ap.add_argument("--no-nested", action="store_true",
                    help="diagnosis only: leave out the nested-ref tasks (the run then does not "
                         "cover nested refs; the summary says so)")
    ap.add_argument("--etcd", action="store_true",
                    help="keep the head's state in a private etcd, with a standby head; the head "
                         "kills kill the active head (failover)")
    ap.add_argument("--no-slice", action="store_true",
                    help="diagnosis only: no simulated slice, so no slice reservations and no gang "
                         "jobs (the summary says so)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary line last")
    ap.add_argument("--keep", action="store_true", help="keep the session root even when it passes")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in ("workers", "nodes", "head"):
            ap.error(f"unknown kind {k!r} (workers, nodes, head)")
    lo, hi = (float(x) for x in args.interval.split(","))
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    t_begin = time.monotonic()
    runtime = runtime_files(args.torus, args.python)

    root = tempfile.mkdtemp(prefix="torus-chaos-")
    os.chmod(root, 0o700)
    run_dir = Path(root, "run")
    run_dir.mkdir()
    c = Cluster(args.torus, root, args.nodes, not args.no_slice, args.etcd)
    log(f"seed {seed}; {args.kills_per_kind} kills of each of {', '.join(kinds)}"
        + (" (head: the active one, on etcd)" if args.etcd else "") + f"; root {root}")
    problems = []   # reasons to fail
    summary = {"seed": seed, "kills_per_kind": args.kills_per_kind, "root": root, "etcd": args.etcd,
               "slice": None if args.no_slice else f"{SLICE_VERSION} {SLICE_TOPOLOGY}"}
    driver = None
    killer = None
    gang = None
    try:
        c.start()
        start = c.snapshot()
        log(f"cluster at {c.driver_address}: {start['alive']} nodes ({c.slice_hosts} of them hosts of "
            f"slice {SLICE_NAME}), CPU {start['total'].get('CPU', 0):g}, TPU {start['total'].get('TPU', 0):g}, "
            f"session {c.session}, /dev/shm {sorted(start['shm']['alive'])} "
            f"({start['shm']['bytes'] >> 10} KiB used)")
        (run_dir / "driver.py").write_text(DRIVER)
        (run_dir / "check_named.py").write_text(CHECK_NAMED)
        stop, status, result = run_dir / "stop", run_dir / "status.json", run_dir / "result.json"
        denv = dict(c.env, RAY_ADDRESS=c.driver_address)
        dout = open(run_dir / "driver.out", "w")
        derr = open(run_dir / "driver.err", "w")
        driver = subprocess.Popen([args.python, "-m", "torus.ray", str(run_dir / "driver.py"), str(stop),
                                   str(status), str(result), str(ROUND_TIMEOUT_S),
                                   "0" if args.nested_late else "1", "1" if args.no_nested else "0",
                                   "" if args.no_slice else SLICE_TOPOLOGY, SLICE_VERSION],
                                  env=denv, cwd=run_dir, stdout=dout, stderr=derr)

        def rounds():
            try:
                return json.loads(status.read_text())["rounds"]
            except (OSError, ValueError, KeyError):
                return 0

        c.wait(lambda: rounds() >= 1 or driver.poll() is not None, 180, "the driver's first round")
        if driver.poll() is not None:
            raise RuntimeError(f"the driver exited {driver.returncode} before its first round")
        log(f"workload running ({rounds()} round(s) done); killing")

        watch = StallWatch(c, run_dir, rounds)
        killer = Killer(c, rng, driver.pid)
        gang = GangJobs(c, args.python, run_dir) if c.slice_hosts else None
        left = {k: args.kills_per_kind for k in kinds}
        t_kills = time.monotonic()
        last_report = t_kills
        while any(left.values()):
            if driver.poll() is not None:
                problems.append(f"the driver exited ({driver.returncode}) during the kills")
                break
            time.sleep(rng.uniform(lo, hi))
            watch.poll()
            if gang is not None:
                gang.poll()
            ks = [k for k in kinds if left[k] > 0]
            kind = rng.choices(ks, weights=[left[k] for k in ks])[0]
            try:
                done = killer.kill(kind)
            except Exception as e:  # e.g. a CLI call while the head is away: try again later
                done = False
                killer.event(f"{kind}: no kill ({str(e)[:200]})")
            if done:
                left[kind] = args.kills_per_kind - killer.kills[kind]
            if time.monotonic() - last_report > 30:
                last_report = time.monotonic()
                log(f"{time.monotonic() - t_kills:.0f} s: kills {killer.kills}, driver round {rounds()}"
                    + (f", gang jobs submitted {len(gang.ids)}" if gang else ""))
        summary["kill_phase_s"] = round(time.monotonic() - t_kills, 1)
        log(f"kills done in {summary['kill_phase_s']} s: {killer.kills}; letting the driver finish two rounds")

        r0 = rounds()
        try:
            c.wait(lambda: watch.poll() or (gang and gang.poll(submit=False)) or rounds() >= r0 + 2
                   or driver.poll() is not None,
                   2 * ROUND_TIMEOUT_S + 30, "two more driver rounds")
        except TimeoutError as e:
            problems.append(f"hung: {e}")
        stop.write_text("stop")
        try:
            c.wait(lambda: watch.poll() or driver.poll() is not None, ROUND_TIMEOUT_S + 60,
                   "the driver to finish")
        except TimeoutError:
            problems.append(f"hung: the driver did not finish after the stop flag "
                            f"(see {run_dir}/driver.out)")
            driver.kill()
            driver.wait()
        dout.close()
        derr.close()
        summary["stalls"] = [p for _, p in watch.saved]
        if driver.returncode != 0:
            problems.append(f"the driver exited {driver.returncode} (see {run_dir}/driver.err)")
        res = json.loads(result.read_text()) if result.exists() else {}
        if not res:
            problems.append("the driver wrote no result")
        summary.update(rounds=res.get("rounds"), checked=res.get("checked", 0), counts=res.get("counts", {}),
                       wrong=len(res.get("wrong_detail", [])) if res else None,
                       missing=sum(res.get("missing_by_type", {}).values()) if res else None,
                       missing_by_type=res.get("missing_by_type", {}), allowed=res.get("allowed", {}),
                       hung=len(res.get("hung_detail", [])),
                       actors=res.get("actors", {}))
        for w in res.get("wrong_detail", []):
            problems.append(f"wrong: {w}")
        for m in res.get("missing_detail", []):
            problems.append(f"missing: {m}")
        for h in res.get("hung_detail", []):
            problems.append(f"hung: {h}")
        if gang is not None:  # the last gang job, then every job's state and log
            gang.wait_last(GANG_TIMEOUT_S)
            summary["gang"], gp = gang.verify()
            summary["counts"]["gang_jobs"] = summary["gang"]["submitted"]
            summary["checked"] += summary["gang"]["checked"]
            for g in gp:
                kind = g.split(":", 1)[0]
                if kind in ("wrong", "missing", "hung") and summary.get(kind) is not None:
                    summary[kind] += 1
                    if kind == "missing":
                        summary["missing_by_type"]["GangJobFailed"] = \
                            summary["missing_by_type"].get("GangJobFailed", 0) + 1
            problems.extend(gp)
            problems.extend(f"error: torus job submit failed: {e}" for e in gang.submit_errors)

        # The detached named actor, from a new driver.
        try:
            p = subprocess.run([args.python, "-m", "torus.ray", str(run_dir / "check_named.py")], env=denv,
                               cwd=run_dir, capture_output=True, text=True, timeout=120)
            m = re.search(r"^NAMED (.*)$", p.stdout, re.M)
            got = json.loads(m.group(1)) if m else None
            summary["named_final"] = got
            summary["checked"] = summary.get("checked", 0) + 1
            if got is None or got != res.get("named"):
                problems.append(f"wrong: the detached named actor, read by name from a new driver: "
                                f"{got} != {res.get('named')} (the workload's last reply) {p.stderr[-500:]}")
        except subprocess.TimeoutExpired:
            problems.append("hung: reading the detached named actor from a new driver")

        # Everything back to where it started.
        t_settle = time.monotonic()
        diffs = ["not measured"]
        now = None
        while time.monotonic() - t_settle < SETTLE_TIMEOUT_S:
            try:
                now = c.snapshot()
                diffs = compare(start, now)
            except Exception as e:
                diffs = [f"snapshot failed: {e}"]
            if not diffs:
                break
            time.sleep(0.5)
        summary["settle_s"] = round(time.monotonic() - t_settle, 1)
        summary["leaks"] = diffs
        if now:
            summary["shm_bytes"] = {"start": start["shm"]["bytes"], "end": now["shm"]["bytes"]}
        for d in diffs:
            problems.append(f"leak: {d}")
    except Exception as e:
        problems.append(f"error: {type(e).__name__}: {e}")
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        if c.session is not None:
            c.run([c.torus, "stop"], timeout=120, check=False)
            left_shm = c.shm(set())["dead"]
            if left_shm:
                problems.append(f"leak: /dev/shm segments left after torus stop: {left_shm}")
            left_procs = c.session_processes()
            if left_procs:
                problems.append(f"leak: processes of the session left after torus stop: {left_procs}")
        c.stop_etcd()
    for f, was in runtime_files(args.torus, args.python).items():
        if runtime.get(f, was) != was or f not in runtime:
            problems.append(f"error: the runtime under test changed during the run (rebuilt or reinstalled): {f}")
    summary["runtime"] = {f: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v[2] / 1e9)) if v else None
                          for f, v in runtime.items()}

    if killer is not None:
        try:
            (Path(root) / "run" / "events.log").write_text("\n".join(killer.events) + "\n")
        except OSError:
            pass
        summary["kills"] = killer.kills
        summary["recovery"] = {k: [round(x, 2) for x in v] for k, v in killer.recovery.items()}
        summary["slice_host_kills"] = killer.slice_host_kills
        for k in kinds:
            if killer.kills[k] < args.kills_per_kind:
                problems.append(f"only {killer.kills[k]} of {args.kills_per_kind} kills of {k}")
        for f in killer.failures:
            problems.append(f"recovery: {f}")
    else:
        summary["kills"] = {}
    summary["seconds"] = round(time.monotonic() - t_begin, 1)
    summary["ok"] = not problems
    summary["problems"] = problems[:100]

    kills = summary["kills"]
    log("kills survived: " + ", ".join(f"{k} {kills.get(k, 0)}" for k in ("workers", "nodes", "head")))
    if killer is not None:
        rec = killer.recovery
        log(f"recovery, node kill -> replacement alive: {summarize(rec['nodes'])}; "
            f"killed node declared dead: {summarize(rec['node_dead_detected'])}")
        if args.etcd:
            log(f"recovery, active head kill -> failover: standby active {summarize(rec['standby_active'])}; "
                f"every node ALIVE on it {summarize(rec['head'])} (killed head's command back as "
                f"standby in {summarize(rec['head_restart_cmd'])})")
        else:
            log(f"recovery, head kill -> every node re-registered: {summarize(rec['head'])} "
                f"(restart command returned: {summarize(rec['head_restart_cmd'])})")
        if c.slice_hosts:
            log(f"of the node kills, {killer.slice_host_kills} were of hosts of slice {SLICE_NAME}")
    log(f"driver rounds {summary.get('rounds')}, {summary.get('counts')}"
        + (" (WITHOUT nested-ref tasks: --no-nested)" if args.no_nested else "")
        + (" (WITHOUT a slice: no slice reservations, no gang jobs: --no-slice)" if args.no_slice else ""))
    if summary.get("gang"):
        g = summary["gang"]
        log(f"gang jobs: {g['submitted']} submitted, {g['checked']} succeeded with one line per rank, "
            f"{g['retries']} retried attempts in all (at most {g['max_attempt']} in one job)"
            + (f", jobs no submit returned: {g['unknown_jobs']}" if g["unknown_jobs"] else ""))
    log(f"results checked {summary.get('checked', 0)}, wrong {summary.get('wrong')}, "
        f"missing {summary.get('missing')} {summary.get('missing_by_type') or ''}, hung {summary.get('hung')}; "
        f"allowed failures {summary.get('allowed') or 'none'}")
    log(f"leaked: {'; '.join(summary.get('leaks') or []) or 'nothing'}"
        + (f" (settled in {summary['settle_s']} s; shm bytes {summary.get('shm_bytes')})" if "settle_s" in summary else ""))
    if summary.get("stalls"):
        log(f"stalls (tasks, workers and nodes saved while the driver was stuck): {summary['stalls']}")
    for p in problems[:40]:
        log("PROBLEM " + p)
    log(f"{'OK' if not problems else 'FAILED'} in {summary['seconds']:.0f} s (seed {seed})")
    if args.json:
        print(json.dumps(summary), flush=True)
    if problems or args.keep:
        log(f"kept {root} (driver output in {run_dir})")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
