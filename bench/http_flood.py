#!/usr/bin/env python3
"""Hostile clients against a real head's HTTP ports (issue 41, docs/http.md).

Starts a head (`torus start --head`) with its dashboard port and its node's agent port, then for
each port opens --idle connections that send nothing and --slow connections that send a request
head one byte per second and never finish it, spread over --sources loopback addresses (127.0.0.x,
so that the per-client limit is not what decides), and for --seconds measures, every 0.25 s on
fresh connections, the health probe (gcs_healthz / local_raylet_healthz) and an authenticated
request (/api/version / /metrics). Prints per port: how many hostile connections the server still
held at the end, the probes' and requests' median/p99/max latency and failures (an answer later
than 1 s counts as failed), and the head process's threads and RSS before and during the flood.
Usage: bench/http_flood.py [--idle 2000] [--slow 2000] [--sources 16] [--seconds 20]
                           [--torus build/torus]"""
import argparse
import os
import re
import resource
import select
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, path, token=None, timeout=5.0):
    """Seconds until a whole answer came back on a fresh connection, or None on failure."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        if not data.startswith(b"HTTP/1.1 200"):
            return None
        return time.perf_counter() - t0
    except OSError:
        return None


def open_hostile(port, n, sources, slow):
    socks, failed = [], 0
    for i in range(n):
        s = socket.socket()
        s.bind((f"127.0.0.{2 + i % sources}", 0))
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            failed += 1
            if failed >= 20:  # the server stopped accepting
                break
            continue
        if slow:
            s.send(b"GET /api/version HTTP/1.1\r\nX-Slow: ")
        socks.append(s)
    return socks


def still_open(socks):
    """How many of `socks` the server has not closed."""
    alive = 0
    for s in socks:
        p = select.poll()
        p.register(s, select.POLLIN)
        if not p.poll(0):  # nothing to read: no 408, no close
            alive += 1
    return alive


def proc_status(pid):
    text = Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"Threads:\s+(\d+)", text).group(1))
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024
    return threads, rss


def daemon_pid(kind, session):
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(cmd) > 1 and cmd[1] == kind.encode() and session.encode() in b" ".join(cmd):
            return int(d.name)
    return None


def summary(lat):
    ok = sorted(x for x in lat if x is not None and x <= 1.0)
    failed = len(lat) - len(ok)
    if not ok:
        return f"all {len(lat)} failed"
    p99 = ok[min(len(ok) - 1, int(len(ok) * 0.99))]
    return (f"median {statistics.median(ok) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
            f"max {ok[-1] * 1e3:.1f} ms, {failed}/{len(lat)} failed or > 1 s")


def flood(name, port, probe, api, token, pid, a):
    idle = open_hostile(port, a.idle, a.sources, slow=False)
    slow = open_hostile(port, a.slow, a.sources, slow=True)
    stop = threading.Event()

    def trickle():
        while not stop.is_set():
            for s in slow:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            stop.wait(1.0)
    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    probes, apis, peak = [], [], (0, 0.0)
    t0 = time.time()
    t_end = t0 + a.seconds
    held_early = None
    while time.time() < t_end:
        if held_early is None and time.time() > t0 + 3:
            held_early = (still_open(idle), still_open(slow))
        probes.append(request(port, probe))
        apis.append(request(port, api, token))
        th, rss = proc_status(pid)
        peak = (max(peak[0], th), max(peak[1], rss))
        time.sleep(0.25)
    held_idle, held_slow = still_open(idle), still_open(slow)
    stop.set()
    t.join()
    for s in idle + slow:
        s.close()
    print(f"{name} (port {port}): opened {len(idle)} idle + {len(slow)} slow over {a.sources} "
          f"addresses; held after 3 s: {held_early[0]} idle, {held_early[1]} slow; at the end "
          f"({a.seconds:.0f} s): {held_idle} idle, {held_slow} slow")
    print(f"  probe {probe}: {summary(probes)}")
    print(f"  token {api}: {summary(apis)}")
    print(f"  its process (pid {pid}) during the flood: peak {peak[0]} threads, peak RSS {peak[1]:.0f} MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--sources", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--torus", default=str(REPO / "build" / "torus"))
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    root = tempfile.mkdtemp(prefix="torus-http-flood-")
    env = dict(os.environ, TORUS_TMPDIR=root, TORUS_TPU_METADATA_URL="off")
    dash, agent = free_port(), free_port()
    out = subprocess.run([a.torus, "start", "--head", "--port", str(free_port()), "--dashboard-port", str(dash),
                          "--dashboard-agent-listen-port", str(agent)],
                         env=env, check=True, capture_output=True, text=True).stdout
    session = re.search(r"session: (\S+)", out).group(1)
    try:
        token = (Path(session) / "token").read_text().strip()
        pids = {k: daemon_pid(k, session) for k in ("head", "node")}
        for k, pid in pids.items():
            th, rss = proc_status(pid)
            print(f"{k} pid {pid} before the floods: {th} threads, RSS {rss:.0f} MiB")
        flood("dashboard (head)", dash, "/api/gcs_healthz", "/api/version", token, pids["head"], a)
        flood("node agent", agent, "/api/local_raylet_healthz", "/metrics", token, pids["node"], a)
        for k, pid in pids.items():
            th, rss = proc_status(pid)
            print(f"{k} pid {pid} after: {th} threads, RSS {rss:.0f} MiB")
    finally:
        subprocess.run([a.torus, "stop"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
