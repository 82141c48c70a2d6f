#!/usr/bin/env bash
# Packs the GPU checks of a finished build for a GPU machine that cannot build them (no Debian
# packages there: gRPC, Abseil, GoogleTest...): the CUDA test and benchmark binaries, the
# end-to-end CUDA test with the controller and agent it starts, the `tributary` CLI (for `topo`,
# the NVML discovery) and every shared library they load that is
# not the C runtime's own (glibc, libstdc++, libgcc_s) or the driver's (libcuda, libnvidia-ml),
# stripped of debug info. `PREBUILT=<dir> scripts/gpu_check.sh` runs them there.
#   scripts/gpu_pack.sh [build-dir] [pack-dir]      # defaults: build build-gpu-pack
# The binaries must come from a build with CUDA (TRIBUTARY_CUDA=AUTO finds nvcc) for the
# target GPU's architecture (the default list, 80-real;90, covers A100 and H100/H200). The
# machine that runs them needs a glibc at least as new as this one's.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
pack="${2:-build-gpu-pack}"
binaries=(cuda_test cuda_ipc_peer cuda_integration_test tributary-controller tributary-agent
  cuda_reduce_bench cuda_staging_bench cuda_intranode_bench cuda_collective_bench tributary)
for b in "${binaries[@]}"; do
  if [ ! -x "$build/bin/$b" ]; then
    echo "gpu_pack: $build/bin/$b is missing (a build with CUDA: scripts/build.sh where nvcc is)" >&2
    exit 1
  fi
done
rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for b in "${binaries[@]}"; do
  objcopy --strip-debug "$build/bin/$b" "$pack/bin/$b"
done
# Libraries by soname as the loader resolved them here; the C runtime and the driver stay the
# GPU machine's own.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda\.|libnvidia-)'
for b in "${binaries[@]}"; do
  ldd "$build/bin/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if [[ "$soname" =~ $skip ]]; then continue; fi
  objcopy --strip-debug "$path" "$pack/lib/$soname"
done
glibc=$(for f in "$pack"/bin/* "$pack"/lib/*; do objdump -T "$f"; done |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
echo "gpu_pack: $(ls "$pack/bin" | wc -l) binaries, $(ls "$pack/lib" | wc -l) libraries," \
  "$(du -sh "$pack" | cut -f1) in $pack; needs $glibc or newer"
