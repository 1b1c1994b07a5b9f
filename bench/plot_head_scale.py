#!/usr/bin/env python3
"""Plots bench/head_scale.sh results (a CSV of bench/results/) into docs/img/head_scale_*.png, and
the newest bench/placement_bench CSV into docs/img/placement_index_decision.png.

Usage: bench/plot_scale.py [bench/results/head_scale-....csv]   (default: the newest one)
Runs itself under a private virtualenv (.venv-plot, created with pip on first use) for matplotlib.
"""
import csv
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-plot")


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(VENV, "bin", "python3")
    if os.path.abspath(sys.executable) == os.path.abspath(py):
        sys.exit("matplotlib is missing from " + VENV)
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "matplotlib"])
    os.execv(py, [py] + sys.argv)


def main():
    ensure_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = sys.argv[1] if len(sys.argv) > 1 else max(glob.glob(os.path.join(ROOT, "bench/results/head_scale-*.csv")))
    rows = sorted(csv.DictReader(open(path)), key=lambda r: int(r["nodes"]))
    n = [int(r["nodes"]) for r in rows]
    col = lambda k: [float(r[k]) for r in rows]
    out = os.path.join(ROOT, "docs", "img")
    os.makedirs(out, exist_ok=True)

    def fig(name, title, series, ylabel, limit=None, limit_label=None):
        plt.figure(figsize=(6, 4))
        for label, ys in series:
            plt.plot(n, ys, marker="o", label=label)
        if limit is not None:
            plt.axhline(limit, color="red", linestyle="--", label=limit_label)
        plt.xlabel("simulated nodes")
        plt.ylabel(ylabel)
        plt.title(title)
        plt.grid(True, alpha=0.3)
        plt.legend()
        plt.ylim(bottom=0)
        plt.tight_layout()
        plt.savefig(os.path.join(out, name), dpi=100)
        plt.close()
        print("wrote", os.path.join("docs/img", name))

    fig("head_scale_memory.png", "Head memory per idle node",
        [("RSS", col("rss_bytes_per_node")), ("PSS", col("pss_bytes_per_node"))], "bytes per node",
        1024, "target: 1 KiB")
    fig("head_scale_heartbeats.png", "Heartbeats handled and head CPU",
        [("heartbeats/s / 100", [x / 100 for x in col("heartbeats_per_s")]),
         ("head CPU %", col("head_cpu_pct"))], "heartbeats/s / 100, CPU %")
    fig("head_scale_slice_decision.png", "Slice reservation decision (decision_us)",
        [("p50", col("slice_decision_us_p50")), ("p90", col("slice_decision_us_p90"))], "microseconds",
        100, "target: 100 us")
    fig("head_scale_false_deaths.png", "False deaths (nodes the head declared dead)",
        [("false deaths", col("false_deaths"))], "nodes")
    kinds = ["pack4", "spread4", "strict_pack4", "strict_spread4", "spread4_label", "spread4_custom"]
    if all(f"pg_{k}_decision_us_p50" in rows[0] for k in kinds):
        fig("head_scale_pg_decision.png", "Placement-group decision in the head (decision_us p50)",
            [(k, col(f"pg_{k}_decision_us_p50")) for k in kinds] + [("slice", col("slice_decision_us_p50"))],
            "microseconds", 100, "target: 100 us")
    if "detect_s_p99" in rows[0]:
        fig("head_scale_detection.png", "Killed hosts declared dead (watch ring), seconds",
            [("process killed p50", col("detect_closed_s_p50")), ("process killed p99", col("detect_closed_s_p99")),
             ("host vanished p50", col("detect_silent_s_p50")), ("host vanished p99", col("detect_silent_s_p99"))],
            "seconds after the kill", 5, "target p99: 5 s")
    # The placement index alone, in one process (bench/placement_bench), when it has been run.
    benches = glob.glob(os.path.join(ROOT, "bench/results/placement_bench-*.csv"))
    if benches:
        rows = sorted(csv.DictReader(open(max(benches))), key=lambda r: int(r["hosts"]))
        n[:] = [int(r["hosts"]) for r in rows]
        kinds = ["pack4", "spread4", "strict_pack4", "strict_spread4", "spread4_label", "spread4_custom", "actor"]
        fig("placement_index_decision.png", "Placement index decision (placement_bench, p99)",
            [(k, [float(r[f"{k}_us_p99"]) for r in rows]) for k in kinds], "microseconds", 100, "target p50: 100 us")


if __name__ == "__main__":
    main()
