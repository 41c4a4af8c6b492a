#!/bin/sh
# libmoe against llama.cpp on the same GGUF files (issue 41): a random Mixtral-shaped model (Llama 2's
# tokenizer, 32000 ids) made by bench/random_lm.py, converted by `moe convert` to each type, timed by
# llama.cpp's llama-bench (pp and tg tests) and by `moe bench --lm` (the same measures: P prompt tokens
# in one call, N tokens one call each, from an empty cache), RUNS alternated runs each (llama.cpp first
# in odd runs, libmoe first in even ones), medians. The CPU is named from /proc/cpuinfo. Nothing of
# llama.cpp is in this repository: give the directory of a build of it (its bin/llama-bench).
# usage: bench/vs_llamacpp.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPES] [THREADS]
#   (default build/moe, 3 runs, types "f32 bf16 q8_0 q4_k", 2 threads; models kept in $WORK, default
#   /tmp/vs_llamacpp; needs data/tokenizers (scripts/get-tokenizers.sh) and /usr/bin/python3 with numpy)
set -e
LLAMA=${1:?usage: bench/vs_llamacpp.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPES] [THREADS]}
MOE=${2:-build/moe}
RUNS=${3:-3}
TYPES=${4:-f32 bf16 q8_0 q4_k}
THREADS=${5:-2}
P=${P:-512}
N=${N:-128}
WORK=${WORK:-/tmp/vs_llamacpp}
BENCH=$LLAMA/bin/llama-bench
[ -x "$BENCH" ] || { echo "vs_llamacpp: no $BENCH" >&2; exit 1; }
mkdir -p "$WORK"
HF=$WORK/mixtral
[ -f "$HF/model.safetensors" ] || /usr/bin/python3 "$(dirname "$0")/random_lm.py" "$HF" --tokenizer data/tokenizers/llama2
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads; prompt $P, decode $N tokens"
echo "| type | llama.cpp prefill tok/s | libmoe prefill tok/s | libmoe / llama.cpp | llama.cpp decode tok/s | libmoe decode tok/s | libmoe / llama.cpp | libmoe decode GB/s |"
echo "|---|---|---|---|---|---|---|---|"
for t in $TYPES; do
  G=$WORK/mixtral-$t.gguf
  [ -f "$G" ] || "$MOE" convert "$HF" "$G" --type "$t" >/dev/null
  rm -f "$WORK"/*.txt
  for r in $(seq "$RUNS"); do
    for side in llama moe; do
      [ $((r % 2)) -eq 0 ] && side=$([ "$side" = llama ] && echo moe || echo llama) # alternate who goes first
      if [ "$side" = llama ]; then
        "$BENCH" -m "$G" -p "$P" -n "$N" -t "$THREADS" -r 1 -o jsonl 2>/dev/null |
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
  awk -v t="$t" -v lp="$lp" -v mp="$mp" -v lt="$lt" -v mt="$mt" -v b="$b" 'BEGIN {
    printf "| %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.1f |\n", t, lp, mp, mp / lp, lt, mt, mt / lt, b * mt / 1e9 }'
done
