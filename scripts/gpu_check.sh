#!/usr/bin/env bash
# Everything CUDA, on a machine with a GPU, in one command: configures build-gpu/ with
# TRIBUTARY_CUDA=ON for this machine's GPU architecture, builds the CUDA tests, the end-to-end
# CUDA test, the staging and intra-node tests and the four CUDA benchmarks, runs them, and fails
# if any GPU test was skipped (on a GPU machine a skip means the device was not usable, not that
# there is nothing to test). The benchmarks' tables go to stdout and to
# bench/results/cuda_{reduce,staging,intranode,collective}_<gpu>.txt.
#   scripts/gpu_check.sh            # exit 77 (skipped) where no GPU is visible
#   BUILD_DIR=... MIB=... scripts/gpu_check.sh
#   PREBUILT=build-gpu-pack scripts/gpu_check.sh
#       a machine that cannot build (no Debian packages): runs the binaries and libraries that
#       scripts/gpu_pack.sh packed elsewhere -- cuda_test, cuda_integration_test, the four
#       benchmarks and `tributary topo`; the CPU tests (staging, intranode, reduce) run where the
#       pack was built.
set -euo pipefail
cd "$(dirname "$0")/.."
export UCX_NET_DEVICES=lo UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
build="${BUILD_DIR:-build-gpu}"
if ! gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) || [ -z "$gpu" ]; then
  echo "gpu_check: no GPU visible (nvidia-smi lists none); nothing run" >&2
  exit 77
fi
echo "gpu_check: $gpu"
nvidia-smi -L
if [ -n "${PREBUILT:-}" ]; then
  bin="$PREBUILT/bin"
  export LD_LIBRARY_PATH="$PWD/$PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TRIBUTARY_CUDA_IPC_PEER="$PWD/$bin/cuda_ipc_peer"
else
  bin="$build/bin"
  scripts/install_deps.sh
  if [ ! -f "$build/build.ninja" ]; then
    # "native": the architecture of the GPUs present (the default list is 80-real;90).
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRIBUTARY_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null
  fi
  cmake --build "$build" -j"$(nproc)" --target cuda_test staging_test intranode_test reduce_test \
    cuda_integration_test tributary-controller tributary-agent cuda_reduce_bench \
    cuda_staging_bench cuda_intranode_bench cuda_collective_bench tributary
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$bin/cuda_test" 2>&1 | tee "$log" || status=1
if grep -q '^\[  SKIPPED \]' "$log"; then
  echo "gpu_check: GPU tests were skipped on a machine with a GPU:" >&2
  grep '^\[  SKIPPED \]' "$log" >&2
  status=1
fi
# End to end: a controller and two agents as processes, training processes with CUDA tensors.
TRIBUTARY_BIN_DIR="$bin" "$bin/cuda_integration_test" 2>&1 | tee "$log" || status=1
if grep -q '^\[  SKIPPED \]' "$log"; then
  echo "gpu_check: the end-to-end GPU test was skipped on a machine with a GPU" >&2
  status=1
fi
if [ -z "${PREBUILT:-}" ]; then
  "$bin/staging_test" || status=1
  "$bin/intranode_test" || status=1
  "$bin/reduce_test" --gtest_brief=1 || status=1
fi
# NVML discovery against the driver's own view.
nvidia-smi topo -m || status=1
"$bin/tributary" topo || status=1

slug=$(echo "$gpu" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '_' | sed 's/_$//')
mkdir -p bench/results
"$bin/cuda_reduce_bench" --mib="${MIB:-256}" | tee "bench/results/cuda_reduce_${slug}.txt" ||
  status=1
"$bin/cuda_staging_bench" --mib="${MIB:-256}" | tee "bench/results/cuda_staging_${slug}.txt" ||
  status=1
# The intra-node executors (several "GPUs" on one device where there is one).
"$bin/cuda_intranode_bench" --mib="${INTRANODE_MIB:-64}" |
  tee "bench/results/cuda_intranode_${slug}.txt" || status=1
# CUDA tensors through agents end to end: whole copies vs streamed staging vs shared memory.
TRIBUTARY_BIN_DIR="$bin" "$bin/cuda_collective_bench" |
  tee "bench/results/cuda_collective_${slug}.txt" || status=1
if [ "$status" -ne 0 ]; then
  echo "gpu_check: FAILED" >&2
else
  echo "gpu_check: every GPU test ran and passed; tables in bench/results/cuda_{reduce,staging,intranode,collective}_${slug}.txt"
fi
exit "$status"
