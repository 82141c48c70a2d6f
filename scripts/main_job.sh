#!/usr/bin/env bash
# The main job: build if needed, start a local cluster (controller + 4 worker agents + 4 spare
# CPU agents on loopback), run the all-reduce sweep with k = 0, 2 and 4 spare summation servers,
# print measured and predicted times and #wrong, and shut everything down.
#
# Loopback has no NIC limit, so every agent paces its data-plane egress to the declared NIC speed
# (--emulate-nic). Extra arguments go to `tributary bench` (e.g. --sizes 1M:64M --iters 10).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export UCX_TLS=${UCX_TLS:-tcp}
export UCX_WARN_UNUSED_ENV_VARS=n
exec build/bin/tributary bench --workers 4 --spares 4 --algorithms ring --k 0,2,4 --nic-gbps 1 --sum-gbps 4 \
  --sizes 1M:64M --iters 5 --warmup 2 --log-level warn "$@"
