#!/bin/bash
# flow_fairness.sh CC PATTERN(fanout|fanin|pp) BYTES: equal-sized plain TCP flows started together on
# the emulated cluster (scripts/emulated_cluster.sh up 8 125), each flow with congestion control CC;
# prints every flow's finish time after "go" and the slowest over the fastest.
here="$(cd "$(dirname "$0")" && pwd)"
cc=$1; pat=$2; nb=$3
ex() { ip netns exec trib-h$1 "${@:2}"; }
out=${OUT:-/tmp/flow-fairness}; rm -rf $out; mkdir -p $out
# flows: list "src dst"
flows=()
case $pat in
 fanout) for w in 0 1 2 3; do flows+=("4 $w"); done;;
 fanin) for w in 0 1 2 3; do flows+=("$w 4"); done;;
 pp) for w in 0 1 2 3; do for s in 4 5 6 7; do flows+=("$w $s" "$s $w"); done; done;;
esac
declare -A nin
for f in "${flows[@]}"; do set -- $f; nin[$2]=$(( ${nin[$2]:-0} + 1 )); done
for h in "${!nin[@]}"; do ex $h python3 "$here/flow_fairness.py" recv 198.18.0.$((h+1)) 7000 ${nin[$h]} > $out/recv$h & done
sleep 1
go=$(python3 -c "import time;print(time.time()+1.5)")
declare -A dsts
for f in "${flows[@]}"; do set -- $f; dsts[$1]="${dsts[$1]} 198.18.0.$(($2+1)):7000"; done
for h in "${!dsts[@]}"; do ex $h python3 "$here/flow_fairness.py" send $cc $nb $go ${dsts[$h]} > $out/send$h & done
wait
python3 - $go $out <<'PY'
import json,sys,glob
go=float(sys.argv[1]); rows=[]
for f in glob.glob(sys.argv[2]+"/recv*"):
    dst=f.split("recv")[-1]
    for peer,tot,end in json.loads(open(f).read().split("\n")[1]):
        rows.append((int(peer.split(".")[-1])-1,int(dst),tot,end-go))
rows.sort()
ts=[r[3] for r in rows]
print(" ".join(f"{s}->{d}:{t:.2f}" for s,d,_,t in rows))
print(f"min {min(ts):.2f} max {max(ts):.2f} ratio {max(ts)/min(ts):.2f}")
PY
