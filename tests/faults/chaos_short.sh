#!/bin/sh
# The short fault-injection run that ctest does (`faults_chaos_short`): one trial of each fault
# but the spare ones (below), and one of an elastic job losing a worker node, with a 3 s op deadline (a hang is a collective
# over 6 s), through `tributary chaos`, which exits non-zero on any hang, wrong sum, or a fault
# the workload did not recover from. Real
# processes: a controller with its database, 3 worker agents, 2 spares, one training process per
# worker node.
# Usage: chaos_short.sh BIN_DIR
set -eu
bin="$1"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" UCX_TLS="${UCX_TLS:-tcp}"
# spare-kill and spare-freeze are left out: a server that dies or freezes in the middle of
# sending a chunk's sum to the workers can complete the iteration on some workers and not on
# others, which then retry an iteration the first ones finished (the "fan-out hole", issue 12):
# they realign only after deadlines, and under load not always within the trial's window. The
# spare-failover integration test covers those faults at fixed points; `tributary chaos` runs
# them at random ones (README).
"$bin/tributary" chaos --trials 4 --seed 1 --op-deadline-ms 3000 \
  --faults controller-restart,process-restart,worker-agent-restart,worker-agent-kill
# An elastic job goes on without a dead worker node.
exec "$bin/tributary" chaos --trials 1 --seed 1 --op-deadline-ms 3000 --elastic \
  --faults worker-agent-kill
