"""Ray Data on Torus: each program in data_progs/ is an unchanged Ray Data program (`import ray`,
`ray.data...`), written from Ray 2.60's documentation, that asserts what the docs promise and
ends by printing `OK`. Run through `python -m torus.ray`, together they cover issue #43: the
in-memory and file sources (Parquet with projection, filters and Hive partitions, CSV, JSON,
text, NumPy, binary, images; local paths and file://), a missing path's error, the transforms
(map_batches in every batch format, actor pools of fixed and autoscaling size, row and column
transforms, shuffles, sorts, groupby aggregations, union, zip), consumption (iter_batches and
its options, split, streaming_split consumed by concurrent actors, materialize, stats), sinks
read back, DataContext knobs, a UDF's exception, retried tasks, a 1.5 GiB pipeline streaming
through a 256 MiB object store without spilling, per-operator progress, iter_jax_batches, and
JaxTrainer ingest through get_dataset_shard, on a plain cluster and on a simulated v6e slice.

The same programs run on real Ray 2.60 to check the programs themselves:
    DATA_TESTS_PYTHON=/work/main/.venv-ray/bin/python python -m pytest tests/python/test_data.py
Programs that Ray 2.60 itself cannot pass are listed in RAY_CANNOT with the measured reason, and
skipped in that mode only; programs needing JAX are skipped when that interpreter has none.
.venv-ray has none; a venv whose .pth adds .venv-ray's and .venv-jax's site-packages runs them:
    python3.11 -m venv /tmp/venv-rayjax
    printf '%s\n' $PWD/.venv-ray/lib/python3.11/site-packages \
        $PWD/.venv-jax/lib/python3.11/site-packages \
        > /tmp/venv-rayjax/lib/python3.11/site-packages/zz_shared.pth
    DATA_TESTS_PYTHON=/tmp/venv-rayjax/bin/python python -m pytest tests/python/test_data.py
"""
import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import clean_env, cluster_up, one_v6e_slice_manifest

PROGS_DIR = Path(__file__).resolve().parent / "data_progs"
# Programs that need a `torus up` v6e slice: run by test_tpu_slice_ingest only.
SLICE_PROGS = {"tpu_slice_ingest.py"}
PROGS = sorted(p.name for p in PROGS_DIR.glob("*.py") if p.name not in SLICE_PROGS)
RAY_PYTHON = os.environ.get("DATA_TESTS_PYTHON")
# Ray starts slowly here (and JaxTrainer more so); Torus must fit the suite's budget.
TIMEOUT_S = 300 if RAY_PYTHON else 120

# Programs real Ray 2.60 fails, with the reason measured on it: what Torus should still do.
# Programs Torus fails today, with the reason: each runs and must fail (strict xfail), so a
# fix shows up as an unexpected pass and the entry goes.
TORUS_CANNOT = {}

RAY_CANNOT = {
    "read_parquet_glob.py":
        "Ray 2.60's read_parquet does not expand glob patterns: read_parquet('dir/*.parquet') "
        "raises FileNotFoundError naming the pattern (measured); issue #43 asks for globs",
}

# Programs that import jax (skipped where the interpreter has none; required in CI).
NEEDS_JAX = {"iter_jax_batches.py"}

# Text the program's output (stdout or stderr) must hold.
OUTPUT_NAMES = {"progress.py": ["MapBatches(double_it)", "MapBatches(Tagger)"]}


@functools.lru_cache(maxsize=None)
def _has_jax(python: str) -> bool:
    return subprocess.run([python, "-c", "import jax"], capture_output=True).returncode == 0


def _require_jax(python: str):
    if _has_jax(python):
        return
    if os.environ.get("CI") and not RAY_PYTHON:
        raise AssertionError("CPU JAX is missing from the test venv (scripts/test.sh installs "
                             "it with scripts/jax_venv.sh)")
    pytest.skip(f"no jax in {python}")


