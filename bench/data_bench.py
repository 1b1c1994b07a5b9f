#!/usr/bin/env python3
"""Torus Data against Ray Data 2.60, side by side (issue #43): the same Parquet files, the same
program (bench/data_bench_prog.py, plain Ray Data code), the same parallelism (each runtime's
local cluster with its defaults: 2 CPUs here), rounds alternated Torus / Ray.

  bench/data_bench.py [--rounds 3] [--data-dir /tmp/torus-data-bench] [--json]
                      [--pipelines parquet,actor,rowmap] [--map-rows 1000000]
                      [--torus-python .venv-py/bin/python] [--ray-python .venv-ray/bin/python]

Data (made once, kept in --data-dir): 16 Parquet files of 65536 rows, each row ~1 KB:
`id` int64, `label` float32, six dense float32 features `f0..f5`, and `emb`, a 240-float32
embedding as Parquet's fixed-size list (what pyarrow, Spark and pandas write for a vector column),
snappy, row groups of 16384 rows (~16 MB). 1 Mi rows, ~1.0 GB in memory, ~1.0 GB on disk (random
floats do not compress). Why this shape: a training-ingest table for a recommendation or retrieval
model (an id, a label, a few dense features, a precomputed embedding) is the common case of
JaxTrainer ingest; ~1 KB rows make bytes, not per-row Python, the cost a reader pays, so the
pipelines measure the data path (Arrow blocks through the object store to the consumer), and
1 GB is several times the per-operator buffers yet fits the page cache, so the disk drops out
(the files are read once before the first round to warm it).

Pipelines, one fresh program (and so one fresh local cluster) per pipeline and runtime:
  parquet  read_parquet -> map_batches(numpy transform) -> iter_batches(1024) in the driver
  actor    the same, the UDF a callable class on an actor pool (concurrency=2, num_cpus=0.5)
  rowmap   range(N).map(row fn) -> iter_batches(1024)
  floor    pyarrow alone, 2 processes reading whole files (no framework): parquet's floor
Each reports rows/s and GB/s (bytes that reached the consumer), wall seconds (dataset built to
last batch consumed), CPU seconds of the runtime's processes over that window, and memory.

Memory: this script starts the program and samples, every 0.2 s from before its start to its
exit, the sum over the runtime's processes of (Pss - Pss_Shmem) from /proc/PID/smaps_rollup, plus
the shared memory they hold, counted once: every /dev/shm file mapped by one of them (found in
/proc/PID/maps, sized by its allocated blocks, through /proc/PID/map_files when already
unlinked, as Ray's plasma file is) and every /dev/shm file carrying the prefix of a Torus node
seen mapped ("torus.<node-id>.", segments not mapped at that instant included). The runtime's
processes: every descendant of the program (Torus: the driver, which hosts the local head and
node, and its workers; Ray: the driver, gcs_server, raylet, dashboard and its subprocesses,
log monitor, agents, workers; the floor: the pool), plus any process whose command line names
the session directory the program prints after ray.init (a daemon that left the tree). Peak =
the largest sample over the run; idle = the sample just before the pipeline started.

Prints each run's figures, then one table per pipeline: Torus, Ray, Torus/Ray (for memory
Ray/Torus, so > 1 is Torus ahead), and for parquet the floor and Torus/floor; then the issue's
targets, met or missed. --json prints the medians and every run as one JSON object instead.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROG = REPO / "bench" / "data_bench_prog.py"
FILES, ROWS_PER_FILE, ROW_GROUP, EMB = 16, 65536, 16384, 240
PERIOD = 0.2
MiB = 1 << 20


# ---------------------------------------------------------------- data

def generate(data_dir: str) -> list:
    """The Parquet files (made once; kept when all are present)."""
    paths = [os.path.join(data_dir, f"part-{i:05d}.parquet") for i in range(FILES)]
    if all(os.path.exists(p) for p in paths):
        return paths
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(43)
    for i, path in enumerate(paths):
        n = ROWS_PER_FILE
        cols = {"id": np.arange(i * n, (i + 1) * n, dtype=np.int64),
                "label": rng.random(n, dtype=np.float32)}
        for k in range(6):
            cols[f"f{k}"] = rng.random(n, dtype=np.float32)
        emb = rng.standard_normal(n * EMB, dtype=np.float32)
        cols["emb"] = pa.FixedSizeListArray.from_arrays(pa.array(emb), EMB)
        pq.write_table(pa.table(cols), path + ".tmp", row_group_size=ROW_GROUP,
                       compression="snappy")
        os.replace(path + ".tmp", path)
    return paths


def warm_cache(paths: list) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(16 * MiB):
                pass


# ---------------------------------------------------------------- processes and memory

def _proc_table() -> dict:
    """pid -> (ppid, cpu ticks) for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rfind(b")") + 2:].split()
        out[int(d)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def _descendants(root: int, table: dict) -> set:
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p in table and p not in found:
            found.add(p)
            todo.extend(children.get(p, ()))
    return found


def _private_pss(pid: int) -> int:
    """Pss minus Pss_Shmem, bytes (shared memory is counted once, separately)."""
    pss = shm = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith("Pss_Shmem:"):
                    shm = int(line.split()[1])
    except OSError:
        return 0
    return (pss - shm) * 1024


def _shm_maps(pid: int) -> dict:
    """inode -> a path to stat it by, for each /dev/shm file the process maps."""
    out = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if "/dev/shm/" not in line:
                    continue
                parts = line.split(None, 5)
                out[int(parts[4])] = (f"/proc/{pid}/map_files/{parts[0]}",
                                      parts[5].strip().split(" (deleted)")[0])
    except OSError:
        pass
    return out


def _name(pid: int) -> str:
    """A short label: the program name, or what a Python process runs."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return str(pid)
    words = [w.decode(errors="replace") for w in argv if w]
    if not words:
        return str(pid)
    base = os.path.basename(words[0].split()[0])
    if not base.startswith("python"):  # raylet, gcs_server, "ray::IDLE" (a retitled worker)
        return f"{words[0][:40]}:{pid}"
    text = " ".join(words[1:])
    for key in ("worker_main", "default_worker", "data_bench_prog", "agent", "dashboard",
                "log_monitor", "monitor.py",
                "forkserver", "resource_tracker", "multiprocessing"):
        if key in text:
            return f"{key}:{pid}"
    return f"python:{pid}"


class Sampler(threading.Thread):
    """Samples the memory of the process tree under `root` every PERIOD s until stop()."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.session = root, ""
        self.samples = []  # (t, bytes, number of processes, of which shared memory)
        self.cpu = {}  # pid -> last cpu ticks seen
        self.cpu_at_start = None
        self._shm = {}  # inode -> (stat path, name)
        self._prefixes = set()
        self.peak = (0, {}, 0)  # (bytes, {pid: private bytes}, shm bytes) of the largest sample
        self._names = {}  # pid -> label, read when first seen
        self._seen = set()  # pids sampled last time (a new one has its maps read at once)
        self._halt = threading.Event()
        self._mu = threading.Lock()  # sample() runs on this thread and, at START/RESULT, the caller's

    def mark_start(self) -> None:
        self.cpu_at_start = dict(self.cpu)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            self.sample(rescan=(n % 5 == 0))
            n += 1
            self._halt.wait(PERIOD)

    def procs(self, table: dict, rescan: bool) -> set:
        pids = _descendants(self.root, table)
        if self.session and rescan:
            for pid in table:
                if pid in pids:
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if self.session.encode() in f.read():
                            pids.add(pid)
                except OSError:
                    pass
        return pids

    def sample(self, rescan: bool) -> None:
        with self._mu:
            self._sample(rescan)

    def _sample(self, rescan: bool) -> None:
        table = _proc_table()
        pids = self.procs(table, rescan)
        per = {}
        for pid in pids:
            self.cpu[pid] = table[pid][1]
            per[pid] = _private_pss(pid)
            if rescan or pid not in self._seen:
                self._shm.update(_shm_maps(pid))
                if pid not in self._names:
                    self._names[pid] = _name(pid)
        self._seen = pids
        shm = self.shm_bytes()
        total = sum(per.values()) + shm
        self.samples.append((time.monotonic(), total, len(pids), shm))
        if total > self.peak[0]:
            self.peak = (total, per, shm)

    def peak_breakdown(self) -> list:
        """The peak sample as [(process, MiB)], largest first, shared memory as one entry."""
        total, per, shm = self.peak
        out = [(self._names.get(pid, str(pid)), round(b / MiB)) for pid, b in per.items()]
        out.append(("/dev/shm (counted once)", round(shm / MiB)))
        return sorted(out, key=lambda x: -x[1])

    def shm_bytes(self) -> int:
        sizes, gone = {}, []
        for ino, (path, name) in self._shm.items():
            base = os.path.basename(name)
            if base.startswith("torus.") and base.count(".") >= 2:
                self._prefixes.add(base[:base.index(".", 6) + 1])
            try:
                st = os.stat(path)
            except OSError:
                gone.append(ino)
                continue
            sizes[st.st_ino] = st.st_blocks * 512
        for ino in gone:
            del self._shm[ino]
        if self._prefixes:
            for name in os.listdir("/dev/shm"):
                if any(name.startswith(p) for p in self._prefixes):
                    try:
                        st = os.stat("/dev/shm/" + name)
                    except OSError:
                        continue
                    sizes[st.st_ino] = st.st_blocks * 512
        return sum(sizes.values())

    def cpu_seconds(self) -> float:
        start = self.cpu_at_start or {}
        ticks = sum(v - start.get(pid, 0) for pid, v in self.cpu.items())
        return ticks / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- one run

def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def run_one(system: str, pipeline: str, a) -> dict:
    """Runs the program once under `system` (torus, ray, or floor) and returns its figures."""
    prog = [str(PROG), "--pipeline", "floor" if system == "floor" else pipeline,
            "--data-dir", a.data_dir, "--map-rows", str(a.map_rows)]
    if system == "torus":
        cmd = [a.torus_python, "-m", "torus.ray"] + prog
    elif system == "ray":
        cmd = [a.ray_python] + prog
    else:
        cmd = [a.torus_python] + prog
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TORUS_ADDRESS")}
    err_path = f"/tmp/data_bench.{system}.{pipeline}.stderr"
    load = os.getloadavg()[0]
    with open(err_path, "w") as err:
        # Its own process group: a run past --timeout is killed with everything it started.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                             cwd="/tmp", start_new_session=True)
        watchdog = threading.Timer(a.timeout, _kill_group, (p.pid,))
        watchdog.start()
        sampler = Sampler(p.pid)
        sampler.sample(rescan=True)
        sampler.start()
        result, t_start = None, None
        try:
            for line in p.stdout:
                if line.startswith("SESSION "):
                    sampler.session = line.split(" ", 1)[1].strip()
                elif line.startswith("START"):
                    sampler.sample(rescan=True)
                    t_start = time.monotonic()
                    sampler.mark_start()
                elif line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
                    sampler.sample(rescan=True)  # the cpu used up to the end of the pipeline
                    cpu = sampler.cpu_seconds()
            p.wait(timeout=a.timeout)
        finally:
            watchdog.cancel()
            if p.poll() is None:
                _kill_group(p.pid)
            sampler.stop()
    if result is None or t_start is None:
        raise RuntimeError(f"{system} {pipeline} failed ({p.returncode}), see {err_path}:\n"
                           + open(err_path).read()[-3000:])
    return dict(summarize(result, sampler, t_start, cpu), load1=round(load, 1))


def summarize(result: dict, sampler: Sampler, t_start: float, cpu: float) -> dict:
    before = [s[1] for s in sampler.samples if s[0] <= t_start]
    peak = max(s[1] for s in sampler.samples)
    wall = result["wall_s"]
    return {"rows": result["rows"], "bytes": result["bytes"], "wall_s": round(wall, 3),
            "rows_per_s": round(result["rows"] / wall),
            "gb_per_s": round(result["bytes"] / 1e9 / wall, 5),
            "cpu_s": round(cpu, 2),
            "peak_mib": round(peak / MiB), "idle_mib": round(before[-1] / MiB),
            "above_idle_mib": round((peak - before[-1]) / MiB),
            "peak_shm_mib": round(max(s[3] for s in sampler.samples) / MiB),
            "peak_procs": max(s[2] for s in sampler.samples),
            "peak_by_process_mib": sampler.peak_breakdown()[:8]}


# ---------------------------------------------------------------- rounds and report

FIGURES = [  # (key, label, higher is better, format)
    ("rows_per_s", "rows/s", True, "{:,.0f}"),
    ("gb_per_s", "GB/s", True, "{:.3f}"),
    ("wall_s", "wall s", False, "{:.2f}"),
    ("cpu_s", "CPU s of the runtime's processes", False, "{:.1f}"),
    ("peak_mib", "peak memory MiB (PSS + shm)", False, "{:,.0f}"),
    ("idle_mib", "idle memory MiB before the pipeline", False, "{:,.0f}"),
    ("above_idle_mib", "peak minus idle MiB", False, "{:,.0f}"),
]
TITLES = {"parquet": "read_parquet -> map_batches(numpy fn) -> iter_batches(1024)",
          "actor": "read_parquet -> map_batches(callable class, concurrency=2) -> iter_batches",
          "rowmap": "range(N).map(row fn) -> iter_batches(1024)"}


def med(runs: list, key: str):
    vals = [r[key] for r in runs]
    return statistics.median(vals) if vals else None


def ratio(t, r, higher: bool) -> float:
    if not t or not r:
        return float("nan")
    return t / r if higher else r / t


def table(pipeline: str, runs: dict) -> list:
    floor = pipeline == "parquet" and runs["floor"]
    head = "| figure | Torus | Ray Data 2.60 | Torus ahead by |"
    if floor:
        head += " floor (pyarrow, 2 procs) | Torus / floor |"
    out = [f"{pipeline}: {TITLES[pipeline]}", "", head,
           "|---" * (6 if floor else 4) + "|"]
    for key, label, higher, fmt in FIGURES:
        t, r = med(runs[pipeline]["torus"], key), med(runs[pipeline]["ray"], key)
        row = (f"| {label} | {fmt.format(t)} | {fmt.format(r)} | "
               f"{ratio(t, r, higher):.2f}x |")
        if floor:
            f = med(runs["floor"], key)
            row += f" {fmt.format(f)} | {t / f if f else float('nan'):.2f} |"
        out.append(row)
    return out


def targets(runs: dict) -> list:
    """The issue's targets, each as a line saying met or missed."""
    out = []
    floor = med(runs["floor"], "rows_per_s") if runs["floor"] else None
    for pipeline in ("parquet", "actor", "rowmap"):
        if pipeline not in runs:
            continue
        t = med(runs[pipeline]["torus"], "rows_per_s")
        r = med(runs[pipeline]["ray"], "rows_per_s")
        need = 2 * r
        if floor and pipeline != "rowmap" and need > floor:
            need = 0.9 * floor
        out.append(f"{pipeline}: throughput {t:.0f} rows/s, target {need:.0f} "
                   f"(2x Ray, or 0.9x floor where 2x passes it): "
                   f"{'met' if t >= need else 'MISSED'}")
        tm, rm = med(runs[pipeline]["torus"], "peak_mib"), med(runs[pipeline]["ray"], "peak_mib")
        out.append(f"{pipeline}: peak memory {tm:.0f} MiB, target <= {rm / 2:.0f} (1/2 Ray's): "
                   f"{'met' if tm <= rm / 2 else 'MISSED'}")
    if floor and "parquet" in runs:
        t = med(runs["parquet"]["torus"], "rows_per_s")
        out.append(f"parquet: {t / floor:.2f}x the floor, target 0.7x: "
                   f"{'met' if t >= 0.7 * floor else 'MISSED'}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data-dir", default="/tmp/torus-data-bench")
    ap.add_argument("--pipelines", default="parquet,actor,rowmap")
    ap.add_argument("--map-rows", type=int, default=1_000_000)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--torus-python", default=str(REPO / ".venv-py" / "bin" / "python"))
    ap.add_argument("--ray-python", default=str(REPO / ".venv-ray" / "bin" / "python"))
    a = ap.parse_args()
    pipelines = [p for p in a.pipelines.split(",") if p]
    log = sys.stderr if a.json else sys.stdout
    paths = generate(a.data_dir)
    warm_cache(paths)
    runs = {p: {"torus": [], "ray": []} for p in pipelines}
    runs["floor"] = []
    t_all = time.time()
    for i in range(a.rounds):
        if "parquet" in pipelines:
            runs["floor"].append(run_one("floor", "parquet", a))
            print(f"round {i + 1} floor: {json.dumps(runs['floor'][-1])}", file=log, flush=True)
        for j, p in enumerate(pipelines):
            for system in (("torus", "ray") if (i + j) % 2 == 0 else ("ray", "torus")):
                r = run_one(system, p, a)
                runs[p][system].append(r)
                print(f"round {i + 1} {p} {system}: {json.dumps(r)}", file=log, flush=True)
    load = os.getloadavg()
    print(f"{a.rounds} rounds in {time.time() - t_all:.0f} s; load average at the end "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", file=log)
    if a.json:
        medians = {p: {s: {k: med(runs[p][s], k) for k, *_ in FIGURES}
                       for s in ("torus", "ray")} for p in pipelines}
        if runs["floor"]:
            medians["floor"] = {k: med(runs["floor"], k) for k, *_ in FIGURES}
        print(json.dumps({"medians": medians, "runs": runs, "targets": targets(runs)}))
        return 0
    for p in pipelines:
        print("\n" + "\n".join(table(p, runs)))
    print("\n" + "\n".join(targets(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
