#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, checks the layers' includes
# and the size budget, builds the release configuration; then, in the background on idle CPU,
# builds the ASan+UBSan and ThreadSanitizer configurations and checks the lock annotations with
# clang (tsa.sh), while the foreground runs every unit and multi-process test of the release
# build, installs the Python package (`pip install .`, scripts/python_env.sh) into .venv-py and
# the pinned Ray client into .venv-ray, runs the pytest suite (tests/python) against real
# clusters (Ray's own `ray job` CLI and SDK among the clients), the KubeRay conformance test
# (KubeRay's own operator code makes the pods; tests/kuberay_test.sh), and builds the container
# image (scripts/image.sh) and runs a head pod in it (tests/image_test.sh). Last, the unit tests
# under both sanitizers, the object and borrowing multi-process tests under ASan+UBSan, and the
# task, object, borrowing and actor multi-process tests under TSan (any TSan report fails the
# stage; docs/threads.md says what is left out and why, scripts/tsan.supp what is ignored).
# The tests mostly wait on their clusters, so the background compiles use the CPU they leave
# (SCHED_IDLE: scripts/background_builds.sh).
# Every stage prints its duration when the suite ends (also on failure), and the total.
set -euo pipefail
cd "$(dirname "$0")/.."

timings=()
start_all=$(date +%s)
bg_pid=""
report() {
  local rc=$? t
  # The background builds' session (below): every compiler it started ends with the suite.
  [ -z "$bg_pid" ] || [ ! -s "$bg/pgid" ] || kill -- "-$(cat "$bg/pgid")" 2>/dev/null || true
  echo
  echo "== stage durations"
  for t in "${timings[@]}"; do echo "$t"; done
  t=$(( $(date +%s) - start_all ))
  printf '  %-62s %3dm%02ds\n' "total" $((t / 60)) $((t % 60))
  exit "$rc"
}
trap report EXIT
# stage NAME COMMAND...: runs COMMAND, records how long it took (also when it fails).
stage() {
  local name=$1 t0 rc=0 t
  shift
  echo "== $name"
  t0=$(date +%s)
  "$@" || rc=$?
  t=$(( $(date +%s) - t0 ))
  timings+=("$(printf '  %-62s %3dm%02ds%s' "$name" $((t / 60)) $((t % 60)) "$([ "$rc" = 0 ] || echo "  FAILED")")")
  return "$rc"
}

stage "dependencies" scripts/deps.sh
stage "layers (#include order)" scripts/check_layers.sh
stage "sizes (files <= 800 lines, functions <= 80)" scripts/check_sizes.sh
stage "build release" scripts/build.sh release

# ---- in the background: the sanitizer builds and the lock analysis (scripts/background_builds.sh:
# a session of its own at the lowest priority; each job's name, seconds, status and log go to
# $bg/done, read by wait_background).
bg=$(mktemp -d /tmp/torus-bg.XXXXXX)
touch "$bg/done"
setsid -w scripts/background_builds.sh "$bg" &
bg_pid=$!
# Waits for the background jobs; each becomes a line of the stage durations. Fails when any did.
wait_background() {
  local name secs rc log failed=0
  wait "$bg_pid" || true
  bg_pid=""
  while IFS=$'\t' read -r name secs rc log; do
    timings+=("$(printf '  %-62s %3dm%02ds%s' "$name (background)" $((secs / 60)) $((secs % 60)) \
                 "$([ "$rc" = 0 ] || echo "  FAILED")")")
    if [ "$rc" = 0 ]; then
      echo "-- $name: OK"; tail -n 2 "$log"
    else
      echo "-- $name: FAILED (exit $rc)"; tail -n 200 "$log"; failed=1
    fi
  done < "$bg/done"
  [ "$(wc -l < "$bg/done")" -eq 3 ] || { echo "-- background builds: not all three ran"; failed=1; }
  return "$failed"
}
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-test.XXXXXX)}"