def _session_members(sid: int) -> list:
    """The processes in session `sid` (the program's, which it leads), wherever they were
    reparented."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def _kill_session(sid: int):
    for pid in _session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _leftovers(sid: int) -> list:
    """Whatever the program started must be gone once it has exited (the local cluster ends
    with the driver); anything still there after a grace period is described and killed.
    Ray's agents can take longer than 15 s to go on a loaded machine: a minute there."""
    deadline = time.monotonic() + (60 if RAY_PYTHON else 15)
    while _session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = []
    for pid in _session_members(sid):
        try:
            left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                        .decode(errors="replace")[:200])
        except OSError:
            pass
    _kill_session(sid)
    return left


def _run(cmd: list, env: dict, cwd, timeout: float, name: str):
    """Runs a program in its own session; returns (returncode, stdout, stderr, seconds)."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    started = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{name} did not finish in {timeout} s\nstdout:\n{out[-20000:]}\n"
                    f"stderr:\n{err[-20000:]}")
    took = time.monotonic() - started
    left = _leftovers(proc.pid)
    assert not left, f"{name} left processes running:\n" + "\n".join(left)
    return proc.returncode, out, err, took


def _check_ok(name: str, rc: int, out: str, err: str, took: float):
    lines = [line for line in out.splitlines() if line.strip()]
    report = (f"{name}: exit {rc} after {took:.1f} s\nstdout:\n{out[-20000:]}\n"
              f"stderr:\n{err[-20000:]}")
    assert rc == 0, report
    assert lines and lines[-1].strip() == "OK", report
    for text in OUTPUT_NAMES.get(name, []):
        assert text in out or text in err, f"{text!r} not in the output of {report}"


def test_programs_follow_the_conventions():
    """Every program says what it checks, uses Ray's API, shuts Ray down and ends by printing
    OK; the lists name programs that exist."""
    assert PROGS, f"no programs in {PROGS_DIR}"
    names = set(PROGS) | SLICE_PROGS
    assert set(RAY_CANNOT) <= names and NEEDS_JAX <= names and set(OUTPUT_NAMES) <= names
    assert set(TORUS_CANNOT) <= names
    for name in sorted(names):
        text = (PROGS_DIR / name).read_text()
        assert text.startswith('"""'), f"{name}: no docstring saying what it checks"
        assert re.search(r"^import ray\b", text, re.M) and "ray.data." in text, name
        assert 'print("OK")' in text and "ray.shutdown()" in text, name


def _command(prog: Path) -> list:
    if RAY_PYTHON:
        return [RAY_PYTHON, str(prog)]
    return [sys.executable, "-m", "torus.ray", str(prog)]


@pytest.mark.parametrize("name", PROGS, ids=[p[:-3] for p in PROGS])
def test_data_program(name, tmp_path):
    if RAY_PYTHON and name in RAY_CANNOT:
        pytest.skip(f"Ray 2.60 cannot: {RAY_CANNOT[name]}")
    request_xfail = TORUS_CANNOT.get(name) if not RAY_PYTHON else None
    if name in NEEDS_JAX:
        _require_jax(RAY_PYTHON or sys.executable)
    env = clean_env(PYTHONUNBUFFERED=1)
    rc, out, err, took = _run(_command(PROGS_DIR / name), env, tmp_path, TIMEOUT_S, name)
    if request_xfail:
        ok = rc == 0 and out.strip().splitlines()[-1:] == ["OK"]
        assert not ok, f"{name} passes on Torus now: remove it from TORUS_CANNOT"
        pytest.xfail(request_xfail)
    _check_ok(name, rc, out, err, took)


def test_tpu_slice_ingest(tmp_path):
    """JaxTrainer ingest on a `torus up` cluster with one simulated v6e 4x4 slice (4 hosts):
    data_progs/tpu_slice_ingest.py through `python -m torus.ray`."""
    if RAY_PYTHON:
        pytest.skip("Ray 2.60 cannot: JaxTrainer(use_tpu=True) needs real TPU hosts")
    _require_jax(sys.executable)
    name = "tpu_slice_ingest.py"
    with cluster_up(one_v6e_slice_manifest(tmp_path)) as c:
        env = c.driver_env(PYTHONUNBUFFERED=1)
        rc, out, err, took = _run(_command(PROGS_DIR / name), env, tmp_path, 300, name)
    _check_ok(name, rc, out, err, took)
