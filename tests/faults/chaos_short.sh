#!/bin/sh
# The short fault-injection run that ctest does (`faults_chaos_short`): one trial of each fault,
# and one of an elastic job losing a worker node, with a 3 s op deadline (a hang is a collective
# over 6 s), through `tributary chaos`, which exits non-zero on any hang, wrong sum, or a fault
# the workload did not recover from. Real processes: a controller with its database, 3 worker
# agents, 2 spares, one training process per worker node.
# Usage: chaos_short.sh BIN_DIR
set -eu
bin="$1"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" UCX_TLS="${UCX_TLS:-tcp}"
"$bin/tributary" chaos --trials 6 --seed 1 --op-deadline-ms 3000 \
  --faults spare-kill,spare-freeze,controller-restart,process-restart,worker-agent-restart,worker-agent-kill
# An elastic job goes on without a dead worker node.
exec "$bin/tributary" chaos --trials 1 --seed 1 --op-deadline-ms 3000 --elastic \
  --faults worker-agent-kill
