#!/bin/bash
# A/B of bert-large-1d: base build vs new build, interleaved.
cd /work/main
for round in 1 2; do
for which in base new; do
  bin=/tmp/bin_base; [ $which = new ] && bin=build/bin
  pgrep -f "bin/tributary-agent" | xargs -r kill -9; pgrep -f "bin/tributary-controller" | xargs -r kill -9
  python3 bench/suite/run.py --no-install --bin-dir $bin --configs pp,trib-auto,trib-ring,gloo-ring --k 0,4 --rate 125 --sizes= --workloads bert-large-1d --repeats 3 --ceiling-probes 0 --out /tmp/ab_${which}_$round > /tmp/ab_${which}_$round.log 2>&1
  echo "== $which round $round"; grep "^| bert" /tmp/ab_${which}_$round/emulated_allreduce.md | awk -F'|' '{print $3, $6, $7, $12, $14, $15}'
done; done
