#!/usr/bin/env bash
# Two moe builds' layer steps, alternated on one machine so that its noise falls on both alike:
# PAIRS rounds of `moe bench` (fp32, uniform routing, dynamic dispatch), REF first in odd rounds and NEW
# first in even ones (so that neither always runs after the other), and per case
# the median fwd+bwd of each, NEW's over REF's, and NEW's median roofline ratio (to the sgemm of its
# own runs). A refactor that must not slow the layer is checked by the ratio (BENCHMARKS.md).
#
#   bench/alternate.sh REF_MOE NEW_MOE [PAIRS (5)] [CASES (S,M,L)]
set -eu
if [ $# -lt 2 ] || [ $# -gt 4 ]; then
  sed -n '2,7s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi
REF=$1 NEW=$2 PAIRS=${3:-5} CASES=${4:-S,M,L}
for b in "$REF" "$NEW"; do [ -x "$b" ] || { echo "alternate: $b is not an executable" >&2; exit 2; }; done
OUT=$(mktemp -d "${TMPDIR:-/tmp}/alternate.XXXXXX")
for i in $(seq "$PAIRS"); do
  order="ref new"; [ $((i % 2)) = 0 ] && order="new ref"
  for side in $order; do
    bin=$REF; [ $side = new ] && bin=$NEW
    "$bin" bench --cases "$CASES" --routing uniform --dispatch dynamic --dtype f32 --json --quiet >>"$OUT/$side.jsonl"
  done
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
runs = {s: [json.loads(l) for l in open(f"{out}/{s}.jsonl") if l.startswith("{")] for s in ("ref", "new")}
print(f"{pairs} alternated pairs, fwd+bwd ms (median; each run's own values in order)")
print(f"{'case':5} {'ref':>9} {'new':>9} {'new/ref':>8} {'new roofline':>13}")
for case in dict.fromkeys(r["case"] for r in runs["ref"]):
    m = {s: [r["fwdbwd_ms"] for r in runs[s] if r["case"] == case] for s in runs}
    roof = statistics.median(r["roofline_ratio"] for r in runs["new"] if r["case"] == case)
    ref, new = statistics.median(m["ref"]), statistics.median(m["new"])
    print(f"{case:5} {ref:9.1f} {new:9.1f} {new / ref:8.3f} {roof:13.3f}   ref {m['ref']} new {m['new']}")
PY
rm -rf "$OUT"
