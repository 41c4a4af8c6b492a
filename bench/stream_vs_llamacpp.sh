#!/bin/sh
# A GGUF model larger than the memory it may use, in libmoe and llama.cpp (issue 42): both processes run in
# one memory cgroup of LIMIT (v1 memory.limit_in_bytes or v2 memory.max; the page cache the process reads
# is charged to it, so llama.cpp's mmap, its default, keeps only what fits) and greedily generate TOKENS
# tokens after the prompt "The history of" (BOS and 3 ids), 2 threads: llama-cli (its eval tokens/s, no
# warm-up run) against `moe generate --memory-budget BUDGET` (default LIMIT less 1 GiB for the dense
# weights, the KV cache and the process; the experts read into a budgeted cache, predicted experts read
# ahead where that pays, the page cache dropped behind its reads). Not llama-bench: its decode feeds one
# token over and over, so every step computes the same hidden states and routes to the same experts,
# which after the first token all sit in the page cache (0.30 tok/s on the 26.6 GB file below where a
# generation gives 0.21).
# The file: Mixtral-8x7B's shape (8 experts of width 14336, hidden 4096, 32 heads, 8 kv heads, top-2) with
# LAYERS layers (default 8: 6.7 GB in Q4_K) of random BF16 weights and Llama 2's tokenizer (vocabulary
# 32000; bench/random_lm.py --pool, data/tokenizers from scripts/get-tokenizers.sh; random routing is
# nearly uniform, the hardest case for a cache), converted by `moe convert` to TYPE (streamed: about 2.7
# GB of memory for the 8 layers' 24 GB). The page cache is dropped before every run (root:
# /proc/sys/vm/drop_caches), the two sides alternate over RUNS rounds, and each run prints its tokens/s,
# its cgroup's peak memory (the page cache it read included), its process's peak resident memory
# (/usr/bin/time's, the file's mapped pages included) and (libmoe) bytes read per token and the cache's
# hit rate. An unlimited round (no cgroup, the file cached after a warm-up) is printed first.
# Nothing of llama.cpp is in this repository: give the directory of a build of it (its bin/llama-cli).
# usage: bench/stream_vs_llamacpp.sh LLAMA_BUILD_DIR DIR [LIMIT (4G)] [RUNS (3)] [TOKENS (16)]
#   env: MOE (build/moe), TYPE (q4_k), LAYERS (8), BUDGET (LIMIT - 1G), KEEP=1 keeps DIR's files,
#   UNLIMITED=0 skips the unlimited round (a file larger than the machine's memory), MOE_FLAGS more flags
#   for moe generate's budgeted runs (--prefetch off, --policy lfu)
set -eu
LLAMA=${1:?usage: bench/stream_vs_llamacpp.sh LLAMA_BUILD_DIR DIR [LIMIT] [RUNS] [TOKENS]}
DIR=${2:?usage: bench/stream_vs_llamacpp.sh LLAMA_BUILD_DIR DIR [LIMIT] [RUNS] [TOKENS]}
LIMIT=${3:-4G}
RUNS=${4:-3}
TOKENS=${5:-16}
MOE=${MOE:-build/moe}
TYPE=${TYPE:-q4_k}
LAYERS=${LAYERS:-8}
BUDGET=${BUDGET:-$((${LIMIT%G} - 1))G}
CLI=$LLAMA/bin/llama-cli
PY=/usr/bin/python3
[ -x "$CLI" ] || { echo "stream_vs_llamacpp: no $CLI" >&2; exit 1; }
[ -w /proc/sys/vm/drop_caches ] || { echo "stream_vs_llamacpp: cannot drop the page cache (run as root)" >&2; exit 1; }
HF=$DIR/mixtral$LAYERS
G=$DIR/mixtral$LAYERS-$TYPE.gguf
if [ ! -f "$G" ]; then
  [ -f "$HF/model.safetensors" ] || $PY "$(dirname "$0")/random_lm.py" "$HF" --tokenizer data/tokenizers/llama2 --family mixtral \
    --layers "$LAYERS" --model 4096 --heads 32 --kv-heads 8 --head-dim 128 --experts 8 --top-k 2 --hidden 14336 \
    --dtype bf16 --pool --max-pos 4096 >/dev/null
  "$MOE" convert "$HF" "$G" --type "$TYPE" >/dev/null
fi
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$HF" "$G"' EXIT

