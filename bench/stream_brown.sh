#!/bin/sh
# Experts streamed under a small memory budget on the trained Brown LM (DESIGN 4.11, issue 42): hit rate,
# tokens/s, bytes read per token, stall and the prefetch's precision and recall of each policy with
# prefetch off, on and auto (read ahead where it pays), beside the hit rate `moe cachesim` predicts for the same policy (equal without prefetch:
# the cache misses what the simulator says) and Belady's MIN, the bound, on the trace of the same run;
# then LRU with the slots placed by the trace's simulated misses and with half of each layer's slots pinned
# from it. Each run's ids are checked against the whole model's (column same).
#   CK: a checkpoint directory (moe train --task lm's, or any Hugging Face MoE one); without it a small Brown
#       LM is trained into OUT/lm (scripts/get-brown.sh, then moe train --task lm ... --steps STEPS).
#   SLOTS: experts per MoE layer the budget buys (default a quarter of them, at least 1).
# usage: [MOE=build/moe] [OUT=data/stream-brown] [STEPS=1000] [TOKENS=64] [SLOTS=K] [PROMPT_IDS="1 2 3"]
#        bench/stream_brown.sh [CK]
set -eu
cd "$(dirname "$0")/.."
MOE=${MOE:-build/moe}
OUT=${OUT:-data/stream-brown}
PY=${PY:-/usr/bin/python3}
TOKENS=${TOKENS:-64}
mkdir -p "$OUT"
CK=${1:-}
if [ -z "$CK" ]; then
  CK=$OUT/lm
  if [ ! -f "$CK/model.safetensors" ]; then
    scripts/get-brown.sh data/brown >/dev/null
    "$MOE" train --task lm --data data/brown --checkpoint "$CK" --steps "${STEPS:-1000}" --experts 16 --top-k 2 \
      --layers 4 --quiet
  fi
fi
gen() { # extra flags: one JSON line
  # shellcheck disable=SC2086
  "$MOE" generate --checkpoint "$CK" --prompt-ids "${PROMPT_IDS:-1 2 3}" --max-tokens "$TOKENS" --temperature 0 \
    --ignore-eos --json "$@"
}
gen --trace "$OUT/trace.csv" >"$OUT/whole.json"
# E and one slot's bytes from a budget that holds every expert
gen --memory-budget 1T --prefetch off >"$OUT/all.json"
read -r E SLOT LM <<EOF
$($PY -c 'import json,sys; x=json.load(open(sys.argv[1]))["experts"]; l=x["layers"]
print(l[0]["slots"], l[0]["resident_bytes"] // l[0]["slots"], len(l))' "$OUT/all.json")
EOF
K=${SLOTS:-$(( E / 4 > 0 ? E / 4 : 1 ))}
BUDGET=$(( K * SLOT * LM ))
"$MOE" cachesim --trace "$OUT/trace.csv" --policy all --cache "$K" --json >"$OUT/cachesim.json"
echo "# $CK: $LM MoE layers of $E experts, budget $BUDGET bytes ($K slots a layer of $SLOT bytes);" \
     "$TOKENS tokens greedy after the prompt; $(nproc) threads"
printf "%-16s %8s %9s %9s %10s %12s %8s %9s %7s %5s\n" policy prefetch hit_rate sim_hit tok/s bytes/token stall_s precision recall same
row() { # name prefetch json-file
  $PY - "$1" "$2" "$3" "$OUT/whole.json" "$OUT/cachesim.json" <<'PYEOF'
import json, sys
name, ahead, path, whole, sim = sys.argv[1:]
run, ref = json.load(open(path)), json.load(open(whole))
x = run["experts"]
policy = name.split()[0]
overall = [json.loads(l) for l in open(sim) if '"overall"' in l][0]["miss_rate"]
simhit = "%9.3f" % (1 - overall[policy]) if " " not in name else "%9s" % "-"
print("%-16s %8s %9.3f %s %10.1f %12.0f %8.3f %9.3f %7.3f %5s" % (name, ahead, x["hit_rate"], simhit,
      x["tokens"] / x["seconds"], x["bytes_read_per_token"], x["stall_seconds"], x["prefetch_precision"],
      x["prefetch_recall"], "yes" if run["ids"] == ref["ids"] else "NO"))
PYEOF
}
for p in lifo lru fifo lfu lfru; do
  for a in off on auto; do
    gen --memory-budget "$BUDGET" --policy "$p" --prefetch "$a" >"$OUT/$p-$a.json"
    row "$p" "$a" "$OUT/$p-$a.json"
  done
done
$PY -c 'import json,sys; o=[json.loads(l) for l in open(sys.argv[1]) if "\"overall\"" in l][0]
print("%-16s %8s %9s %9.3f   (the bound: Belady MIN over the same trace)" % ("belady", "-", "-", 1 - o["miss_rate"]["belady"]))' \
  "$OUT/cachesim.json"
gen --memory-budget "$BUDGET" --placement miss-cost --placement-trace "$OUT/trace.csv" >"$OUT/lru-place.json"
row "lru miss-cost" auto "$OUT/lru-place.json"
gen --memory-budget "$BUDGET" --pin-from "$OUT/trace.csv" >"$OUT/lru-pin.json"
row "lru pinned" auto "$OUT/lru-pin.json"
