#!/usr/bin/env bash
# Runs scripts/check_sizes.py with lizard (PyPI, pinned) from a private venv, .venv-lint.
set -euo pipefail
cd "$(dirname "$0")/.."
LIZARD_VERSION=1.24.3
venv="$PWD/.venv-lint"
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('lizard') != '$LIZARD_VERSION')" 2>/dev/null; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "lizard==$LIZARD_VERSION"
fi
exec "$venv/bin/python" scripts/check_sizes.py
