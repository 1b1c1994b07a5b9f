#!/usr/bin/env python3
"""Serve side by side with Ray Serve 2.60: the same program (bench/serve_app.py), the same load
generator (wrk, 1 thread, SERVE_BENCH_CONNECTIONS connections), rounds alternated Torus / Ray.

  bench/serve_bench.py --rounds 3 [--torus-python .venv-py/bin/python]
                       [--ray-python .venv-ray/bin/python]

Prints each round's figures and a table of medians with the ratio Torus/Ray (or Ray/Torus for
times and latencies, so > 1 is Torus ahead). Needs port 8000 free and `wrk` (Debian: wrk).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "bench" / "serve_app.py"

ROWS = [  # (label, key path, higher is better)
    ("HTTP no-op, 1 replica: requests/s", ("http_1", "rps"), True),
    ("HTTP no-op, 1 replica: p50 ms", ("http_1", "p50_ms"), False),
    ("HTTP no-op, 1 replica: p99 ms", ("http_1", "p99_ms"), False),
    ("HTTP no-op, 2 replicas: requests/s", ("http_2", "rps"), True),
    ("HTTP no-op, 2 replicas: p50 ms", ("http_2", "p50_ms"), False),
    ("HTTP no-op, 2 replicas: p99 ms", ("http_2", "p99_ms"), False),
    ("handle calls/s, one at a time", ("handle_seq_per_s",), True),
    ("handle calls/s, 100 in flight", ("handle_100_inflight_per_s",), True),
    ("ray.init, s", ("init_s",), False),
    ("serve.run to first answer (right after ray.init), s", ("run_to_first_answer_s",), False),
    ("ray.init + serve.run to first answer, s", ("init_and_run_to_first_answer_s",), False),
    ("serve.run to first answer (2 s after serve.shutdown), s", ("rerun_to_first_answer_s",),
     False),
    ("SIGKILLed replica to first answer of its replacement, s", ("replace_killed_s",), False),
    ("autoscaling: load start to 2nd replica running, s", ("autoscale_up_s",), False),
]


def one(system: str, python: str) -> dict:
    cmd = [python] + (["-m", "torus.ray"] if system == "torus" else []) + [str(APP)]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TORUS_ADDRESS")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900,
                       cwd="/tmp")
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{system} round failed ({p.returncode}):\n{p.stdout[-3000:]}\n"
                       f"{p.stderr[-3000:]}")


def get(res: dict, path):
    for k in path:
        res = res.get(k) if isinstance(res, dict) else None
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torus-python", default=str(REPO / ".venv-py" / "bin" / "python"))
    ap.add_argument("--ray-python", default=str(REPO / ".venv-ray" / "bin" / "python"))
    a = ap.parse_args()
    runs = {"torus": [], "ray": []}
    for i in range(a.rounds):
        for system in (("torus", "ray") if i % 2 == 0 else ("ray", "torus")):
            py = a.torus_python if system == "torus" else a.ray_python
            t = time.time()
            r = one(system, py)
            runs[system].append(r)
            print(f"round {i + 1} {system} ({time.time() - t:.0f} s): {json.dumps(r)}",
                  flush=True)
    print()
    print("| figure | Torus (median) | Ray Serve 2.60 (median) | Torus ahead by |")
    print("|---|---|---|---|")
    for label, path, higher in ROWS:
        tv = [get(r, path) for r in runs["torus"] if get(r, path) is not None]
        rv = [get(r, path) for r in runs["ray"] if get(r, path) is not None]
        if not tv or not rv:
            print(f"| {label} | {tv} | {rv} | n/a |")
            continue
        tm, rm = statistics.median(tv), statistics.median(rv)
        ratio = (tm / rm if higher else rm / tm) if min(tm, rm) > 0 else float("nan")
        print(f"| {label} | {tm:.4g} | {rm:.4g} | {ratio:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
