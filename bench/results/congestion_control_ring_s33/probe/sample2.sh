#!/bin/bash
out=$1; mkdir -p $out
i=0
while true; do
  for K in 0 1 2 3; do
    ns=trib-h$K
    ip netns exec $ns cat /proc/net/netstat > $out/h$K.$i.txt 2>/dev/null
  done
  i=$((i+1)); sleep 1
done
