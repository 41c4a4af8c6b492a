#!/bin/sh
# Micro-batch pipelining over a real, bandwidth-limited link (issue 15): two expert-parallel ranks in
# two network namespaces joined by a veth pair, Open MPI over TCP between them (no shared memory),
# each direction rate-limited by tc's token bucket filter (this kernel has no netem). For each rate,
# `moe bench --expert-parallel` times the layer's fwd+bwd with every --pipeline value, side by side
# in one run. Needs root (namespaces, tc); prints SKIP and exits 0 without.
#
#   bench/pipeline_link.sh [--moe build/moe] [--rates 10gbit,1gbit] [--cases M,L | --shape T,D,H,E,k]
#                          [--pipeline 1,2,4 | --parallel-r 0,1,2,auto] [--reps 3]
# --shape: one case of that shape instead of the standard ones; --parallel-r: Tutel's r (issue 17)
# instead of the pipelining degree.
set -eu
MOE=build/moe RATES=10gbit,1gbit CASES=M PIPES=1,2,4 REPS=3 SHAPE= PR=
while [ $# -gt 0 ]; do
  case "$1" in
    --moe) MOE=$2 ;; --rates) RATES=$2 ;; --cases) CASES=$2 ;; --pipeline) PIPES=$2 ;; --reps) REPS=$2 ;;
    --shape) SHAPE=$2 ;; --parallel-r) PR=$2 ;;
    *) echo "usage: $0 [--moe PATH] [--rates R,...] [--cases C,... | --shape T,D,H,E,k]" \
         "[--pipeline N,... | --parallel-r R,...] [--reps R]" >&2; exit 2 ;;
  esac
  shift 2
done
WHAT="--cases $CASES" HOW="--pipeline $PIPES"
[ -z "$SHAPE" ] || WHAT="--shape $SHAPE"
[ -z "$PR" ] || HOW="--parallel-r $PR"
skip() { echo "SKIP: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces and tc)"
for tool in ip tc mpirun; do command -v $tool >/dev/null || skip "needs $tool"; done
[ -x "$MOE" ] || { echo "$0: no moe binary at $MOE (build first: make build)" >&2; exit 1; }
MOE=$(cd "$(dirname "$MOE")" && pwd)/$(basename "$MOE")

A=moe-a-$$ B=moe-b-$$ IPA=10.231.0.1 IPB=10.231.0.2 DIR=$(mktemp -d)
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM
ip netns add $A || skip "cannot create network namespaces here"
ip netns add $B
ip link add va$$ type veth peer name vb$$
ip link set va$$ netns $A
ip link set vb$$ netns $B
ip -n $A addr add $IPA/24 dev va$$
ip -n $B addr add $IPB/24 dev vb$$
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set va$$ up
ip -n $B link set vb$$ up

# mpirun runs in namespace A and starts rank 1 "remotely" in B through this agent instead of ssh. Each
# "host" would bind its rank to its first core, the same core for both: --bind-to none.
cat >"$DIR/agent" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in $IPA) ns=$A ;; $IPB) ns=$B ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$DIR/agent"

# Burst: 4 ms of traffic at the rate (tbf needs at least rate/HZ to reach it), at least 64 KiB.
burst() { echo "$1" | awk '{ r = $1 + 0; u = tolower($1); sub(/^[0-9.]+/, "", u);
  m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; b = r * m / 8 * 0.004;
  if (b < 65536) b = 65536; printf "%d", b }'; }

echo "moe bench over a veth pair between two network namespaces, Open MPI over TCP, 2 ranks x 1 thread"
for rate in $(echo "$RATES" | tr , ' '); do
  for pair in "$A va$$" "$B vb$$"; do
    set -- $pair
    tc -n "$1" qdisc replace dev "$2" root tbf rate "$rate" burst "$(burst "$rate")" latency 50ms
  done
  echo "--- link: $rate each way (tc tbf)"
  ip netns exec $A mpirun --allow-run-as-root --oversubscribe -np 2 --host $IPA,$IPB \
    --bind-to none --mca plm_rsh_agent "$DIR/agent" --mca btl tcp,self --mca oob_tcp_if_include $IPA/24 \
    --mca btl_tcp_if_include $IPA/24 \
    "$MOE" bench --expert-parallel --threads 1 --dispatch dynamic --routing uniform $WHAT $HOW \
    --reps "$REPS"
done
