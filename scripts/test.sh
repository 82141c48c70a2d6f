#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test (unit, integration over
# real processes and UCX on loopback, formatting).
#   scripts/test.sh [ctest args]                    build/, the normal build
#   SANITIZE=asan scripts/test.sh [ctest args]      build-asan/ (preset asan: ASan + UBSan)
#   SANITIZE=asan-ci scripts/test.sh [ctest args]   build-asan/, a quicker subset: four test
#                                                   binaries (preset asan-ci; tests/README.md)
#   SANITIZE=tsan scripts/test.sh [ctest args]      build-tsan/ (preset tsan: the data plane,
#                                                   agent and client tests under TSan)
# Sanitizer builds have no Python extensions (tests/README.md, "Sanitizers").
set -euo pipefail
cd "$(dirname "$0")/.."
export UCX_NET_DEVICES=lo UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
# Tests at twice as many at once as there are cores: about half of a test's time is waiting (on
# the processes it started, on deadlines it checks), so -j2 on 2 cores leaves one core idle
# (tests/README.md, "Sanitizers and fuzzing in CI": 185 s at -j2, 123 s at -j4). CTEST_JOBS
# overrides.
jobs="${CTEST_JOBS:-$(($(nproc) * 2))}"
case "${SANITIZE:-}" in
  "")
    scripts/build.sh
    ctest --test-dir build --output-on-failure --timeout 600 -j"$jobs" "$@"
    ;;
  asan | asan-ci | tsan)
    scripts/install_deps.sh
    configure="${SANITIZE%-ci}"  # asan-ci builds in build-asan/ too, only its targets.
    [ -f "build-$configure/build.ninja" ] || cmake --preset "$configure" >/dev/null
    cmake --build --preset "$SANITIZE" -j"$(nproc)"
    ctest --preset "$SANITIZE" --timeout 600 -j"$jobs" "$@"
    ;;
  *)
    echo "SANITIZE must be asan, asan-ci or tsan, not '$SANITIZE'" >&2
    exit 2
    ;;
esac
