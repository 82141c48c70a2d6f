#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test (unit, integration over
# real processes and UCX on loopback, formatting).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
export UCX_NET_DEVICES=lo UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
ctest --test-dir build --output-on-failure --timeout 600 -j2 "$@"
