#!/bin/sh
# moe serve's single-request decode rate against moe generate's on the same model and threads (issue 36:
# serve's within 5% of generate's). moe serve runs (idle between its runs); for each of RUNS alternated
# runs (generate first in odd runs) one streamed greedy request of TOKENS tokens to moe serve
# (bench/serve_compare.py at concurrency 1) and one moe generate of the same prompt (bench/generate_rate.py,
# which loads the model each time, stamping the ids as they come through a pipe). Prints each run's
# two rates, their medians and serve's as a share of generate's.
# usage: bench/serve_vs_generate.sh MODEL [MOE] [RUNS] [THREADS] [TOKENS]
#   (MODEL a checkpoint directory or GGUF file; default build/moe, 5 runs, 2 threads, 64 tokens;
#   files in $WORK, default /tmp/serve_vs_generate)
set -e
MODEL=${1:?usage: bench/serve_vs_generate.sh MODEL [MOE] [RUNS] [THREADS] [TOKENS]}
MOE=${2:-build/moe}
RUNS=${3:-5}
THREADS=${4:-2}
TOKENS=${5:-64}
WORK=${WORK:-/tmp/serve_vs_generate}
HERE=$(dirname "$0")
mkdir -p "$WORK"
"$MOE" serve --checkpoint "$MODEL" --port 0 --threads "$THREADS" --max-batch 32 >"$WORK/moe.out" 2>"$WORK/moe.err" &
PID=$!
trap 'kill $PID 2>/dev/null' EXIT
while ! grep -q listening "$WORK/moe.out"; do kill -0 $PID; sleep 0.1; done
PORT=$(sed 's/.*://' "$WORK/moe.out")
python3 "$HERE/serve_compare.py" "$PORT" moe 1 1 "$TOKENS" >/dev/null # untimed: the first request grows the buffers
rm -f "$WORK/generate.jsonl" "$WORK/serve.jsonl"
for r in $(seq "$RUNS"); do
  order="generate serve"; [ $((r % 2)) -eq 0 ] && order="serve generate"
  for side in $order; do
    if [ "$side" = generate ]; then
      python3 "$HERE/generate_rate.py" "$MOE" "$MODEL" "$THREADS" "$TOKENS" >>"$WORK/generate.jsonl"
    else
      python3 "$HERE/serve_compare.py" "$PORT" moe 1 1 "$TOKENS" >>"$WORK/serve.jsonl"
    fi
  done
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads; $(basename "$MODEL");" \
     "one greedy stream of $TOKENS tokens, $RUNS alternated runs"
python3 - "$WORK/generate.jsonl" "$WORK/serve.jsonl" <<'PY'
import json, statistics, sys
g = [json.loads(l)["decode_tokens_per_s"] for l in open(sys.argv[1])]
s = [json.loads(l)["decode_tokens_per_s_per_request"] for l in open(sys.argv[2])]
print("moe generate decode tok/s:", " ".join("%.1f" % x for x in g))
print("moe serve c=1 decode tok/s:", " ".join("%.1f" % x for x in s))
mg, ms = statistics.median(g), statistics.median(s)
print("medians: generate %.1f, serve %.1f: serve at %.1f%% of generate" % (mg, ms, 100 * ms / mg))
PY
