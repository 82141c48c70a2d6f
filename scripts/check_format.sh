#!/usr/bin/env bash
# Fails when clang-format would change any C++ file of the project.
set -euo pipefail
cd "$(dirname "$0")/.."
# Existing files only (a tracked file may be deleted in the work tree), 40 to a clang-format
# process, one process per core: a process per file spent most of its time starting up.
out=$(git ls-files -co --exclude-standard '*.h' '*.cc' '*.cu' | grep -v '^build' |
      while read -r f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
      xargs -0 -r -n 40 -P "$(nproc)" clang-format --dry-run -Werror 2>&1 || true)
bad=$(sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*clang-format-violations.*/\1/p' <<<"$out" |
      sort -u)
if [ -n "$bad" ]; then
  echo "clang-format would change:"; echo "$bad"
  exit 1
fi
if grep -q . <<<"$out"; then
  echo "clang-format failed:"; echo "$out"
  exit 1
fi
echo "formatting ok"
