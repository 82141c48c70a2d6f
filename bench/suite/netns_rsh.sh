#!/bin/sh
# Open MPI's remote-shell agent for the emulated cluster (plm_rsh_agent): Open MPI runs
# `AGENT HOST COMMAND...` to start its daemon on HOST; here HOST is a network namespace
# (trib-hK), so the daemon starts inside it, in its own UTS namespace whose hostname is HOST
# (all namespaces share the machine's hostname otherwise, and Open MPI would take them for one
# node).
host=$1
shift
exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname $host && exec /bin/sh -c \"\$0\"" "$*"