# The cgroup: v1's memory controller where it is mounted, else v2's.
bytes=$(numfmt --from=iec "$LIMIT")
if [ -d /sys/fs/cgroup/memory ]; then
  CG=/sys/fs/cgroup/memory/moe_stream_bench
  mkdir -p "$CG" && echo "$bytes" >"$CG/memory.limit_in_bytes"
  peak() { cat "$CG/memory.max_usage_in_bytes"; }
  reset_peak() { echo 0 >"$CG/memory.max_usage_in_bytes"; }
else
  CG=/sys/fs/cgroup/moe_stream_bench
  mkdir -p "$CG" && echo "$bytes" >"$CG/memory.max"
  peak() { cat "$CG/memory.peak"; }
  reset_peak() { :; } # a new cgroup per run would be needed; v2's peak is the cgroup's since creation
fi
in_cgroup() { sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG" "$@"; }
drop() { sync && echo 3 >/proc/sys/vm/drop_caches; }

RSS=$(mktemp)
llama() { # $1: limited or free; prints "tok/s peak_GiB max_RSS_GiB"
  if [ "$1" = limited ]; then drop && reset_peak; set -- in_cgroup; else set --; fi
  out=$("$@" /usr/bin/time -o "$RSS" -f %M "$CLI" -m "$G" -p "The history of" -n "$TOKENS" --temp 0 --ignore-eos -no-cnv \
        --no-warmup -t 2 2>&1 </dev/null) || { echo "llama-cli failed" >&2; exit 1; }
  p=$([ $# -gt 0 ] && peak || echo 0)
  echo "$out" | grep ' eval time' | grep -v 'prompt eval' | sed -n 's/.*, *\([0-9.]*\) tokens per second.*/\1/p' |
    awk -v p="$p" -v r="$(tail -n 1 "$RSS")" '{ printf "%.3f %.2f %.2f\n", $1, p / 2^30, r / 2^20 }'
}
moe() { # $1: limited or free; prints "tok/s peak_GiB max_RSS_GiB bytes/token hit_rate"
  if [ "$1" = limited ]; then drop && reset_peak; set -- in_cgroup; b="--memory-budget $BUDGET ${MOE_FLAGS:-}"; else set --; b=; fi
  # shellcheck disable=SC2086 # b: flags and their values, or nothing
  out=$("$@" /usr/bin/time -o "$RSS" -f %M "$MOE" generate --checkpoint "$G" --prompt-ids "1 450 4955 310" --max-tokens "$TOKENS" --temperature 0 --ignore-eos \
        --threads 2 $b --json 2>/dev/null) || { echo "moe generate failed" >&2; exit 1; }
  p=$([ $# -gt 0 ] && peak || echo 0)
  echo "$out" | $PY -c '
import json, sys
j = json.loads(next(l for l in sys.stdin.read().splitlines() if l.startswith("{")))
x = j.get("experts") or {}
print("%.3f %.2f %.2f %.0f %.3f" % (j["decode_tokens_per_s"], int(sys.argv[1]) / 2**30, int(sys.argv[2]) / 2**20,
      x.get("bytes_read_per_token", 0), x.get("hit_rate", 1)))' "$p" "$(tail -n 1 "$RSS")"
}

echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), 2 threads; $(basename "$G")" \
     "$(du -h "$G" | cut -f1); cgroup limit $LIMIT, libmoe's budget $BUDGET ${MOE_FLAGS:-}; $TOKENS tokens greedy after \"The history of\""
F="%-9s %-9s %8s %13s %11s %13s %8s\n"
# shellcheck disable=SC2059 # F: the table's format
printf "$F" side memory tok/s cgroup_peak_GiB max_RSS_GiB bytes/token hit_rate
if [ "${UNLIMITED:-1}" = 1 ]; then
  llama free >/dev/null # untimed: the file into the page cache for the unlimited round
  # shellcheck disable=SC2046,SC2059 # each side's figures as fields
  printf "$F" llama.cpp unlimited $(llama free) - -
  # shellcheck disable=SC2046,SC2059
  printf "$F" libmoe unlimited $(moe free)
fi
for r in $(seq "$RUNS"); do
  order="llama moe"; [ $((r % 2)) -eq 0 ] && order="moe llama"
  for side in $order; do
    # shellcheck disable=SC2046,SC2059
    if [ "$side" = llama ]; then printf "$F" llama.cpp "$LIMIT" $(llama limited) - -
    else printf "$F" libmoe "$LIMIT" $(moe limited); fi
  done
done
rm -f "$RSS"
rmdir "$CG" 2>/dev/null || true
