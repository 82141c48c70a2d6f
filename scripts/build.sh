#!/usr/bin/env bash
# Configures and builds Tributary into build/ (Release with debug info). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build build -j"$(nproc)"
