#!/usr/bin/env bash
# The main job: build if needed, start a local cluster (controller + 4 worker agents + 4 spare
# CPU agents), run the all-reduce sweep with k = 0 and 4 spare summation servers next to ring
# all-reduce, print measured and predicted times, the speed-up the spare hosts buy, and #wrong,
# and shut everything down.
#
# As root (and where network namespaces can be made) the cluster is emulated: 8 hosts as network
# namespaces with NICs shaped to 125 Mbit/s by tc tbf (scripts/emulated_cluster.sh), so the
# speed-up is the real, network-bound one (at 250 Mbit/s and more, eight hosts streaming both ways
# make this 2-core machine's kernel networking the bottleneck, not the links: plain TCP in
# push/pull's pattern reaches only 0.90 of 250 Mbit/s, 0.96 of 125; see BENCHMARKS.md). Gloo's
# ring runs beside Tributary on the same cluster (bench/suite/run.py; results under
# build/main-job/): push/pull forced, and jobs left to the agent's own choice per tensor (auto:
# recursive doubling, halving-doubling, ring or push/pull by size), then a ResNet-50 iteration's
# gradients, and real PyTorch ResNet-50 iterations with tributary.torch's DistributedOptimizer
# and with DDP over the "tributary" backend against DDP over PyTorch's own Gloo backend. About 50
# minutes. Otherwise it runs on loopback
# and every agent paces its data-plane egress to a declared 1 Gbit/s (--emulate-nic).
# TRIB_MAIN_JOB=loopback or =emulated forces one. Extra arguments go to the runner.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export UCX_TLS=${UCX_TLS:-tcp}
export UCX_WARN_UNUSED_ENV_VARS=n

mode=${TRIB_MAIN_JOB:-}
if [[ -z $mode ]]; then
  mode=loopback
  if [[ $(id -u) -eq 0 ]] && ip netns add trib-mainjob-probe 2>/dev/null; then
    ip netns del trib-mainjob-probe
    mode=emulated
  fi
fi
if [[ $mode == emulated ]]; then
  echo "# main job: emulated cluster (network namespaces, tc tbf at 125 Mbit/s)"
  exec bench/suite/run.py --bin-dir build/bin --configs pp,trib-auto,trib-ring,gloo-ring --k 0,4 \
    --rate 125 \
    --sizes 1M:64M --large-iters 3 --workloads resnet50 --torch-iterations resnet50 \
    --out build/main-job "$@"
fi
echo "# main job: loopback with paced egress (not root, or no network namespaces here)"
exec build/bin/tributary bench --workers 4 --spares 4 --algorithms ring --k 0,2,4 --nic-gbps 1 \
  --sum-gbps 4 --emulate-nic --sizes 1M:64M --iters 5 --warmup 2 --log-level warn "$@"
