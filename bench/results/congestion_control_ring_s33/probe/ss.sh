#!/bin/bash
out=$1
while true; do
  t=$(date +%s.%N)
  for K in 0 1 2 3; do
    ip netns exec trib-h$K ss -tinH state established 2>/dev/null | paste - - | awk -v t=$t -v K=$K '{ for(i=1;i<=NF;i++){ if($i ~ /^rtt:/) rtt=$i; if($i ~ /^cwnd:/) cw=$i; if($i=="unacked:"||$i ~ /^unacked:/) un=$i; if($i ~ /^delivery_rate/) dr=$(i+1)}; if ($2+0 > 10000) print t, "h" K, $4, $5, "local=" $3, "sendq=" $2, rtt, cw, un; rtt=cw=un=""}'
  done
  sleep 0.5
done > $out
