#!/bin/bash
# A/B of ResNet-50 push/pull k=4 vs Gloo ring: base and new binaries alternated.
cd /work/main
for round in 1 2; do
  for v in new base; do
    pkill -9 -f "tributary-agent|tributary-controller"; sleep 2; rm -rf /tmp/trib-emu-suite
    python3 bench/results/receive_low_water_125mbit_s21/agent_wakeups.py > /tmp/ab/ctx-$v$round.txt 2>&1 &
    sp=$!
    echo "== $v $round $(date +%T)"
    python3 bench/suite/run.py --no-install --bin-dir /tmp/bin-$v --configs pp,gloo-ring --k 4 --rate 125 \
      --sizes= --workloads resnet50 --workload-iters resnet50=4:1 --repeats 2 --ceiling-probes 0 \
      --out /tmp/ab/$v$round > /tmp/ab/$v$round.log 2>&1
    kill $sp
    grep "ms per iteration\|resnet50 on" /tmp/ab/$v$round.log
    grep "^| resnet50" /tmp/ab/$v$round/emulated_allreduce.md
  done
done
