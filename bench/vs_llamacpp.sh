#!/bin/sh
# libmoe against llama.cpp on the same GGUF files (issue 41): a random Mixtral-shaped model (Llama 2's
# tokenizer, 32000 ids) made by bench/random_lm.py, converted by `moe convert` to each type, timed by
# llama.cpp's llama-bench (pp and tg tests) and by `moe bench --lm` (the same measures: P prompt tokens
# in one call, N tokens one call each, from an empty cache), RUNS alternated runs each (llama.cpp first
# in odd runs, libmoe first in even ones), medians. The CPU is named from /proc/cpuinfo. Nothing of
# llama.cpp is in this repository: give the directory of a build of it (its bin/llama-bench).
# Decode reads every active weight once a token, so the machine's read bandwidth (bench/read_bandwidth,
# best of its passes, measured before each side's run, the median of those kept: this machine's
# bandwidth swings between about 30 and 55 GB/s within the hour, and a reading taken apart from the runs
# may be one the runs never saw) bounds it: each side's decode is also given in GB/s (libmoe's count of
# the weight bytes a token reads, times its tokens/s: the same bytes for both) and libmoe's as a share
# of that bound.
# Both sides read the file into memory: libmoe by default (a model that fits: DESIGN 4.8c) and
# llama.cpp with -mmp 0 (its decode was 8-10% faster so than mapped, Q8_0, Zen 4); MMP=1 maps it.
# SHAPE=qwen3: Qwen3-30B-A3B's expert structure at a few hundred MB (64 experts of width 384, top-8, D
# 1024, 16 heads of 64, 4 KV heads, 6 layers) in the Mixtral architecture, since this llama.cpp has no
# qwen3moe: the same routing function as Qwen3's with norm_topk_prob (softmax, top-k, renormalized),
# without Qwen3's q/k norms (a few hundred values a token).
# usage: bench/vs_llamacpp.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPES] [THREADS]
#   (default build/moe, 3 runs, types "f32 bf16 q8_0 q4_k", 2 threads; models kept in $WORK, default
#   /tmp/vs_llamacpp; needs data/tokenizers (scripts/get-tokenizers.sh) and /usr/bin/python3 with numpy;
#   env SHAPE mixtral (default) or qwen3, P prompt tokens (512), N decode tokens (128))
set -e
LLAMA=${1:?usage: bench/vs_llamacpp.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPES] [THREADS]}
MOE=${2:-build/moe}
RUNS=${3:-3}
TYPES=${4:-f32 bf16 q8_0 q4_k}
THREADS=${5:-2}
P=${P:-512}
N=${N:-128}
WORK=${WORK:-/tmp/vs_llamacpp}
SHAPE=${SHAPE:-mixtral}
MMP=${MMP:-0}
BENCH=$LLAMA/bin/llama-bench
READ_BW=$(dirname "$MOE")/read_bandwidth
[ -x "$BENCH" ] || { echo "vs_llamacpp: no $BENCH" >&2; exit 1; }
[ -x "$READ_BW" ] || { echo "vs_llamacpp: no $READ_BW (built with moe)" >&2; exit 1; }
case $SHAPE in
  mixtral) ARGS= ;;
  qwen3) ARGS="--layers 6 --model 1024 --heads 16 --kv-heads 4 --head-dim 64 --experts 64 --top-k 8 --hidden 384" ;;
  *) echo "vs_llamacpp: SHAPE is mixtral or qwen3, not '$SHAPE'" >&2; exit 1 ;;
esac
mkdir -p "$WORK"
rm -f "$WORK/rows.txt"
HF=$WORK/$SHAPE
# shellcheck disable=SC2086 # ARGS: several words
[ -f "$HF/model.safetensors" ] || /usr/bin/python3 "$(dirname "$0")/random_lm.py" "$HF" --tokenizer data/tokenizers/llama2 $ARGS
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
bandwidth() { "$READ_BW" "$THREADS" | awk '{ print $3 }'; }
rm -f "$WORK/bw.txt"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads; $SHAPE shape; prompt $P, decode $N tokens"
echo "| type | llama.cpp prefill tok/s | libmoe prefill tok/s | libmoe / llama.cpp | llama.cpp decode tok/s | libmoe decode tok/s | libmoe / llama.cpp | llama.cpp decode GB/s | libmoe decode GB/s | libmoe share of read bandwidth |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for t in $TYPES; do
  G=$WORK/$SHAPE-$t.gguf
  [ -f "$G" ] || "$MOE" convert "$HF" "$G" --type "$t" >/dev/null
  rm -f "$WORK"/llama_*.txt "$WORK"/moe_*.txt
  for r in $(seq "$RUNS"); do
    for side in llama moe; do
      [ $((r % 2)) -eq 0 ] && side=$([ "$side" = llama ] && echo moe || echo llama) # alternate who goes first
      bandwidth >> "$WORK/bw.txt"
      if [ "$side" = llama ]; then
        "$BENCH" -m "$G" -p "$P" -n "$N" -t "$THREADS" -r 1 -mmp "$MMP" -o jsonl 2>/dev/null |
          sed -n 's/.*"n_prompt": *\([0-9]*\), *"n_gen": *\([0-9]*\).*"avg_ts": *\([0-9.e+]*\).*/\1 \2 \3/p' |
          while read -r np ng ts; do
            if [ "$np" -gt 0 ]; then echo "$ts" >> "$WORK/llama_pp.txt"; else echo "$ts" >> "$WORK/llama_tg.txt"; fi
          done
      else
        "$MOE" bench --lm "$G" --prompt-tokens "$P" --gen-tokens "$N" --threads "$THREADS" --reps 1 --json > "$WORK/moe.json"
        sed -n 's/.*"prefill_tok_s": *\([0-9.e+]*\).*/\1/p' "$WORK/moe.json" >> "$WORK/moe_pp.txt"
        sed -n 's/.*"decode_tok_s": *\([0-9.e+]*\).*/\1/p' "$WORK/moe.json" >> "$WORK/moe_tg.txt"
        sed -n 's/.*"decode_weight_bytes": *\([0-9.e+]*\).*/\1/p' "$WORK/moe.json" > "$WORK/bytes.txt"
      fi
    done
  done
  lp=$(median < "$WORK/llama_pp.txt") lt=$(median < "$WORK/llama_tg.txt")
  mp=$(median < "$WORK/moe_pp.txt") mt=$(median < "$WORK/moe_tg.txt") b=$(cat "$WORK/bytes.txt")
  echo "$t $lp $mp $lt $mt $b" >> "$WORK/rows.txt"
done
BW=$(median < "$WORK/bw.txt")
while read -r t lp mp lt mt b; do
  awk -v t="$t" -v lp="$lp" -v mp="$mp" -v lt="$lt" -v mt="$mt" -v b="$b" -v bw="$BW" 'BEGIN {
    printf "| %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", t, lp, mp, mp / lp, lt, mt, mt / lt,
      b * lt / 1e9, b * mt / 1e9, b * mt / 1e9 / bw }'
done < "$WORK/rows.txt"
echo "read bandwidth $BW GB/s ($THREADS threads, bench/read_bandwidth before each run, median; range $(sort -n "$WORK/bw.txt" | sed -n '1p;$p' | paste -sd- -))"
