#!/usr/bin/env bash
# Installs the build and test dependencies from Debian 12's packages (idempotent).
# Versions that matter for the wire format and the ABI are pinned.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake ninja-build ccache pkg-config git clang
  "libgrpc++-dev=1.51.*" "protobuf-compiler-grpc=1.51.*" "libprotobuf-dev=3.21.*" "protobuf-compiler=3.21.*"
  "libmsgpack-cxx-dev=4.1.*" libyaml-cpp-dev nlohmann-json3-dev libboost-dev libsqlite3-dev libssl-dev
  prometheus-cpp-dev prometheus chromium chromium-driver
  libgtest-dev libbenchmark-dev iproute2 procps etcd-server
  python3-dev python3-venv python3-pip
)
missing=()
for p in "${PKGS[@]}"; do
  name="${p%%=*}"
  dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
