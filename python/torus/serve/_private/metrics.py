"""Serve's metrics under Ray's names: counted where requests happen (proxies, replicas), sent
to the controller with its pings, rendered by the controller as Prometheus text into the head's
KV store (`serve`/`metrics`), which the head's `/metrics` appends.

A process keeps one `Registry`; `snapshot()` is plain data (counters and gauges: value per label
set; histograms: bucket counts, sum, count). The controller keeps each source's last snapshot
(a source that is gone drops out) and renders the sum. Threading: a registry's methods may be
called from any thread (one lock).
"""
from __future__ import annotations

import bisect
import threading
from typing import Dict, Iterable, List, Tuple

# Ray Serve's latency buckets (ms).
LATENCY_BUCKETS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000, 5000, 10000,
                      60000, 120000, 300000, 600000]

HELP = {
    "ray_serve_num_http_requests_total": ("counter", "HTTP requests the proxies answered."),
    "ray_serve_num_http_error_requests_total": ("counter",
                                                "HTTP requests answered with an error status."),
    "ray_serve_http_request_latency_ms": ("histogram", "HTTP request latency at the proxy (ms)."),
    "ray_serve_num_ongoing_http_requests": ("gauge", "HTTP requests a proxy is answering now."),
    "ray_serve_deployment_request_counter_total": ("counter",
                                                   "Requests a replica has run."),
    "ray_serve_deployment_error_counter_total": ("counter",
                                                 "Requests that raised in a replica."),
    "ray_serve_deployment_processing_latency_ms": ("histogram",
                                                   "Time a replica took for a request (ms)."),
    "ray_serve_replica_processing_queries": ("gauge", "Requests a replica is running now."),
    "ray_serve_deployment_queued_queries": ("gauge",
                                            "Requests waiting in a router for a replica."),
    "ray_serve_deployment_replica_healthy": ("gauge", "1 for a running, healthy replica."),
    "ray_serve_autoscaling_target_replicas": ("gauge", "A deployment's target replica count."),
}


class Registry:
    def __init__(self):
        self._lock = threading.Lock()
        self._counters: Dict[Tuple[str, Tuple], float] = {}
        self._gauges: Dict[Tuple[str, Tuple], float] = {}
        self._hists: Dict[Tuple[str, Tuple], List] = {}

    def inc(self, name: str, labels: Dict[str, str], v: float = 1.0) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + v

    def set(self, name: str, labels: Dict[str, str], v: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._gauges[key] = v

    def observe(self, name: str, labels: Dict[str, str], ms: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        i = bisect.bisect_left(LATENCY_BUCKETS_MS, ms)
        with self._lock:
            h = self._hists.get(key)
            if h is None:
                h = self._hists[key] = [[0] * (len(LATENCY_BUCKETS_MS) + 1), 0.0, 0]
            h[0][i] += 1
            h[1] += ms
            h[2] += 1

    def snapshot(self) -> Dict[str, list]:
        with self._lock:
            return {"c": [(k[0], k[1], v) for k, v in self._counters.items()],
                    "g": [(k[0], k[1], v) for k, v in self._gauges.items()],
                    "h": [(k[0], k[1], list(h[0]), h[1], h[2]) for k, h in self._hists.items()]}


REGISTRY = Registry()


def _labels(lbl: Tuple) -> str:
    def esc(v: str) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return ",".join(f'{k}="{esc(v)}"' for k, v in lbl)


def render(snapshots: Iterable[Dict[str, list]], extra_gauges: Iterable[Tuple] = ()) -> str:
    """Prometheus text of the sum of `snapshots` (plus the controller's own gauges)."""
    counters: Dict[Tuple, float] = {}
    gauges: Dict[Tuple, float] = {}
    hists: Dict[Tuple, List] = {}
    for s in snapshots:
        for name, lbl, v in s.get("c", ()):
            counters[(name, tuple(map(tuple, lbl)))] = counters.get(
                (name, tuple(map(tuple, lbl))), 0.0) + v
        for name, lbl, v in s.get("g", ()):
            gauges[(name, tuple(map(tuple, lbl)))] = gauges.get(
                (name, tuple(map(tuple, lbl))), 0.0) + v
        for name, lbl, buckets, total, count in s.get("h", ()):
            key = (name, tuple(map(tuple, lbl)))
            h = hists.setdefault(key, [[0] * (len(LATENCY_BUCKETS_MS) + 1), 0.0, 0])
            for i, b in enumerate(buckets):
                h[0][i] += b
            h[1] += total
            h[2] += count
    for name, lbl, v in extra_gauges:
        gauges[(name, tuple(sorted(lbl.items())))] = v
    by_name: Dict[str, List[str]] = {}
    for (name, lbl), v in sorted(counters.items()):
        by_name.setdefault(name, []).append(f"{name}{{{_labels(lbl)}}} {v:g}")
    for (name, lbl), v in sorted(gauges.items()):
        by_name.setdefault(name, []).append(f"{name}{{{_labels(lbl)}}} {v:g}")
    for (name, lbl), (buckets, total, count) in sorted(hists.items()):
        lines = by_name.setdefault(name, [])
        cum = 0
        base = _labels(lbl)
        sep = "," if base else ""
        for le, b in zip(LATENCY_BUCKETS_MS + ["+Inf"], buckets):
            cum += b
            lines.append(f'{name}_bucket{{{base}{sep}le="{le}"}} {cum}')
        lines.append(f"{name}_sum{{{base}}} {total:g}")
        lines.append(f"{name}_count{{{base}}} {count}")
    out = []
    for name in sorted(by_name):
        kind, help_ = HELP.get(name, ("untyped", name))
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(by_name[name])
    return "\n".join(out) + ("\n" if out else "")
