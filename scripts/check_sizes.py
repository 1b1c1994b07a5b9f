#!/usr/bin/env python3
"""Size budget of the production sources (issue 14): no file in src/ or include/ over 800 lines and no
function over 80 lines (lizard's length: first to last line of the definition). Tests
(*_test.cc) are exempt. scripts/size_exceptions.txt lists what is still over, one
`path` or `path:function` per line; the check fails on any offender not listed and on any listed
entry that is no longer over (so the list only shrinks).

Usage: scripts/check_sizes.sh (makes a private venv with the pinned lizard, then runs this).
"""
import pathlib
import sys

import lizard

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
ROOT = pathlib.Path(__file__).resolve().parent.parent


def offenders():
    found = {}
    for path in sorted([*(ROOT / "src").rglob("*"), *(ROOT / "include").rglob("*")]):
        if path.suffix not in (".cc", ".h") or path.name.endswith("_test.cc"):
            continue
        rel = path.relative_to(ROOT).as_posix()
        lines = path.read_text(errors="replace").count("\n")
        if lines > MAX_FILE_LINES:
            found[rel] = f"{lines} lines (most {MAX_FILE_LINES})"
        for fn in lizard.analyze_file(str(path)).function_list:
            if fn.length > MAX_FUNCTION_LINES:
                found[f"{rel}:{fn.name}"] = f"{fn.length} lines from line {fn.start_line} (most {MAX_FUNCTION_LINES})"
    return found


def main():
    listed_path = ROOT / "scripts" / "size_exceptions.txt"
    listed = set()
    if listed_path.exists():
        for line in listed_path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                listed.add(line)
    found = offenders()
    bad = False
    for key in sorted(found):
        if key not in listed:
            print(f"check_sizes: {key}: {found[key]}")
            bad = True
    for key in sorted(listed - found.keys()):
        print(f"check_sizes: {key} is within budget now: remove it from scripts/size_exceptions.txt")
        bad = True
    print(f"check_sizes: {len(found)} over budget, {len(listed)} listed as exceptions")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
