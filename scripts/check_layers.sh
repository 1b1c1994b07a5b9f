#!/usr/bin/env bash
# The include direction of src/'s layers (CMakeLists.txt "layers"), checked on #include lines:
#   proto <- common <- tpu <- {launcher, head, node, core} <- embedded <- cli
#                                                   core <- python (the extension torus._core)
# A file in src/<folder>/ may include "<folder>/...", the layers below it, the public headers
# (include/torus, include/ray) and the generated "proto/..."; anything else is a layer violation.
# The link step checks the same order on symbols (TORUS_CHECK_LAYERS). Exit 1 on a violation.
set -euo pipefail
cd "$(dirname "$0")/.."

allowed() {  # $1: folder -> the folders it may include
  case "$1" in
    common) echo "common" ;;
    tpu) echo "tpu common" ;;
    launcher|head|node|core) echo "$1 tpu common" ;;
    embedded) echo "embedded core head node tpu common" ;;
    cli) echo "cli embedded launcher head node core tpu common" ;;
    python) echo "python core tpu common" ;;
    *) return 1 ;;
  esac
}

status=0
for dir in src/*/; do
  folder=$(basename "$dir")
  if ! ok=$(allowed "$folder"); then
    echo "check_layers: src/$folder/ is in no layer: add it to scripts/check_layers.sh and CMakeLists.txt"
    status=1
    continue
  fi
  ok="$ok torus ray proto"
  while IFS=: read -r file line text; do
    inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"/]+)\/.*/\1/' <<<"$text")
    case " $ok " in
      *" $inc "*) ;;
      *) echo "$file:$line: layer violation: src/$folder/ may not include \"$inc/...\" ($text)"
         status=1 ;;
    esac
  done < <(grep -nH -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"/]+/' "$dir"*.cc "$dir"*.h 2>/dev/null || true)
done
[ "$status" -eq 0 ] && echo "check_layers: OK"
exit "$status"
