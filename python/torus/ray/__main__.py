"""`python -m torus.ray SCRIPT [ARGS...]`: runs SCRIPT as __main__ with `import ray` -> Torus.

The shim is also installed in every worker the program starts (the worker command carries it),
so `import ray` inside remote functions resolves to Torus too.
"""
import os
import runpy
import sys


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m torus.ray SCRIPT [ARGS...]   (or -m MODULE [ARGS...])",
              file=sys.stderr)
        return 2
    from torus._private import shim
    os.environ["TORUS_RAY_SHIM"] = "1"
    shim.install()
    if sys.argv[1] == "-m":
        if len(sys.argv) < 3:
            print("usage: python -m torus.ray -m MODULE [ARGS...]", file=sys.stderr)
            return 2
        mod = sys.argv[2]
        sys.argv = [mod] + sys.argv[3:]
        runpy.run_module(mod, run_name="__main__", alter_sys=True)
        return 0
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    # As `python SCRIPT` does: the script's directory first on the import path.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
