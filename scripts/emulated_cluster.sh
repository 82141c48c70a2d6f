#!/usr/bin/env bash
# An emulated cluster on one machine: N hosts as network namespaces on a bridge, each host's NIC
# shaped to RATE Mbit/s in both directions with tc tbf. Root only (network namespaces).
#
#   scripts/emulated_cluster.sh up N [RATE_MBIT]   # create hosts trib-h0 .. trib-h(N-1) (default 1000)
#   scripts/emulated_cluster.sh down               # stop everything started here, remove the hosts
#   scripts/emulated_cluster.sh status             # hosts, addresses, qdiscs, running processes
#   scripts/emulated_cluster.sh start-tributary [RUN_DIR] [AGENT_ARGS...]
#       # controller in the root namespace on the bridge address 198.18.0.254, one agent per host
#       # inside its namespace (node id hK, --data-plane-host 198.18.0.(K+1), UCX_TLS=tcp,
#       # UCX_NET_DEVICES=the host's veth); logs, sockets and pid files under RUN_DIR
#       # (default /tmp/trib-emu); prints "CONTROLLER=198.18.0.254:PORT" when all agents joined.
#   scripts/emulated_cluster.sh stop-tributary     # stop the controller and agents only
#   scripts/emulated_cluster.sh exec K CMD...      # run CMD in host K's namespace
#
# Layout: host K is namespace trib-hK with interface `eth0` (198.18.0.(K+1)/24); its peer end
# `trib-vK` in the root namespace is enslaved to the bridge `tribr0` (198.18.0.254/24).
# Addresses are only ever in 198.18.0.0/15 (the benchmarking range, RFC 2544).
#
# Shaping (netem is not available, so no added delay; the veth RTT is ~20-50 us):
#   * the host's egress: tbf on eth0 inside the namespace;
#   * the host's ingress: tbf on trib-vK, the bridge's egress towards the host.
#   rate RATE mbit; burst = 1 ms at RATE, at least 16 KiB (62.5 KB at 500 Mbit/s): small enough
#   that a message above ~64 KiB cannot ride the bucket at veth speed, large enough for the
#   kernel's hrtimer-driven dequeue to keep the link busy (a 4 ms bucket made 256 KiB all-reduces
#   beat the model by 1.4x); latency 50 ms of queue (enough for TCP to fill the pipe without tail
#   drops dominating; a shorter queue loses throughput to drops, a longer one only adds RTT).
#   MTU: TRIB_EMU_MTU (default 9000, jumbo frames as in training clusters). tbf counts every
#   frame's bytes, so TCP payload through it is (MTU - 52) / (MTU + 14) of RATE (IP + TCP with
#   timestamps, Ethernet header): 0.993 at 9000, 0.956 at 1500. At 1500 the kernel's per-packet
#   work (veth, bridge, two tbf per hop) is the bottleneck on a 2-core machine: four hosts
#   streaming in a ring got 0.69 x RATE each with 70% of both cores in softirq; at 9000 they get
#   0.98 x RATE (measured with plain TCP sockets, no Tributary).
set -euo pipefail

# Several clusters can live side by side (the ctest quick run next to a full run):
# TRIB_EMU_NAME (default trib) prefixes every name, TRIB_EMU_NET (0..255, default 0) picks the
# subnet 198.18.NET.0/24.
NAME=${TRIB_EMU_NAME:-trib}
NET=${TRIB_EMU_NET:-0}
MTU=${TRIB_EMU_MTU:-9000}
[[ $NAME =~ ^[a-z][a-z0-9]{0,5}$ ]] || { echo "emulated_cluster: TRIB_EMU_NAME must be 1-6 of [a-z0-9]" >&2; exit 1; }
[[ $NET =~ ^[0-9]+$ && $NET -le 255 ]] || { echo "emulated_cluster: TRIB_EMU_NET must be 0..255" >&2; exit 1; }
[[ $MTU =~ ^[0-9]+$ && $MTU -ge 576 && $MTU -le 65000 ]] || { echo "emulated_cluster: TRIB_EMU_MTU must be 576..65000" >&2; exit 1; }
PREFIX=$NAME-h
VPREFIX=$NAME-v
BRIDGE=${NAME}br0
SUBNET=198.18.$NET
BRIDGE_ADDR=$SUBNET.254
STATE_DIR=/run/tributary-emu/$NAME
DEFAULT_RUN_DIR=/tmp/$NAME-emu
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BIN_DIR="${TRIBUTARY_BIN_DIR:-$ROOT/build/bin}"

