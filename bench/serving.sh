#!/bin/sh
# Expert buffering, cache policies and placement on a trained model (BENCHMARKS.md, issue 6):
# trains a 16-expert, 2-block MNIST model, records its expert trace over the test split, then runs
# inference with K = 1..16 cached experts per block, the cache simulator and the placement heuristics.
# Usage: bench/serving.sh [build/moe] [outdir]
set -e
MOE=${1:-build/moe}
OUT=${2:-data/serving}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." 2>/dev/null || true
scripts/get-mnist.sh data/mnist >/dev/null
CK=$OUT/moe16.safetensors
[ -f "$CK" ] || "$MOE" train --experts 16 --top-k 2 --blocks 2 --hidden 256 --epochs 8 --augment-rotate 0 --augment-scale 0 --checkpoint "$CK" | tail -1
"$MOE" trace --checkpoint "$CK" --batch 16 --out "$OUT/trace.csv"
echo "K, throughput (samples/s), p50 batch latency (ms), hit rate, resident expert MiB of all"
for K in $(seq 1 16); do
  "$MOE" infer --checkpoint "$CK" --batch 16 --cache $K --policy lifo --json |
    python3 -c "import json,sys; r=json.load(sys.stdin); print('%d, %.0f, %.2f, %.4f, %.2f of %.2f, accuracy %.4f' % ($K, r['samples_per_s'], r['latency_ms_p50'], r['hit_rate'], r['resident_expert_bytes']/2**20, r['all_expert_bytes']/2**20, r['accuracy']))"
done
"$MOE" infer --checkpoint "$CK" --batch 16 --json |
  python3 -c "import json,sys; r=json.load(sys.stdin); print('all-resident: %.0f samples/s, p50 %.2f ms, accuracy %.4f' % (r['samples_per_s'], r['latency_ms_p50'], r['accuracy']))"
for K in 2 4 8; do echo "cachesim K=$K:"; "$MOE" cachesim --trace "$OUT/trace.csv" --policy all --cache $K; done
for M in greedy anticorr; do "$MOE" placement --trace "$OUT/trace.csv" --devices 4 --method $M --out "$OUT/placement-$M.json"; done
"$MOE" plot-trace "$OUT/trace.csv" -o "$OUT/heat.png"
