"""`python -m torus._private.worker_main`: a Python worker process started by a node.

Serves tasks through `_core.run_worker(executor.execute)` until the node tells it to exit.
The node starts it with the command the driver gave `_core.init` (worker._private.worker
_command): the driver's interpreter, its import path, and the `ray` shim when the driver ran
under `python -m torus.ray`.
"""
import os
import sys


def main() -> None:
    os.environ.setdefault("TORUS_WORKER_MODE", "1")
    if os.environ.get("TORUS_RAY_SHIM") == "1":
        from torus._private import shim
        shim.install()
    from torus import _core
    from torus._private import executor
    _core.run_worker(executor.execute, executor.cancel_async)
    sys.exit(0)


if __name__ == "__main__":
    main()
