#!/bin/sh
# Experts streamed under a memory budget (DESIGN 4.11) on a model larger than this machine's memory:
# Qwen3-30B-A3B's shape (48 layers, 128 experts, top-8, hidden 2048, expert width 768, 32 heads of 128,
# 4 kv heads; a vocabulary of 32768 instead of 151936, which leaves the experts' 58 GB as they are) with
# random BF16 weights (bench/random_lm.py --pool), written to DIR and deleted at the end (unless KEEP=1).
# Random weights route nearly uniformly: the hardest case for a cache. Decode tokens/s, bytes read per
# token and peak resident memory (/usr/bin/time's maximum RSS) under budgets of 4, 8 and 16 GiB, and
# "page cache": a 1 GiB budget whose reads leave the file's pages to the kernel (--page-cache keep), the
# page cache as the cache, as a model mapped with mmap has (libmoe has no mmap loader; the whole model
# loaded, 116 GB in fp32, does not fit). A budget is skipped when it and the dense weights (fp32) would not
# fit the memory available. The cases run in turn, then again in reverse order (alternated, so that load
# from others on the machine falls on both; PASSES=1: once); each line is one run.
# usage: [KEEP=1] [PASSES=1|2] bench/stream_budget.sh DIR [TOKENS]   (moe in build/; ~62 GB free under DIR)
set -eu
DIR=${1:?usage: bench/stream_budget.sh DIR [TOKENS]}
TOKENS=${2:-8}
MOE=${MOE:-build/moe}
PY=${PY:-/usr/bin/python3}
if [ ! -f "$DIR/model.safetensors" ]; then
  $PY bench/random_lm.py "$DIR" --vocab 32768 --family qwen3_moe --layers 48 --model 2048 --heads 32 --kv-heads 4 \
    --head-dim 128 --experts 128 --top-k 8 --hidden 768 --dtype bf16 --pool
fi
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$DIR"' EXIT
echo "# $(du -h "$DIR/model.safetensors" | cut -f1) model.safetensors; memory $(free -g | awk '/Mem:/{print $2}') GiB;" \
     "$TOKENS new tokens after 1, greedy, bf16 experts, $(nproc) threads"
printf "%-12s %10s %14s %12s %10s %9s %10s\n" case tok/s bytes/token peak_RSS_GiB hit_rate stall_s precision
dense_gib=4 # the fp32 dense weights (3.7 GB) and activations
run() { # case budget page-cache
  avail=$(awk '/MemAvailable/{print int($2 / 1048576)}' /proc/meminfo)
  need=$(( ${2%G} + dense_gib + 2 ))
  if [ "$need" -gt "$avail" ]; then
    printf "%-12s skipped: needs %d GiB, %d GiB available\n" "$1" "$need" "$avail"
    return
  fi
  out=$(/usr/bin/time -f "RSS %M" "$MOE" generate --checkpoint "$DIR" --prompt-ids 1 --max-tokens "$TOKENS" \
        --temperature 0 --ignore-eos --dtype bf16 --memory-budget "$2" --page-cache "$3" --json 2>&1)
  echo "$out" | $PY -c '
import json, sys
lines = sys.stdin.read().splitlines()
j = json.loads(next(l for l in lines if l.startswith("{")))["experts"]
rss = int(next(l for l in lines if l.startswith("RSS "))[4:]) / 1048576
print("%-12s %10.3f %14.0f %12.2f %10.3f %9.1f %10.3f" % (sys.argv[1], j["tokens"] / j["seconds"],
      j["bytes_read_per_token"], rss, j["hit_rate"], j["stall_seconds"], j["prefetch_precision"]))' "$1"
}
for order in $(seq 1 "${PASSES:-2}"); do
  if [ $order = 1 ]; then cases="pagecache 4G 8G 16G"; else cases="16G 8G 4G pagecache"; fi
  for c in $cases; do
    if [ "$c" = pagecache ]; then run "page cache" 1G keep; else run "$c" "$c" drop; fi
  done
done
