"""runtime_env's code fields, with Ray's meaning (python/torus/_private/runtime_env.py):
`working_dir` (the workers run in a copy of it and import from it), `py_modules` (importable
in the workers), `excludes` and `.rayignore` (left out of the package); a task's own fields
override the job's; bad values are refused with their reason and leave the cluster working."""
import textwrap

from helpers import run_python


def test_working_dir_and_py_modules_ship_code_and_files(tmp_path):
    app = tmp_path / "app"
    (app / "sub").mkdir(parents=True)
    (app / "helper.py").write_text("VALUE = 41\n")
    (app / "data.txt").write_text("hello\n")
    (app / "sub" / "note.txt").write_text("nested\n")
    (app / "weights.bin").write_text("large\n")
    (app / "scratch").mkdir()
    (app / "scratch" / "tmp.txt").write_text("x\n")
    (app / ".rayignore").write_text("*.bin\n")
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "__init__.py").write_text("def who():\n    return 'mylib'\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "only_here.txt").write_text("other\n")
    code = textwrap.dedent(f"""
        import os, ray
        ray.init(address="local", runtime_env={{"working_dir": {str(app)!r},
                                               "py_modules": [{str(lib)!r}],
                                               "excludes": ["scratch/"]}})

        @ray.remote
        def look():
            import helper, mylib
            return (os.getcwd() != {str(app)!r}, helper.VALUE + 1, open("data.txt").read(),
                    open("sub/note.txt").read(), os.path.exists("weights.bin"),
                    os.path.exists("scratch"), mylib.who())

        @ray.remote
        class Where:
            def cwd_files(self):
                return sorted(os.listdir("."))

        @ray.remote(runtime_env={{"working_dir": {str(other)!r}}})
        def elsewhere():
            import mylib  # the job's py_modules still apply: only working_dir was overridden
            return sorted(os.listdir(".")), mylib.who()

        print("LOOK", ray.get(look.remote()))
        print("ACTOR", ray.get(Where.remote().cwd_files.remote()))
        print("TASK", ray.get(elsewhere.remote()))
        env = ray.get_runtime_context().runtime_env
        print("CTX", sorted(env), env["working_dir"].startswith("kv://"))
    """)
    out = run_python(code, shim=True, cwd=str(tmp_path)).stdout
    assert "LOOK (True, 42, 'hello\\n', 'nested\\n', False, False, 'mylib')" in out, out
    assert "ACTOR ['.rayignore', 'data.txt', 'helper.py', 'sub']" in out, out
    assert "TASK (['only_here.txt'], 'mylib')" in out, out
    assert "CTX ['py_modules', 'working_dir'] True" in out, out


def test_bad_runtime_envs_are_refused_with_their_reason_and_the_job_goes_on(tmp_path):
    code = textwrap.dedent(f"""
        import ray
        ray.init(address="local")

        @ray.remote
        def one():
            return 1

        for env in ({{"working_dir": {str(tmp_path / "missing")!r}}},
                    {{"conda": {{"dependencies": ["numpy"]}}}},
                    {{"pip": ["requests"], "uv": ["requests"]}},
                    {{"pip": {str(tmp_path / "no-requirements.txt")!r}}},
                    {{"working_dir": "s3://bucket/code.zip"}},
                    {{"py_modules": "notalist"}}):
            try:
                one.options(runtime_env=env).remote()
                print("ACCEPTED", env)
            except (ValueError, TypeError, NotImplementedError) as e:
                print("REFUSED", type(e).__name__, e)
        print("STILL", ray.get(one.remote()))
    """)
    out = run_python(code, shim=True).stdout
    assert "ACCEPTED" not in out, out
    assert "REFUSED ValueError runtime_env['working_dir']: " in out and "does not exist" in out
    assert "REFUSED NotImplementedError" in out and "['conda']" in out, out
    assert "REFUSED ValueError runtime_env: 'pip' and 'uv' cannot both be given" in out, out
    assert "is not a requirements file" in out, out
    assert "s3://" in out, out
    assert "REFUSED TypeError runtime_env['py_modules'] must be a list" in out, out
    assert "STILL 1" in out, out


def _wheel(where, name="torus_pip_probe", version="0.1", value=7):
    """A minimal pure-Python wheel, built here (no network, no build backend)."""
    import base64
    import hashlib
    import zipfile
    files = {f"{name}/__init__.py": f"VALUE = {value}\n",
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(
        record + [f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return path


def test_pip_installs_once_per_node_for_the_work_that_asks_and_a_failure_names_pip(tmp_path):
    wheel = _wheel(tmp_path)
    code = textwrap.dedent(f"""
        import ray
        from ray.exceptions import RuntimeEnvSetupError
        ray.init(address="local")
        env = {{"pip": {{"packages": [{str(wheel)!r}], "pip_install_options": ["--no-index"]}}}}

        @ray.remote
        def probe():
            import torus_pip_probe
            return torus_pip_probe.VALUE, torus_pip_probe.__file__

        @ray.remote
        def plain():
            try:
                import torus_pip_probe  # noqa: F401
                return "importable"
            except ImportError:
                return "not importable"

        got = ray.get([probe.options(runtime_env=env).remote() for _ in range(3)])
        paths = {{p for _, p in got}}
        # One install for the node, whichever workers ran them.
        print("PIP", [v for v, _ in got], len(paths), "runtime_resources/pip/" in paths.pop())
        print("PLAIN", ray.get(plain.remote()))
        bad = {{"pip": {{"packages": [{str(tmp_path / "missing-0.1-py3-none-any.whl")!r}],
                        "pip_install_options": ["--no-index"]}}}}
        try:
            ray.get(probe.options(runtime_env=bad).remote())
        except RuntimeEnvSetupError as e:
            print("FAILED", "installing" in str(e), "missing-0.1" in str(e))
        print("CTX", sorted(ray.get_runtime_context().runtime_env))
    """)
    out = run_python(code, shim=True, cwd=str(tmp_path)).stdout
    assert "PIP [7, 7, 7] 1 True" in out, out
    assert "CTX []" in out, out  # the driver's job has no runtime_env of its own
    assert "PLAIN not importable" in out, out
    assert "FAILED True True" in out, out
