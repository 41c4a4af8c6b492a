#!/bin/sh
# DynaMoE Figure 9 on MNIST: static capacity factors 1..4 against dynamic per-expert capacities
# (static dispatch, the default model otherwise). Prints accuracy, wall time, dropped fraction and
# recompiles per run, keeps each run's JSON log in OUT, and draws test accuracy against normalized
# training time into OUT/capacity_study.svg. Usage: bench/capacity_study.sh [build/moe] [epochs] [out]
set -e
MOE=${1:-build/moe}
EPOCHS=${2:-30}
OUT=${3:-data/study}
mkdir -p "$OUT"
scripts/get-mnist.sh data/mnist >/dev/null
for cap in 1.0 2.0 3.0 4.0 dynamic; do
  start=$(date +%s.%N)
  "$MOE" train --dispatch static --capacity $cap --epochs "$EPOCHS" --augment-rotate 0 --augment-scale 0 --json > "$OUT/$cap.jsonl" 2>&1
  end=$(date +%s.%N)
  python3 -c "
import json
lines = open('$OUT/$cap.jsonl').read().splitlines()
ep = [json.loads(l) for l in lines if l.startswith('{\"epoch')]
rec = [l for l in lines if l.startswith('dynamic capacity')]
acc = '%.4f' % [json.loads(l) for l in lines if l.startswith('{\"test_accuracy\"')][-1]['test_accuracy']
drop = sum(e['dropped_fraction'] for e in ep) / len(ep)
print('capacity %-8s accuracy %s  wall %6.1f s  mean dropped %.4f  %s' % ('$cap', acc, $end - $start, drop, rec[0] if rec else ''))
"
done
python3 bench/plot_study.py "$OUT" "$OUT/capacity_study.svg"
