#!/bin/bash
# Start beside the run.py command in README.md (this folder); writes to $OUT (default: .).
OUT=${OUT:-.}; mkdir -p "$OUT"
inns() { for p in $(pgrep -f "$1"); do [ "$(ip netns identify $p 2>/dev/null)" = "$2" ] && echo $p; done | head -1; }
snap() { # $1 label $2 ns
  NSTAT_HISTORY=$OUT/nstat.$2 ip netns exec $2 nstat -n
  sleep 8
  NSTAT_HISTORY=$OUT/nstat.$2 ip netns exec $2 nstat -z TcpOutSegs TcpInSegs TcpExtTCPPureAcks TcpExtDelayedACKs TcpExtTCPHPAcks TcpExtTCPHPHits IpOutRequests IpInReceives > $OUT/nstat_$1_$2.txt
}
for i in $(seq 1 900); do PID=$(inns bench-rank trib-h0); [ -n "$PID" ] && break; sleep 0.5; done
sleep 10
snap pp trib-h0 & snap pp trib-h4 & wait
for i in $(seq 1 900); do PID=$(inns gloo_allreduce_peer trib-h0); [ -n "$PID" ] && break; sleep 0.5; done
sleep 10
snap gloo trib-h0
echo done
