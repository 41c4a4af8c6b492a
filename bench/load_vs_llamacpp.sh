#!/bin/sh
# Load seconds for the same GGUF: libmoe against llama.cpp (issue 36), both mapping the file (their
# defaults) and both reading it (MOE_NO_MMAP=1, llama-bench -mmp 0). A random Mixtral-shaped model
# (bench/random_lm.py, Llama 2's tokenizer; ARGS its size flags, default about 280 MB in f32) is
# converted by `moe convert` to each type. libmoe's figure is moe_lm_load's own seconds (`moe bench
# --lm M --prompt-tokens 0 --gen-tokens 0`, its "load_s"); llama-bench prints no load time, so
# llama.cpp's is the wall time of `llama-bench -p 0 -n 1 -r 1` (load, a warm-up token and one timed
# token, the tokens' time negligible beside the load on such a model) and libmoe's process wall time
# is printed beside it for the same comparison. The page cache is warm (one untimed load of each
# first); RUNS alternated runs, medians. Nothing of llama.cpp is in this repository: give the
# directory of a build of it (its bin/llama-bench).
# usage: bench/load_vs_llamacpp.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPES] [THREADS]
#   (default build/moe, 5 runs, types "f32 bf16 q4_k", 2 threads; ARGS="--layers 3 --model 512
#   --hidden 1024 --heads 8 --kv-heads 4"; the model kept in $WORK, default /tmp/load_vs_llamacpp)
set -e
LLAMA=${1:?usage: bench/load_vs_llamacpp.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPES] [THREADS]}
MOE=${2:-build/moe}
RUNS=${3:-5}
TYPES=${4:-f32 bf16 q4_k}
THREADS=${5:-2}
ARGS=${ARGS:---layers 3 --model 512 --hidden 1024 --heads 8 --kv-heads 4}
WORK=${WORK:-/tmp/load_vs_llamacpp}
BENCH=$LLAMA/bin/llama-bench
[ -x "$BENCH" ] || { echo "load_vs_llamacpp: no $BENCH" >&2; exit 1; }
mkdir -p "$WORK"
HF=$WORK/mixtral
# shellcheck disable=SC2086 # ARGS: several flags
[ -f "$HF/model.safetensors" ] || /usr/bin/python3 "$(dirname "$0")/random_lm.py" "$HF" --tokenizer data/tokenizers/llama2 $ARGS >/dev/null
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
now() { date +%s.%N; }
llama() { # $1: the file, $2: -mmp; the wall seconds
  t0=$(now)
  "$BENCH" -m "$1" -p 0 -n 1 -r 1 -t "$THREADS" -mmp "$2" >/dev/null 2>&1 || { echo "load_vs_llamacpp: llama-bench failed on $1" >&2; exit 1; }
  echo "$t0 $(now)" | awk '{ print $2 - $1 }'
}
moe() { # $1: the file, $2: 1 to read instead of map; "load_s wall_s mapped_bytes"
  t0=$(now)
  j=$(MOE_NO_MMAP=$2 "$MOE" bench --lm "$1" --prompt-tokens 0 --gen-tokens 0 --threads "$THREADS" --json)
  t1=$(now)
  l=$(echo "$j" | sed -n 's/.*"load_s": *\([0-9.e+-]*\).*/\1/p') b=$(echo "$j" | sed -n 's/.*"mapped_bytes": *\([0-9.e+]*\).*/\1/p')
  echo "$l $t0 $t1 $b" | awk '{ print $1, $3 - $2, $4 }'
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads; $(du -m "$HF/model.safetensors" | cut -f1) MB in f32; medians of $RUNS"
echo "| type | file MB | llama.cpp s (mmap) | libmoe process s (mmap) | libmoe load s (mmap) | MB mapped | llama.cpp s (no mmap) | libmoe load s (no mmap) |"
echo "|---|---|---|---|---|---|---|---|"
for t in $TYPES; do
  G=$WORK/mixtral-$t.gguf
  [ -f "$G" ] || "$MOE" convert "$HF" "$G" --type "$t" >/dev/null
  rm -f "$WORK"/*.txt
  llama "$G" 1 >/dev/null && moe "$G" 0 >/dev/null # untimed: the file into the page cache
  for r in $(seq "$RUNS"); do
    for side in llama moe; do
      [ $((r % 2)) -eq 0 ] && side=$([ "$side" = llama ] && echo moe || echo llama) # alternate who goes first
      if [ "$side" = llama ]; then
        llama "$G" 1 >> "$WORK/llama_map.txt"
        llama "$G" 0 >> "$WORK/llama_read.txt"
      else
        moe "$G" 0 >> "$WORK/moe_map.txt"
        moe "$G" 1 >> "$WORK/moe_read.txt"
      fi
    done
  done
  lm=$(median < "$WORK/llama_map.txt") lr=$(median < "$WORK/llama_read.txt")
  ml=$(cut -d' ' -f1 "$WORK/moe_map.txt" | median) mw=$(cut -d' ' -f2 "$WORK/moe_map.txt" | median)
  mb=$(cut -d' ' -f3 "$WORK/moe_map.txt" | median) mr=$(cut -d' ' -f1 "$WORK/moe_read.txt" | median)
  awk -v t="$t" -v f="$(du -m "$G" | cut -f1)" -v lm="$lm" -v mw="$mw" -v ml="$ml" -v mb="$mb" -v lr="$lr" -v mr="$mr" 'BEGIN {
    printf "| %s | %d | %.3f | %.3f | %.3f | %.1f | %.3f | %.3f |\n", t, f, lm, mw, ml, mb / 1e6, lr, mr }'
done
