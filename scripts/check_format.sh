#!/usr/bin/env bash
# Fails when clang-format would change any C++ file of the project.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(git ls-files -co --exclude-standard '*.h' '*.cc' '*.cu' | grep -v '^build' |
      while read -r f; do [ -f "$f" ] && ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1 && echo "$f"; done || true)
if [ -n "$bad" ]; then
  echo "clang-format would change:"; echo "$bad"
  exit 1
fi
echo "formatting ok"
