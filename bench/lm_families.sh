#!/bin/sh
# Training speed of each language-model family at moe train --task lm's default size (vocab 4096, D 256,
# 4 layers, 8 heads, 8 experts top-2 of H 256; issue 39): tokens/s of RUNS alternated runs of STEPS steps
# each on the Brown corpus (scripts/get-brown.sh), the families in turn within each run, and the median.
# Qwen2-MoE's shared expert adds a dense FFN of width H beside the routed ones (more compute per token);
# Qwen3-MoE's and OLMoE's q/k norms add little. usage: bench/lm_families.sh [MOE] [RUNS] [STEPS]
set -e
MOE=${1:-build/moe}
RUNS=${2:-3}
STEPS=${3:-40}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAMILIES="mixtral qwen2_moe qwen3_moe olmoe"
for r in $(seq "$RUNS"); do
  for f in $FAMILIES; do
    "$MOE" train --task lm --data data/brown --steps "$STEPS" --threads 2 --eval-every 100000 --eval-windows 1 \
      --json --quiet --family "$f" --checkpoint "$TMP/$f" |
      sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' | head -1 >> "$TMP/$f.txt"
  done
done
echo "| family | tokens/s ($RUNS runs of $STEPS steps) | median | / mixtral |"
echo "|---|---|---|---|"
base=$(sort -n "$TMP/mixtral.txt" | sed -n "$(( (RUNS + 1) / 2 ))p")
for f in $FAMILIES; do
  med=$(sort -n "$TMP/$f.txt" | sed -n "$(( (RUNS + 1) / 2 ))p")
  echo "| $f | $(tr '\n' ' ' < "$TMP/$f.txt")| $med | $(awk -v a="$med" -v b="$base" 'BEGIN { printf "%.2f", a / b }') |"
done
