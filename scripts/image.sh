#!/usr/bin/env bash
# The Torus container image for KubeRay pods (docs/kuberay.md), from Debian's packages and this
# repository alone (no container registry is used):
#  - a Debian 12 minbase root filesystem made by mmdebstrap from this machine's apt sources, with
#    the shared libraries Torus links (ldd of the wheel's binaries, mapped to their packages by
#    dpkg -S), bash, wget, ca-certificates, python3 and python3-pip;
#  - this repository's wheel (`pip wheel .`: the torus command and library, the Python package,
#    <prefix>/lib/torus/ray-compat/ray) and its pinned dependencies (pyproject.toml), installed
#    under /usr/local by the image's own pip;
#  - PATH with /usr/local/lib/torus/ray-compat first, so the pods' `ray start ...`,
#    `ray health-check` and `ray stop` are Torus's.
# Writes OUT/rootfs.tar and OUT/oci, an OCI image layout tagged torus:<version>
# (scripts/oci_layout.py); OUT defaults to build-image. Runs as root (mmdebstrap chroots).
#   scripts/image.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-build-image}")"
mkdir -p "$out"
SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
if ! command -v mmdebstrap >/dev/null; then
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq mmdebstrap >/dev/null
fi

# 1. The wheel: built with the test environment's pinned build requirements, in its CMake tree
# (build-python/), so nothing is compiled that scripts/python_env.sh compiled already.
py=$(scripts/python_env.sh .venv-py)
wheels="$out/wheels"
rm -rf "$wheels" && mkdir -p "$wheels"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
CXX="${CXX:-c++}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  --config-settings=cmake.define.TORUS_WERROR=ON -w "$wheels" . >&2
mapfile -t pins < <("$py" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
"$py" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$wheels" "${pins[@]}" >&2
wheel=$(ls "$wheels"/torus-*.whl)
version=$(basename "$wheel" | cut -d- -f2)

# 2. The Debian packages of the libraries the wheel's binaries link.
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
"$py" -m zipfile -e "$wheel" "$unpacked"
libs=$(find "$unpacked" -type f \( -name '*.so*' -o -path '*/_bin/*' \) -exec ldd {} + 2>/dev/null |
  awk '/=> \//{print $3}' | grep -v "$unpacked" | sort -u | xargs -r -n1 readlink -f | sort -u)
pkgs=$(for l in $libs; do dpkg -S "$l" 2>/dev/null || dpkg -S "${l#/usr}" 2>/dev/null || true; done |
  cut -d: -f1 | sort -u | paste -sd, -)
[ -n "$pkgs" ] || { echo "image: no Debian package found for the libraries Torus links" >&2; exit 1; }
echo "image: torus $version; runtime packages: $pkgs" >&2

# 3. The root filesystem, with the wheel installed by the image's pip.
mmdebstrap --quiet --variant=minbase \
  --include="$pkgs,bash,wget,ca-certificates,python3,python3-pip" \
  --customize-hook="copy-in $wheels /tmp" \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin python3 -m pip install -q --root-user-action=ignore --no-index --find-links /tmp/wheels --break-system-packages --no-cache-dir --no-warn-script-location torus' \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  --customize-hook='chroot "$1" /usr/local/lib/torus/ray-compat/ray --help >/dev/null 2>&1 || { echo "image: the ray entry point does not run in the image" >&2; exit 1; }' \
  bookworm "$out/rootfs.tar"

# 4. The OCI image layout.
python3 scripts/oci_layout.py "$out/rootfs.tar" "$out/oci" --ref "torus:$version" \
  --env "PATH=/usr/local/lib/torus/ray-compat:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --env "LANG=C.UTF-8" --cmd /bin/bash
