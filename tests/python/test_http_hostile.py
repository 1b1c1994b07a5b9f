"""A real head's HTTP ports against clients that hold connections without sending a request, or
trickle one byte by byte (issue 41): the KubeRay probes and token requests still answer, and the
daemons stay up. Before the fix a few hundred such connections (no token needed) held every
server thread, and the probes timed out."""
import resource
import socket
from pathlib import Path

import pytest

from helpers import Cluster, free_port

IDLE = 1000
SLOW = 300


def _get(port, path, token=None, timeout=5.0):
    """The status of GET `path` on a fresh connection ('' when nothing came back in time)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n".encode())
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except socket.timeout:
            pass
    return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else ""


def _hostile(port, n, slow):
    socks = []
    for i in range(n):
        s = socket.socket()
        s.bind((f"127.0.0.{2 + i % 8}", 0))  # several client addresses: no per-client limit decides
        s.settimeout(2.0)
        s.connect(("127.0.0.1", port))
        if slow:
            s.send(b"GET /api/version HTTP/1.1\r\nX-Slow: ")
        socks.append(s)
    return socks


@pytest.fixture
def head():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    c = Cluster()
    dash, agent = free_port(), free_port()
    c.start_head("--dashboard-port", str(dash), "--dashboard-agent-listen-port", str(agent))
    token = (Path(c.session) / "token").read_text().strip()
    try:
        yield dash, agent, token
    finally:
        c.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_and_trickling_connections_do_not_block_probes_or_the_jobs_api(head):
    dash, agent, token = head
    socks = []
    try:
        for port in (dash, agent):
            socks += _hostile(port, IDLE, slow=False)
            socks += _hostile(port, SLOW, slow=True)
        for rnd in range(3):
            for s in socks[-SLOW:]:
                s.send(b"a")  # the slow ones keep trickling
            assert _get(dash, "/api/gcs_healthz") == "200", f"round {rnd}"
            assert _get(agent, "/api/local_raylet_healthz") == "200", f"round {rnd}"
            assert _get(dash, "/api/version", token) == "200", f"round {rnd}"
            assert _get(dash, "/api/jobs/", token) == "200", f"round {rnd}"
            assert _get(agent, "/metrics", token) == "200", f"round {rnd}"
            assert _get(dash, "/api/version") == "401"  # the token still holds
    finally:
        for s in socks:
            s.close()
    assert _get(dash, "/api/gcs_healthz") == "200"
