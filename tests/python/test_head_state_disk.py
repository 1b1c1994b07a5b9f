"""The head's state and the session's records on a disk that fails (issue 41 #5, #6;
docs/fault_tolerance.md): an emptied state file is refused as damaged and left as it is, and a
full disk is named by the `torus start` that hit it while the session stays resumable."""
import errno
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from helpers import Cluster, clean_env, free_port


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
        _kill(_pid(session, "node-head"), signal.SIGTERM)  # the whole session is down
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


def _mount_small_disk(where: Path) -> None:
    """A 16 MiB tmpfs at `where`: a disk that can be filled without filling the machine's."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a small tmpfs, which needs root to mount")
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (no CAP_SYS_ADMIN?): {r.stderr.strip()}")


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"x" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    return filler


def test_a_full_disk_is_named_and_the_session_stays_resumable(tmp_path):
    disk = tmp_path / "disk"
    _mount_small_disk(disk)
    c = Cluster()
    c.root = str(disk / "root")
    os.mkdir(c.root, 0o700)
    c.env = clean_env(TORUS_TMPDIR=c.root)
    reader = None
    try:
        port, session = _head_with_state(c)
        _kill(_pid(session, "node-head"), signal.SIGTERM)
        os.remove(Path(session) / "pids" / "node-head.pid")
        head_address = (Path(session) / "head_address").read_text()
        assert head_address.endswith(":" + port)
        # A reader keeps the state's log and index open (the command's own look at the state
        # would otherwise fold the log in on closing and free their pages).
        reader = sqlite3.connect(Path(session) / "head_state.sqlite3")
        reader.execute("SELECT count(*) FROM records").fetchone()
        os.remove(Path(session) / "pids" / "head.pid")  # stale: the head was killed
        filler = _fill(disk)
        # No room at all: the command cannot even record its new head's pid.
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1", check=False, timeout=120)
        assert p.returncode != 0, p.stdout
        assert "no space left on device writing " + session + "/pids/head.pid" in p.stderr, p.stderr
        assert (Path(session) / "head_address").read_text() == head_address
        # Room for the command's pid file, not for everything after it: whichever write meets the
        # full disk first (the head's own records, whose error is reported back to the command
        # that started the head, or the head node's pid file; where SQLite's pages land decides),
        # the command names the full disk.
        os.truncate(filler, filler.stat().st_size - 4096)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1", check=False, timeout=120)
        assert p.returncode != 0, p.stdout
        assert ("the head failed to start on port " + port + ": no space left on device writing " + session
                in p.stderr or "cannot start node-head: no space left on device writing " + session
                in p.stderr), p.stderr
        assert "did not come up" not in p.stderr, p.stderr
        # The session's records still name its head: it can be resumed once there is room.
        assert (Path(session) / "head_address").read_text() == head_address
        assert not any(Path(session, "pids").iterdir()), list(Path(session, "pids").iterdir())
        os.remove(filler)
        reader.close()
        reader = None
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "1")
        assert "resuming session " + session in p.stderr and "1 job" in p.stderr, p.stderr
        assert "Torus head resumed at 127.0.0.1:" + port in p.stdout, p.stdout
        assert "SUCCEEDED" in c.torus("job", "list").stdout
    finally:
        if reader is not None:
            reader.close()
        c.torus("stop", check=False)
        subprocess.run(["umount", "-l", str(disk)], check=False)
