#!/bin/sh
# Issue 19's MoE claim: with the same active parameters per token and the same wall-clock budget, the
# MoE language model (8 experts, top-2) against the dense one (`--dense`: one expert as wide as two),
# both on the Brown corpus with one shared tokenizer of VOCAB ids. Each model trains for SECONDS of training steps
# (`--time-budget`: evaluations and checkpoints are outside the budget, and the learning-rate schedule
# runs on training seconds, so nothing is calibrated beforehand); validation loss every EVAL steps and
# at the budget's end, test perplexity after (of the last model, and of the one with the lowest
# validation loss: --keep-best, early stopping), loss against training seconds as an SVG
# (bench/plot_lm.py). Then `moe bench` of each model's expert shape (one step's tokens), for the
# experts' GFLOP/s in training against the layer's benchmarked rate.
#
#   bench/lm_moe_vs_dense.sh [SECONDS per model, default 600] [OUT dir, default bench-out/lm]
#   environment: MOE (binary, build/moe), THREADS (2), EVAL (steps between evaluations, 250)
# The configuration: vocabulary 2048, context 64, batch 32 (2048 tokens a step), 2 layers, D 128,
# 8 experts of H 256 top-2 against one of H 512. A batch of 32 windows, not 8: every step's Adam
# update runs over all of the MoE's experts (4 times the dense model's feed-forward weights), which
# 2048 tokens a step pay for 4 times less per token than 512 do, and each expert's GEMMs get 512 rows.
set -eu
SECS=${1:-600} OUT=${2:-bench-out/lm} MOE=${MOE:-build/moe} THREADS=${THREADS:-2} EVAL=${EVAL:-250}
VOCAB=2048 CONTEXT=64 BATCH=32
[ -x "$MOE" ] || { echo "$0: no moe binary at $MOE (build first: make build)" >&2; exit 1; }
[ -f data/brown/train.txt ] || scripts/get-brown.sh
mkdir -p "$OUT"
TOK=$OUT/tokenizer-$VOCAB.json # named by its size: an older run's of another size is not reused
[ -f "$TOK" ] || "$MOE" tokenizer train --data data/brown --vocab $VOCAB --out "$TOK"
for model in moe dense; do
  flags="--tokenizer $TOK --context $CONTEXT --batch $BATCH --threads $THREADS --json --quiet"
  [ $model = dense ] && flags="$flags --dense"
  rm -rf "${OUT:?}/$model" "${OUT:?}/$model-best" # a fresh run, not a resumed one
  "$MOE" train --task lm $flags --time-budget "$SECS" --eval-every "$EVAL" --checkpoint "$OUT/$model" \
    --keep-best "$OUT/$model-best" >"$OUT/$model.jsonl"
  "$MOE" eval --task lm --checkpoint "$OUT/$model" --data data/brown --json >"$OUT/$model-test.json"
  "$MOE" eval --task lm --checkpoint "$OUT/$model-best" --data data/brown --json >"$OUT/$model-best-test.json"
  echo "$model: $(tail -2 "$OUT/$model.jsonl" | head -1)"
  echo "$model: at the budget's end $(cat "$OUT/$model-test.json")"
  echo "$model: at the lowest validation loss $(cat "$OUT/$model-best-test.json")"
done
# The experts' shapes of one step (CONTEXT x BATCH tokens, D 128): MoE 8 experts of H 256 top-2,
# dense one of H 512.
N=$((CONTEXT * BATCH))
"$MOE" bench --shape $N,128,256,8,2 --routing uniform --dispatch dynamic --threads "$THREADS" --reps 20 --json \
  --quiet >"$OUT/bench-moe.json"
"$MOE" bench --shape $N,128,512,1,1 --routing uniform --dispatch dynamic --threads "$THREADS" --reps 20 --json \
  --quiet >"$OUT/bench-dense.json"
for model in moe dense; do
  echo "$model: moe bench of the experts' shape: $(grep -o '"gflops": [0-9.]*' "$OUT/bench-$model.json" | head -1)"
done
python3 bench/plot_lm.py "$OUT" "$OUT/lm_moe_vs_dense.svg"
