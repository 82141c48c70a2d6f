#!/bin/bash
# Start beside the run.py command in README.md (this folder); writes to $OUT (default: .).
OUT=${OUT:-.}; mkdir -p "$OUT"
EV='syscalls:sys_enter_sendmsg,syscalls:sys_enter_recvmsg,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_poll,context-switches,task-clock'
inns() { for p in $(pgrep -f "$1"); do [ "$(ip netns identify $p 2>/dev/null)" = "$2" ] && echo $p; done | head -1; }
for i in $(seq 1 900); do PID=$(inns bench-rank trib-h0); [ -n "$PID" ] && break; sleep 0.5; done
sleep 12
AG=$(inns tributary-agent trib-h0); SP=$(inns tributary-agent trib-h4)
perf stat -e $EV -p $PID -o $OUT/stat_rank.txt -- sleep 8 &
perf stat -e $EV -p $AG -o $OUT/stat_agent.txt -- sleep 8 &
perf stat -e $EV -p $SP -o $OUT/stat_spare.txt -- sleep 8 &
wait
for i in $(seq 1 900); do PID=$(inns gloo_allreduce_peer trib-h0); [ -n "$PID" ] && break; sleep 0.5; done
sleep 12
perf stat -e $EV -p $PID -o $OUT/stat_gloo.txt -- sleep 8
echo done
