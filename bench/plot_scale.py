#!/usr/bin/env python3
"""Growth plots of a metric against cluster size: bench/plot_scale.py INPUT OUTDIR [options]

INPUT is a CSV with a header row, or JSON (a list of objects, or {"rows": [...]}), one record per
measurement. One column is the x axis (default `nodes`); every other numeric column is a metric
and gets its own PNG in OUTDIR (OUTDIR/<metric>.png), one line per series when --series names a
column (e.g. `runtime` with values torus/ray). Repeated x values within a series are drawn as
their median with a min-max band. Example:

  nodes,runtime,head_rss_mib,head_cpu_pct,register_ms
  1,torus,12.5,0.4,3.1
  64,torus,30.2,2.0,4.0

  bench/plot_scale.py scale.csv bench/results/scale-plots --series runtime --logx

matplotlib comes from the private venv .venv-ray (created by bench/compare_ray); when this script
runs under another interpreter without matplotlib, it re-runs itself under the venv's python,
installing matplotlib there first if needed.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(REPO, ".venv-ray")


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        subprocess.run([py, "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
        return
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        subprocess.run([py, "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def load(path):
    if path.endswith(".json"):
        with open(path) as f:
            doc = json.load(f)
        rows = doc.get("rows", doc) if isinstance(doc, dict) else doc
        return [dict(r) for r in rows]
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    try:
        return float(str(v).strip())
    except (TypeError, ValueError):
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("input", help="CSV or JSON file of (nodes, metric...) records")
    p.add_argument("outdir", help="directory for the PNGs")
    p.add_argument("--x", default="nodes", help="column of the x axis (default nodes)")
    p.add_argument("--series", default="", help="column whose values split the lines")
    p.add_argument("--metrics", default="", help="comma-separated metric columns (default all numeric)")
    p.add_argument("--logx", action="store_true")
    p.add_argument("--logy", action="store_true")
    p.add_argument("--title", default="", help="prefix of every plot title")
    a = p.parse_args()
    ensure_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = load(a.input)
    if not rows:
        sys.exit("no records in " + a.input)
    skip = {a.x, a.series}
    if a.metrics:
        metrics = a.metrics.split(",")
    else:
        metrics = [k for k in rows[0] if k not in skip and any(number(r.get(k)) is not None for r in rows)]
    os.makedirs(a.outdir, exist_ok=True)
    written = []
    for metric in metrics:
        groups = {}
        for r in rows:
            x, y = number(r.get(a.x)), number(r.get(metric))
            if x is None or y is None:
                continue
            groups.setdefault(str(r.get(a.series, "")) if a.series else metric, {}).setdefault(x, []).append(y)
        if not groups:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, pts in sorted(groups.items()):
            xs = sorted(pts)
            med = [statistics.median(pts[x]) for x in xs]
            ax.plot(xs, med, marker="o", label=name)
            if any(len(pts[x]) > 1 for x in xs):
                ax.fill_between(xs, [min(pts[x]) for x in xs], [max(pts[x]) for x in xs], alpha=0.2)
        ax.set_xlabel(a.x)
        ax.set_ylabel(metric)
        ax.set_title((a.title + ": " if a.title else "") + metric + " vs " + a.x)
        if a.logx:
            ax.set_xscale("log", base=2)
        if a.logy:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if a.series:
            ax.legend()
        fig.tight_layout()
        out = os.path.join(a.outdir, metric.replace("/", "_") + ".png")
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)
    for w in written:
        print(w)
    if not written:
        sys.exit("no numeric metric columns to plot")


if __name__ == "__main__":
    main()
