#!/usr/bin/env bash
# Installs CPU JAX from PyPI at a pinned version into a venv (created when missing; default
# .venv-jax) for examples/jax_allreduce and examples/python, and prints the venv's python.
# Idempotent: a venv that has the pinned version is left as it is.
#   scripts/jax_venv.sh [VENV_DIR]      (default: <repo>/.venv-jax)
set -euo pipefail
cd "$(dirname "$0")/.."
JAX_VERSION=0.4.38   # jax.distributed on CPU with gloo collectives; wheels for Python 3.10-3.13
venv="${1:-$PWD/.venv-jax}"
py=python3
if ! $py -c 'import venv, ensurepip' 2>/dev/null; then
  # Debian splits venv/ensurepip out of python3.
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >&2 && apt-get install -y -qq python3-venv >&2
  else
    sudo apt-get update -qq >&2 && sudo apt-get install -y -qq python3-venv >&2
  fi
fi
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import jax, sys; sys.exit(jax.__version__ != '$JAX_VERSION')" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
[ -x "$venv/bin/python" ] || $py -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" >&2
"$venv/bin/python" -c "import jax; print('jax', jax.__version__, jax.devices())" >&2
echo "$venv/bin/python"
