"""The head's state on a disk that fails (issue 41 #5; docs/fault_tolerance.md): an emptied
state file is refused as damaged and left as it is."""
import os
import signal
import time
from pathlib import Path

from helpers import Cluster, free_port


def _pid(session: str, name: str) -> int:
    return int((Path(session) / "pids" / f"{name}.pid").read_text().split()[0])


def _kill(pid: int, sig=signal.SIGKILL):
    os.kill(pid, sig)
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not die")


def _head_with_state(c: Cluster):
    """A head of a new session with a durable record (a finished job); killed with -9, so its
    write-ahead log is left as a crash leaves it. Returns (port, session)."""
    port = str(free_port())
    c.torus("start", "--head", "--port", port, "--num-cpus", "1")
    session = str((Path(c.root) / "session_latest").resolve())
    c.torus("job", "submit", "--", "true")
    _kill(_pid(session, "head"))
    return port, session


def _snapshot(session: str) -> dict:
    """The session's records and state files, byte for byte (logs and pid files excluded)."""
    out = {}
    for f in sorted(Path(session).iterdir()):
        if f.is_file() and f.name != "head_state.sqlite3-shm":
            out[f.name] = f.read_bytes()
    return out


def test_an_empty_state_file_is_refused_as_damaged_and_nothing_on_disk_changes():
    c = Cluster()
    try:
        port, session = _head_with_state(c)
        state = Path(session) / "head_state.sqlite3"
        wal = Path(str(state) + "-wal")
        assert wal.stat().st_size > 0, "a head killed with -9 leaves its write-ahead log"
        os.truncate(state, 0)
        before = _snapshot(session)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1", check=False)
        assert p.returncode != 0, p.stdout
        assert f"the head's state {state} is damaged (the file is empty" in p.stderr, p.stderr
        assert "refusing to load it" in p.stderr and "--new-session" in p.stderr, p.stderr
        # Refused whole: the empty file, its log, the token and head_address are as they were,
        # and the session is still the latest.
        assert _snapshot(session) == before
        assert wal.stat().st_size > 0
        assert str((Path(c.root) / "session_latest").resolve()) == session
        # Asked explicitly, a new session starts; the old one is left as it is.
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1", "--new-session")
        assert "abandoning session " + session in p.stderr and "damaged" in p.stderr, p.stderr
        assert "started" in p.stdout and session not in p.stdout, p.stdout
        assert _snapshot(session) == before
    finally:
        c.torus("stop", check=False)
