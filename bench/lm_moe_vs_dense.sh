#!/bin/sh
# Issue 19's MoE claim: with the same active parameters per token and the same wall-clock budget, the
# MoE language model (8 experts, top-2) against the dense one (`--dense`: one expert as wide as two),
# both on the Brown corpus with one shared tokenizer. Each model first runs 40 steps to measure its
# tokens/s, then as many steps as fit in the budget; validation loss every 1/20 of the run, test
# perplexity at the end, and loss against wall time as an SVG (bench/plot_lm.py).
#
#   bench/lm_moe_vs_dense.sh [SECONDS per model, default 600] [OUT dir, default bench-out/lm]
set -eu
SECS=${1:-600} OUT=${2:-bench-out/lm} MOE=${MOE:-build/moe} THREADS=${THREADS:-2}
[ -x "$MOE" ] || { echo "$0: no moe binary at $MOE (build first: make build)" >&2; exit 1; }
[ -f data/brown/train.txt ] || scripts/get-brown.sh
mkdir -p "$OUT"
[ -f "$OUT/tokenizer.json" ] || "$MOE" tokenizer train --data data/brown --vocab 4096 --out "$OUT/tokenizer.json"
TOKENS_PER_STEP=512 # the defaults: context 64 x batch 8
for model in moe dense; do
  flags="--tokenizer $OUT/tokenizer.json --threads $THREADS --json --quiet"
  [ $model = dense ] && flags="$flags --dense"
  rate=$("$MOE" train --task lm $flags --steps 40 --eval-every 40 --checkpoint "$OUT/cal-$model" |
         sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' | tail -1)
  steps=$(awk -v s="$SECS" -v r="$rate" -v t=$TOKENS_PER_STEP 'BEGIN { printf "%d", s * r / t }')
  echo "$model: $rate tokens/s measured, $steps steps in $SECS s" >&2
  "$MOE" train --task lm $flags --steps "$steps" --eval-every $((steps / 20)) --checkpoint "$OUT/$model" \
    >"$OUT/$model.jsonl"
  "$MOE" eval --task lm --checkpoint "$OUT/$model" --data data/brown --json >"$OUT/$model-test.json"
  echo "$model: $(cat "$OUT/$model-test.json")"
done
python3 bench/plot_lm.py "$OUT" "$OUT/lm_moe_vs_dense.svg"