# TSan: every process (the test, the daemons it starts, their workers) writes its reports to
# a log directory of the stage ($tsan_logs/<n>/tsan.<pid>); a stage fails when any report was
# written (a process with a report also exits with 66, so its test fails too).
tsan_logs=$(mktemp -d /tmp/torus-tsan.XXXXXX)
tsan_runs=0
tsan() {
  local d="$tsan_logs/$((tsan_runs += 1))" rc=0
  mkdir -p "$d"
  TSAN_OPTIONS="suppressions=$PWD/scripts/tsan.supp log_path=$d/tsan second_deadlock_stack=1 die_after_fork=0" "$@" || rc=$?
  if grep -l 'ThreadSanitizer' "$d"/tsan.* >/dev/null 2>&1; then
    cat "$d"/tsan.*
    echo "ThreadSanitizer: $(cat "$d"/tsan.* | grep -c '^WARNING: ThreadSanitizer') report(s) (above)"
    return 1
  fi
  return "$rc"
}
asan() { ASAN_OPTIONS=detect_leaks=0 "$@"; }

stage "unit and multi-process tests (release)" \
  ctest --test-dir build --output-on-failure -j1 --timeout 600
# Python: `pip install .` into .venv-py (the CMake objects come from ccache: same flags as the
# release build), then the pytest suite against real clusters.
stage "python package (pip install . into .venv-py)" scripts/python_env.sh .venv-py
# CPU JAX (pinned) for the training tests' workers, which run the driver's interpreter.
stage "CPU JAX for the training tests (scripts/jax_venv.sh .venv-py)" scripts/jax_venv.sh .venv-py
# The real Ray 2.60 client (its `ray job` CLI and SDK) the HTTP tests drive Torus with, pinned.
ray_client() {
  [ -x .venv-ray/bin/python ] || python3 -m venv .venv-ray
  .venv-ray/bin/pip install -q --disable-pip-version-check -r python/requirements-ray-client.txt
}
stage "ray client (pip install -r python/requirements-ray-client.txt into .venv-ray)" ray_client
export TORUS_TEST_ARTIFACTS="${TORUS_TEST_ARTIFACTS:-$PWD/build/test-artifacts}"  # the dashboard's screenshot
stage "python tests (pytest)" .venv-py/bin/python -m pytest tests/python -q -x --timeout=600 -p no:cacheprovider \
  --durations=20
# KubeRay v1.5.0's own operator code makes the pods of the example RayClusters; they run as a
# kubelet would run them, become ready by KubeRay's probes, run a Ray program, and a killed
# worker pod recreated by the operator rejoins (tests/kuberay_test.sh, docs/kuberay.md).
stage "KubeRay conformance (tests/kuberay_test.sh)" tests/kuberay_test.sh .venv-py/bin/python
# The container image for KubeRay pods (scripts/image.sh: Debian rootfs by mmdebstrap, the wheel
# of this tree), and a head pod run in it with KubeRay's command line and probes.
stage "container image and a head pod in it (tests/image_test.sh)" tests/image_test.sh build-image

# ---- the sanitizer configurations, built in the background meanwhile
stage "background builds (asan, tsan, tsa): the wait for them" wait_background
stage "unit tests (ASan+UBSan)" asan ctest --test-dir build-asan -L unit --output-on-failure -j2
stage "object and reference-counting multi-process tests (ASan+UBSan)" \
  asan ctest --test-dir build-asan -L integration \
  -R '^(BorrowTest|TaskTest|ObjectTest)\.' --output-on-failure -j1 --timeout 600
stage "unit tests (TSan)" tsan ctest --test-dir build-tsan -L unit --output-on-failure -j2
stage "task, object, borrowing and actor multi-process tests (TSan)" \
  tsan ctest --test-dir build-tsan -L integration \
  -R '^(TaskTest|ObjectTest|BorrowTest|ActorTest)\.' --output-on-failure -j1 --timeout 600
