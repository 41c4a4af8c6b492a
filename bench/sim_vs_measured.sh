#!/bin/sh
# The simulator against measurement (issue 24): calibrate this machine (`moe simulate --calibrate`),
# then time `moe bench` in one process and `mpirun -np 2 moe bench --expert-parallel`, and print the
# step time (fwd+bwd) the calibrated simulator predicts for each case beside the measured one. Each
# mode calibrates right before it measures, so both see the same load. With --link RATE (root, ip, tc),
# the two ranks run again over bench/pipeline_link.sh's rate-limited veth link: the calibration through
# that script too (a stand-in binary that calibrates instead of benching), then the measurement.
#
#   bench/sim_vs_measured.sh [--moe build/moe] [--cases S,M,L] [--reps 3] [--link 1gbit]
set -eu
MOE=build/moe CASES=S,M,L REPS=3 LINK=
while [ $# -gt 0 ]; do
  case "$1" in
    --moe) MOE=$2 ;; --cases) CASES=$2 ;; --reps) REPS=$2 ;; --link) LINK=$2 ;;
    *) echo "usage: $0 [--moe PATH] [--cases C,...] [--reps R] [--link RATE]" >&2; exit 2 ;;
  esac
  shift 2
done
for tool in jq mpirun; do command -v $tool >/dev/null || { echo "SKIP: needs $tool"; exit 0; }; done
[ -x "$MOE" ] || { echo "$0: no moe binary at $MOE (build first: make build)" >&2; exit 1; }
MOE=$(cd "$(dirname "$MOE")" && pwd)/$(basename "$MOE")
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT INT TERM
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2"
BENCH="bench --routing uniform --dispatch dynamic --cases $CASES --reps $REPS --json"

# predict MACHINE.json RANKS LINK [TABLE]: a row per bench JSON line on stdin (the case's shape from
# it), the measured time from that line or, given, from the bench table's fwd+bwd column.
predict() {
  while read -r line; do
    echo "$line" | jq -e .case >/dev/null 2>&1 || continue
    name=$(echo "$line" | jq -r .case)
    if [ -n "${4:-}" ]; then ms=$(awk -v c="$name" '$1 == c { print $7 }' "$4"); else ms=$(echo "$line" | jq .fwdbwd_ms); fi
    echo "$line" | jq --slurpfile m "$1" --argjson w "$2" \
      '$m[0] + {tokens: (.T / $w | floor), d_model: .D, hidden: .H, experts: .E, top_k: .k}' >"$DIR/case.json"
    pred=$("$MOE" simulate --config "$DIR/case.json" --json | jq .step_s)
    awk -v r="$2" -v c="$name" -v l="$3" -v p="$pred" -v m="$ms" 'BEGIN { q = p * 1e3 / m
      printf "%-6s %-4s %-10s %12.1f %12.1f %8.3f %s\n", r, c, l, p * 1e3, m, q,
             (q > 0.85 && q < 1.15 ? "within 15%" : "OUTSIDE 15%") }'
  done
}

printf "%-6s %-4s %-10s %12s %12s %8s\n" ranks case link predicted_ms measured_ms ratio
"$MOE" simulate --calibrate -o "$DIR/m1.json"
"$MOE" $BENCH | predict "$DIR/m1.json" 1 local
$MPI "$MOE" simulate --calibrate --threads 1 -o "$DIR/m2.json"
$MPI "$MOE" $BENCH --expert-parallel --threads 1 | tee "$DIR/ep.jsonl" | predict "$DIR/m2.json" 2 local
echo "calibrated: one process $(jq -c . "$DIR/m1.json")"
echo "            two ranks   $(jq -c . "$DIR/m2.json")"
[ -n "$LINK" ] || exit 0

# Over the link: pipeline_link.sh starts the two ranks in their namespaces; its --moe runs whatever it
# is given with `bench ...`: first a stand-in that calibrates, then moe itself (table output).
printf '#!/bin/sh\nexec "%s" simulate --calibrate --threads 1 -o "%s"\n' "$MOE" "$DIR/link.json" >"$DIR/calib"
chmod +x "$DIR/calib"
out=$("$HERE/pipeline_link.sh" --moe "$DIR/calib" --rates "$LINK" --cases "$CASES" --pipeline 1 --reps 1)
case "$out" in SKIP*) echo "link $LINK: $out"; exit 0 ;; esac
"$HERE/pipeline_link.sh" --moe "$MOE" --rates "$LINK" --cases "$CASES" --pipeline 1 --reps "$REPS" >"$DIR/link.txt"
predict "$DIR/link.json" 2 "$LINK" "$DIR/link.txt" <"$DIR/ep.jsonl"
echo "            link $LINK   $(jq -c . "$DIR/link.json")"
