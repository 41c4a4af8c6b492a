#!/bin/sh
# moe serve under load (BENCHMARKS.md "Serving"): a checkpoint trained briefly on Brown (the shape is
# what counts, not the text), served with every expert resident and with --cache E/4; at concurrency
# 1, 8, 32 and 64 for SECONDS each: ab (apache2-utils) sending non-streamed completions, then
# bench/serve_stream.py's asyncio clients streaming. Prints a table row per run and the expert-cache
# hit rate from /metrics (cache=0: every expert resident), and plots tokens/s against concurrency
# (bench/plot_serve.py) into bench-out/serve/serve_load.svg.
# usage: bench/serve_load.sh [BUILD (build)] [SECONDS (10)] [THREADS (0: all)] [DATA (data/brown)]
set -e
cd "$(dirname "$0")/.."
BUILD=${1:-build}; SECS=${2:-10}; THREADS=${3:-0}; DATA=${4:-data/brown}
MOE=$BUILD/moe
TOKENS=32
command -v ab >/dev/null || { echo "ab not found: apt-get install apache2-utils" >&2; exit 1; }
out=bench-out/serve
mkdir -p $out
CK=$out/ck
# 4 layers of 8 experts (top-2), D 256, H 512: the experts are 80% of the weights
[ -f $CK/model.safetensors ] || $MOE train --task lm --data "$DATA" --vocab 1024 --context 256 --layers 4 --model 256 \
  --heads 8 --kv-heads 4 --experts 8 --hidden 512 --steps 20 --batch 4 --eval-every 20 --eval-windows 4 \
  --threads "$THREADS" --checkpoint $CK --quiet >/dev/null
body=$out/body.json  # ignore_eos: every request TOKENS long
printf '{"prompt": [5, 9, 1, 200], "max_tokens": %d, "temperature": 1.0, "seed": 1, "ignore_eos": true}' $TOKENS >$body

metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1 == k {print $2}'; }

rm -f $out/results.jsonl
for cache in 0 2; do
  flags=""; [ $cache -gt 0 ] && flags="--cache $cache"
  $MOE serve --checkpoint $CK --port 0 --max-batch 64 --threads "$THREADS" $flags >$out/port.txt 2>$out/serve.log &
  pid=$!
  while ! grep -q listening $out/port.txt 2>/dev/null; do kill -0 $pid; sleep 0.1; done
  port=$(sed 's/.*://' $out/port.txt)
  for c in 1 8 32 64; do
    ab -q -t "$SECS" -n 1000000 -c $c -p $body -T application/json "http://127.0.0.1:$port/v1/completions" \
      >$out/ab-$cache-$c.txt 2>&1 || true
    rps=$(awk '/^Requests per second/ {print $4}' $out/ab-$cache-$c.txt)
    p50=$(awk '$1 == "50%" {print $2}' $out/ab-$cache-$c.txt)
    p99=$(awk '$1 == "99%" {print $2}' $out/ab-$cache-$c.txt)
    stream=$(python3 bench/serve_stream.py $port $c "$SECS" $TOKENS)
    tps=$(awk "BEGIN {print ${rps:-0} * $TOKENS}")
    echo "cache=$cache c=$c ab: $tps tokens/s, request p50 $p50 ms p99 $p99 ms; stream: $stream"
    echo "{\"cache\": $cache, \"ab_tokens_per_s\": $tps, \"stream\": $stream}" >>$out/results.jsonl
  done
  hits=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^moe_serve_expert_cache_hit_rate/ {printf "%s ", $2}')
  echo "cache=$cache hit rate per layer: $hits resident expert bytes $(metric moe_serve_resident_expert_bytes)" \
       "of $(metric moe_serve_all_expert_bytes)"
  kill -TERM $pid
  wait $pid
done
python3 bench/plot_serve.py $out/results.jsonl $out/serve_load.svg
