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
                    {{"pip": ["requests"]}},
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
    assert "REFUSED NotImplementedError" in out and "['pip']" in out, out
    assert "s3://" in out, out
    assert "REFUSED TypeError runtime_env['py_modules'] must be a list" in out, out
    assert "STILL 1" in out, out
