#!/usr/bin/env bash
# Two emulated nodes on one machine: network namespaces moeA and moeB joined by a veth pair shaped with tc tbf
# (default 1 Gbit/s per direction), OpenMPI ranks in each (shared memory inside a node, TCP across), running
# `piper bench comm` (or any command given after --). Needs root. Cleans up namespaces and its processes on exit.
#
#   scripts/two-node-emulation.sh [--rate 1gbit] [--ranks-per-node 4] [--bin build/src/cli/piper]
#                                 [--mca NAME VALUE]... [-- ARGS...]
#
# --mca passes an extra OpenMPI parameter to every rank (e.g. --mca btl_tcp_links 4).
#
# ARGS default to a bench of plain all-to-all at 64 KiB..1 MiB per pair and a MoE dispatch (top-4 of 16
# experts). The recipe and the measured link rates are in ../shared/reference/build_machine.md §6 and
# docs/comm.md.
set -euo pipefail

RATE=1gbit
PER_NODE=4
BIN=build/src/cli/piper
ARGS=()
EXTRA_MCA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --ranks-per-node) PER_NODE=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --mca) EXTRA_MCA+=(--mca "$2" "$3"); shift 3 ;;
    --) shift; ARGS=("$@"); break ;;
    *) echo "two-node-emulation: unknown argument '$1'; see the header of $0" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "two-node-emulation: needs root (network namespaces and tc); run it with sudo" >&2
  exit 1
fi
BIN=$(readlink -f "$BIN")
if [ ! -x "$BIN" ]; then
  echo "two-node-emulation: $BIN is not built; run cmake --build build --target piper first" >&2
  exit 1
fi
if ip netns list | grep -qE '^(moeA|moeB)( |$)'; then
  echo "two-node-emulation: namespaces moeA/moeB already exist (an earlier run?); remove them with" \
       "'ip netns del moeA; ip netns del moeB'" >&2
  exit 1
fi
if [ ${#ARGS[@]} -eq 0 ]; then
  ARGS=(bench comm --ranks-per-node "$PER_NODE" --sizes 64KiB,256KiB,1MiB --iterations 5
        --tokens 512 --token-bytes 4096 --experts 16 --top-k 4)
fi

WORK=$(mktemp -d /tmp/piper-2node.XXXXXX)
cleanup() {
  for ns in moeA moeB; do
    if ip netns list | grep -qE "^$ns( |$)"; then
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      if [ -n "$pids" ]; then kill $pids 2>/dev/null || true; fi
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

ip netns add moeA
ip netns add moeB
ip link add vA type veth peer name vB
ip link set vA netns moeA
ip link set vB netns moeB
ip -n moeA addr add 10.200.0.1/24 dev vA
ip -n moeB addr add 10.200.0.2/24 dev vB
for ns in moeA moeB; do ip -n "$ns" link set lo up; done
ip -n moeA link set vA up
ip -n moeB link set vB up
ip netns exec moeA tc qdisc add dev vA root tbf rate "$RATE" burst 512kb latency 20ms
ip netns exec moeB tc qdisc add dev vB root tbf rate "$RATE" burst 512kb latency 20ms

# OpenMPI's remote launcher (in place of ssh): host address -> namespace and hostname. Like ssh, it hands the
# command line to a shell.
cat > "$WORK/launch.sh" <<'EOF'
#!/bin/sh
host=$1
shift
case "$host" in
  10.200.0.1) ns=moeA; name=nodeA ;;
  10.200.0.2) ns=moeB; name=nodeB ;;
  *) echo "launch.sh: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $name; $*"
EOF
chmod +x "$WORK/launch.sh"
printf '10.200.0.1 slots=%s\n10.200.0.2 slots=%s\n' "$PER_NODE" "$PER_NODE" > "$WORK/hostfile"

NP=$((2 * PER_NODE))
echo "two-node-emulation: 2 nodes x $PER_NODE ranks, link $RATE (tbf), command: piper ${ARGS[*]}" >&2
MPIRUN=(mpirun --allow-run-as-root --hostfile "$WORK/hostfile" -np "$NP" --map-by "ppr:$PER_NODE:node"
        --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --mca plm_rsh_agent "$WORK/launch.sh"
        --mca btl self,vader,tcp --mca btl_tcp_if_include 10.200.0.0/24 --mca oob_tcp_if_include 10.200.0.0/24
        ${EXTRA_MCA[@]+"${EXTRA_MCA[@]}"})
CMD=$(printf '%q ' "${MPIRUN[@]}" "$BIN" "${ARGS[@]}")
ip netns exec moeA unshare --uts sh -c "hostname nodeA; $CMD"