die() { echo "emulated_cluster: $*" >&2; exit 1; }

need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    die "needs root (network namespaces, veth, tc); run as root or with sudo"
  fi
  command -v ip >/dev/null || die "iproute2 ('ip') is missing"
  command -v tc >/dev/null || die "'tc' (iproute2) is missing"
}

hosts() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}[0-9]*$" | sort -V || true; }

shape() {  # shape NS(or "") DEV RATE_MBIT
  local ns=$1 dev=$2 rate=$3
  local burst=$((rate * 1000000 / 8 / 1000))  # 1 ms at the rate
  ((burst < 16384)) && burst=16384
  ((burst < MTU + 64)) && burst=$((MTU + 64))  # one frame must fit the bucket
  local run=()
  [[ -n $ns ]] && run=(ip netns exec "$ns")
  "${run[@]}" ip link set dev "$dev" mtu "$MTU"
  "${run[@]}" tc qdisc replace dev "$dev" root tbf rate "${rate}mbit" burst "$burst" latency 50ms
}

up() {
  local n=${1:?usage: up N [RATE_MBIT]} rate=${2:-1000}
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "N must be 1..200"
  [[ $rate =~ ^[0-9]+$ && $rate -ge 1 ]] || die "RATE_MBIT must be a positive integer"
  need_root
  trap 'echo "emulated_cluster: setup failed, tearing down" >&2; down >/dev/null 2>&1 || true' ERR INT TERM
  mkdir -p "$STATE_DIR"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "$BRIDGE_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" mtu "$MTU" up
  # Bridged frames must not go through iptables (Docker-style FORWARD DROP would eat them).
  sysctl -qw net.bridge.bridge-nf-call-iptables=0 2>/dev/null || true
  # Remove hosts beyond N left from an earlier, larger cluster.
  for ns in $(hosts); do
    local k=${ns#"$PREFIX"}
    if ((k >= n)); then
      ip netns del "$ns" 2>/dev/null || true
      ip link del "$VPREFIX$k" 2>/dev/null || true
    fi
  done
  for ((k = 0; k < n; k++)); do
    local ns="$PREFIX$k" veth="$VPREFIX$k" addr="$SUBNET.$((k + 1))"
    ip netns list | awk '{print $1}' | grep -qx "$ns" || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip netns exec "$ns" ip link del eth0 2>/dev/null || true
      ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr replace "$addr/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    shape "$ns" eth0 "$rate"
    shape "" "$veth" "$rate"
  done
  ip link set "$BRIDGE" mtu "$MTU"
  echo "$n $rate $MTU" >"$STATE_DIR/cluster"
  trap - ERR INT TERM
  echo "emulated_cluster: $n hosts (${PREFIX}0..${PREFIX}$((n - 1)), $SUBNET.1..$n/24) on $BRIDGE ($BRIDGE_ADDR), ${rate} Mbit/s each way, MTU $MTU"
}

stop_pidfiles() {  # kill the processes whose pid files are under RUN_DIR/pids
  local dir=$1
  [[ -d $dir/pids ]] || return 0
  local f pid
  for f in "$dir"/pids/*.pid; do
    [[ -e $f ]] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
  done
  sleep 0.5
  for f in "$dir"/pids/*.pid; do
    [[ -e $f ]] || continue
    pid=$(cat "$f")
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

stop_tributary() {
  local dir
  dir=$(cat "$STATE_DIR/run_dir" 2>/dev/null || echo "$DEFAULT_RUN_DIR")
  stop_pidfiles "$dir"
  rm -f "$STATE_DIR/run_dir"
}

down() {
  need_root
  stop_tributary
  local ns pid
  for ns in $(hosts); do
    # Anything still running inside a host (a benchmark peer) goes with it.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$VPREFIX" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -f "$STATE_DIR/cluster"
  echo "emulated_cluster: down"
}

status() {
  need_root
  local list
  list=$(hosts)
  if [[ -z $list ]]; then echo "emulated_cluster: no hosts"; return 0; fi
  [[ -f $STATE_DIR/cluster ]] && echo "cluster (hosts rate_mbit mtu): $(cat "$STATE_DIR/cluster")"
  local ns k
  for ns in $list; do
    k=${ns#"$PREFIX"}
    echo "== $ns: $(ip netns exec "$ns" ip -4 -o addr show dev eth0 | awk '{print $4}')"
    echo "   egress:  $(ip netns exec "$ns" tc qdisc show dev eth0 | head -1)"
    echo "   ingress: $(tc qdisc show dev "$VPREFIX$k" | head -1)"
    echo "   pids:    $(ip netns pids "$ns" | tr '\n' ' ')"
  done
}

start_tributary() {
  need_root
  local dir=${1:-$DEFAULT_RUN_DIR}
  shift || true
  local list
  list=$(hosts)
  [[ -n $list ]] || die "no hosts: run 'up N' first"
  [[ -x $BIN_DIR/tributary-controller && -x $BIN_DIR/tributary-agent ]] ||
    die "no binaries in $BIN_DIR (set TRIBUTARY_BIN_DIR)"
  stop_tributary
  mkdir -p "$dir/pids" "$dir/logs" "$dir/sock"
  echo "$dir" >"$STATE_DIR/run_dir"
  local rate
  rate=$(awk '{print $2}' "$STATE_DIR/cluster" 2>/dev/null || echo 1000)
  local gbps
  gbps=$(awk -v r="$rate" 'BEGIN{printf "%.4f", r/1000}')
  rm -f "$dir/controller.port"
  # Metrics on the bridge address and a free port: several clusters (and a controller outside
  # them) can run side by side; the port is in RUN_DIR/controller.metrics.port.
  "$BIN_DIR/tributary-controller" --listen "$BRIDGE_ADDR:0" --port-file "$dir/controller.port" \
    --metrics-listen "$BRIDGE_ADDR:0" --metrics-port-file "$dir/controller.metrics.port" \
    --log-level "${TRIB_LOG_LEVEL:-warn}" >"$dir/logs/controller.log" 2>&1 &
  echo $! >"$dir/pids/controller.pid"
  local i
  for ((i = 0; i < 100; i++)); do [[ -s $dir/controller.port ]] && break; sleep 0.1; done
  [[ -s $dir/controller.port ]] || die "controller did not start (see $dir/logs/controller.log)"
  local controller
  controller="$BRIDGE_ADDR:$(cat "$dir/controller.port")"
  local ns k n=0
  for ns in $list; do
    k=${ns#"$PREFIX"}
    rm -f "$dir/sock/h$k.sock"
    ip netns exec "$ns" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 \
      "$BIN_DIR/tributary-agent" --node-id "h$k" --controller "$controller" \
      --data-plane-host "$SUBNET.$((k + 1))" --listen "unix:$dir/sock/h$k.sock" \
      --nic-gbps "$gbps" --log-level "${TRIB_LOG_LEVEL:-warn}" "$@" \
      >"$dir/logs/agent-h$k.log" 2>&1 &
    echo $! >"$dir/pids/agent-h$k.pid"
    n=$((n + 1))
  done
  # Wait until every agent is registered.
  for ((i = 0; i < 200; i++)); do
    local seen
    seen=$("$BIN_DIR/tributary" --controller "$controller" nodes 2>/dev/null | grep -c '^ *h[0-9]' || true)
    ((seen >= n)) && break
    sleep 0.2
  done
  ((seen >= n)) || die "only $seen of $n agents registered (logs in $dir/logs)"
  echo "CONTROLLER=$controller"
}

cmd=${1:-}
shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  status) status ;;
  start-tributary) start_tributary "$@" ;;
  stop-tributary) need_root; stop_tributary ;;
  exec)
    need_root
    k=${1:?usage: exec K CMD...}; shift
    exec ip netns exec "$PREFIX$k" "$@" ;;
  *)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    [[ -z $cmd || $cmd == help || $cmd == -h ]] && exit 0
    exit 1 ;;
esac
