"""Cross-language calls, both ways: a C++ driver (examples/xlang/main.cc) calling Python
functions and actors by name, and a Python driver calling C++ functions registered with
RAY_REMOTE (examples/xlang/cpp_funcs.cc, loaded from the job's code search path). Values cross
as msgpack, as in Ray. Needs the release build (build/example_xlang, build/xlang/)."""
import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, clean_env, run_python

BUILD = REPO / "build"
XLANG_EXE = BUILD / "example_xlang"
CPP_FUNCS = BUILD / "xlang" / "libxlang_cpp_funcs.so"


@pytest.mark.skipif(not XLANG_EXE.exists(), reason="needs the release build (build/example_xlang)")
def test_cpp_driver_calls_python_functions_and_actors(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "examples" / "xlang")
    env["TORUS_PYTHON_WORKER_COMMAND"] = json.dumps(
        [sys.executable, "-m", "torus._private.worker_main"])
    env["TORUS_TMPDIR"] = str(tmp_path)
    for v in ("TORUS_ADDRESS", "RAY_ADDRESS"):
        env.pop(v, None)
    p = subprocess.run([str(XLANG_EXE)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "python add(1, 2) = 3" in p.stdout
    assert 'python greet("torus") = hello torus' in p.stdout
    assert "then add(7) = 22" in p.stdout
    # The Python exception reaches C++ as the task's error, with its traceback text.
    assert "ValueError: raised in Python on purpose" in p.stdout


@pytest.mark.skipif(not CPP_FUNCS.exists(), reason="needs the release build (build/xlang/)")
def test_python_driver_calls_cpp_functions(tmp_path):
    p = run_python(f"""
        import ray
        from ray.job_config import JobConfig
        from ray import cross_language
        ray.init(job_config=JobConfig(code_search_path=[{str(CPP_FUNCS.parent)!r}]))
        plus = cross_language.cpp_function("Plus")
        concat = cross_language.cpp_function("Concat")
        assert ray.get(plus.remote(40, 2)) == 42
        assert ray.get(concat.remote("to", "rus")) == "torus"
        @ray.remote
        def py_side(x):
            return x + 1
        # A C++ result feeds a Python task.
        assert ray.get(py_side.remote(plus.remote(1, 1))) == 3
        print("XLANG OK")
    """, shim=True, timeout=300, env=clean_env(TORUS_TMPDIR=str(tmp_path)))
    assert "XLANG OK" in p.stdout, p.stdout + p.stderr
