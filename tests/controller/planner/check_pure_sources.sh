#!/usr/bin/env bash
# Fails when a source of the pure planner (the files given) does I/O or reaches the data plane:
# file, socket, process or dynamic-library headers and calls, or includes from agent/ and
# dataplane/. The link-level twin is tributary_check_pure in the top-level CMakeLists.txt.
set -u
bad=0
for f in "$@"; do
  hits=$(grep -nE '#include <(fstream|filesystem|cstdio|stdio\.h|dlfcn\.h|unistd\.h|fcntl\.h|sys/[a-z_]+\.h|thread)>|#include "(agent|dataplane|client)/|\b(fopen|ifstream|ofstream|dlopen|getenv|opendir)\b' "$f")
  if [ -n "$hits" ]; then
    echo "$f: not pure:"; echo "$hits"; bad=1
  fi
done
[ "$bad" = 0 ] && echo "checked $# planner sources: no I/O"
exit $bad
