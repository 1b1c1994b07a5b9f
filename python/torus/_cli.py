"""The `torus` command of the Python package: runs the C++ binary installed next to it."""
import os
import sys


def main() -> None:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "torus")
    if not os.access(exe, os.X_OK):
        sys.exit(f"torus: the torus binary is missing at {exe}; reinstall the package")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
