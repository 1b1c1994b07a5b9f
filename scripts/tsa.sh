#!/usr/bin/env bash
# clang's thread-safety analysis over every src/ translation unit (unity batch), compile only:
#   clang++ -fsyntax-only -Wthread-safety -Werror, with the flags of BUILD_DIR's
#   compile_commands.json (default build/, from scripts/build.sh release) minus g++-only ones.
# usage: scripts/tsa.sh [BUILD_DIR]   (JOBS=2 by default; TSA_FILTER=regex picks files)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
db="$build/compile_commands.json"
[ -f "$db" ] || { echo "tsa: $db missing: run scripts/build.sh release first" >&2; exit 2; }
command -v clang++ >/dev/null || { echo "tsa: clang++ not installed (scripts/deps.sh)" >&2; exit 2; }
# One shell command per src/ .cc: the compiler becomes clang++, -o/-M* and g++-only flags go.
python3 - "$db" "$PWD/src/" > "$build/tsa_commands.txt" <<'PY'
import json, shlex, sys
db, src = sys.argv[1], sys.argv[2]
seen = set()
def ours(f):
    if "/Unity/unity_" in f:  # a unity batch (scripts/build.sh): ours when it includes src/ files
        return ('#include "' + src) in open(f).read()
    return f.startswith(src) and f.endswith(".cc")

for entry in json.load(open(db)):
    f = entry["file"]
    if f in seen or not ours(f):
        continue
    seen.add(f)
    args = shlex.split(entry["command"])
    while args and ("ccache" in args[0] or args[0].endswith(("c++", "g++", "gcc"))):
        args.pop(0)  # the launcher and the compiler
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-W") or a.startswith("-fsanitize"):
            continue
        out.append(a)
    cmd = ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror"] + out
    print("cd " + shlex.quote(entry["directory"]) + " && " + shlex.join(cmd))
PY
if [ -n "${TSA_FILTER:-}" ]; then grep -E -- "$TSA_FILTER" "$build/tsa_commands.txt" > "$build/tsa_commands.sel" || true; mv "$build/tsa_commands.sel" "$build/tsa_commands.txt"; fi
n=$(wc -l < "$build/tsa_commands.txt")
echo "tsa: clang -Wthread-safety over $n files"
tr '\n' '\0' < "$build/tsa_commands.txt" | xargs -0 -P "${JOBS:-2}" -I{} bash -c '{}'
echo "tsa: OK"
