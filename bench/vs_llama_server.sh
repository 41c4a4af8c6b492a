#!/bin/sh
# moe serve against llama.cpp's llama-server on the same GGUF file (issue 36): a random Mixtral-shaped
# model (bench/random_lm.py, Llama 2's tokenizer; 4 layers, D 512, 8 experts of H 1024, top-2) converted
# by `moe convert` to TYPE (default f32). Both servers run at once on THREADS threads (idle while the
# other is loaded); for each concurrency (1, 8, 32) RUNS alternated runs (llama-server first in odd
# runs) of bench/serve_compare.py: 32 streamed greedy requests of 64 tokens, distinct prompts of 8 ids
# (llama-server's prompt cache off). First, the texts of 8 greedy requests are compared between the
# two servers. Prints medians per concurrency, the CPU named, `moe bench --lm`'s single-stream decode
# rate, and at concurrency 1 `moe generate`'s decode rate on the same prompt (bench/generate_rate.py, one
# run alternated with each c=1 run) beside moe serve's, the figure issue 36 reads serve's c=1 rate
# against (bench/serve_vs_generate.sh does only that comparison). Nothing of llama.cpp is in this repository:
# give the directory of a build of it (its bin/llama-server).
# usage: bench/vs_llama_server.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPE] [THREADS]
#   (default build/moe, 3 runs, f32, 2 threads; the model kept in $WORK, default /tmp/vs_llama_server;
#   N requests of TOKENS tokens per run from the environment, default 32 and 64;
#   needs data/tokenizers (scripts/get-tokenizers.sh) and /usr/bin/python3 with numpy)
set -e
LLAMA=${1:?usage: bench/vs_llama_server.sh LLAMA_BUILD_DIR [MOE] [RUNS] [TYPE] [THREADS]}
MOE=${2:-build/moe}
RUNS=${3:-3}
TYPE=${4:-f32}
THREADS=${5:-2}
WORK=${WORK:-/tmp/vs_llama_server}
N=${N:-32}
TOKENS=${TOKENS:-64}
SERVER=$LLAMA/bin/llama-server
[ -x "$SERVER" ] || { echo "vs_llama_server: no $SERVER" >&2; exit 1; }
HERE=$(dirname "$0")
mkdir -p "$WORK"
HF=$WORK/mixtral
[ -f "$HF/model.safetensors" ] || /usr/bin/python3 "$HERE/random_lm.py" "$HF" --tokenizer data/tokenizers/llama2 \
  --layers 4 --model 512 --heads 8 --kv-heads 4 --experts 8 --top-k 2 --hidden 1024 >/dev/null
G=$WORK/mixtral-$TYPE.gguf
[ -f "$G" ] || "$MOE" convert "$HF" "$G" --type "$TYPE" >/dev/null

"$MOE" serve --checkpoint "$G" --port 0 --threads "$THREADS" --max-batch 32 >"$WORK/moe.out" 2>"$WORK/moe.err" &
MOE_PID=$!
LPORT=$((20000 + $$ % 20000))
"$SERVER" -m "$G" --port $LPORT -t "$THREADS" -tb "$THREADS" -np 32 -c $((32 * 128)) >"$WORK/llama.log" 2>&1 &
LLAMA_PID=$!
trap 'kill $MOE_PID $LLAMA_PID 2>/dev/null' EXIT
while ! grep -q listening "$WORK/moe.out"; do kill -0 $MOE_PID; sleep 0.1; done
MPORT=$(sed 's/.*://' "$WORK/moe.out")
while [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$LPORT/health")" != 200 ]; do kill -0 $LLAMA_PID; sleep 0.2; done

python3 "$HERE/serve_compare.py" "$MPORT" moe --texts 8 $TOKENS >"$WORK/texts_moe.json"
python3 "$HERE/serve_compare.py" "$LPORT" llama --texts 8 $TOKENS >"$WORK/texts_llama.json"
same=$(python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print(sum(x==y for x,y in zip(a,b)))" \
  "$WORK/texts_moe.json" "$WORK/texts_llama.json")

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads; $(basename "$G");" \
     "$N streamed requests of $TOKENS greedy tokens per run, medians of $RUNS alternated runs"
echo "greedy texts identical between the servers: $same of 8"
echo "moe bench --lm decode (one stream, $TOKENS tokens): $("$MOE" bench --lm "$G" --gen-tokens $TOKENS --prompt-tokens 8 --threads "$THREADS" | grep -i -m1 'tg\|decode')"
echo "| concurrency | server | tokens/s | TTFT p50 ms | TTFT p95 ms | latency p50 ms | latency p95 ms | decode tok/s per request |"
echo "|---|---|---|---|---|---|---|---|"
rm -f "$WORK"/run_*.jsonl
for c in 1 8 32; do
  for r in $(seq "$RUNS"); do
    order="llama moe"; [ $((r % 2)) -eq 0 ] && order="moe llama"
    [ "$c" = 1 ] && order="generate $order" && [ $((r % 2)) -eq 0 ] && order="moe llama generate"
    for side in $order; do
      if [ "$side" = generate ]; then
        python3 "$HERE/generate_rate.py" "$MOE" "$G" "$THREADS" $TOKENS >>"$WORK/run_generate.jsonl"
        continue
      fi
      port=$MPORT; [ "$side" = llama ] && port=$LPORT
      python3 "$HERE/serve_compare.py" "$port" "$side" "$c" $N $TOKENS >>"$WORK/run_${side}_$c.jsonl"
    done
  done
  for side in moe llama; do
    python3 - "$WORK/run_${side}_$c.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
m = lambda k: statistics.median(r[k] for r in rows if r[k] is not None)
r = rows[0]
name = "moe serve" if r["server"] == "moe" else "llama-server"
print("| %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |" % (r["concurrency"], name, m("tokens_per_s"), m("ttft_p50_ms"),
      m("ttft_p95_ms"), m("latency_p50_ms"), m("latency_p95_ms"), m("decode_tokens_per_s_per_request")))
PY
  done
done
python3 - "$WORK/run_generate.jsonl" "$WORK/run_moe_1.jsonl" <<'PY'
import json, statistics, sys
g = statistics.median(json.loads(l)["decode_tokens_per_s"] for l in open(sys.argv[1]))
s = statistics.median(json.loads(l)["decode_tokens_per_s_per_request"] for l in open(sys.argv[2]))
print("moe generate decode (one stream, the same prompt and threads): %.1f tok/s; moe serve at concurrency 1: "
      "%.1f tok/s per request, %.1f%% of generate's" % (g, s, 100 * s / g))
PY
