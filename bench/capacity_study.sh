#!/bin/sh
# DynaMoE Figure 9 on MNIST: static capacity factors 1..4 against dynamic per-expert capacities
# (static dispatch, the default model otherwise). Prints accuracy, wall time, dropped fraction and
# recompiles per run. Usage: bench/capacity_study.sh [build/moe] [epochs]
set -e
MOE=${1:-build/moe}
EPOCHS=${2:-30}
scripts/get-mnist.sh data/mnist >/dev/null
for cap in 1.0 2.0 3.0 4.0 dynamic; do
  start=$(date +%s.%N)
  out=$("$MOE" train --dispatch static --capacity $cap --epochs "$EPOCHS" --json 2>&1)
  end=$(date +%s.%N)
  echo "$out" | python3 -c "
import json, sys
lines = sys.stdin.read().splitlines()
ep = [json.loads(l) for l in lines if l.startswith('{')]
rec = [l for l in lines if l.startswith('dynamic capacity')]
acc = [l for l in lines if l.startswith('test_accuracy=')][-1].split('=')[1]
drop = sum(e['dropped_fraction'] for e in ep) / len(ep)
print('capacity %-8s accuracy %s  wall %6.1f s  mean dropped %.4f  %s' % ('$cap', acc, $end - $start, drop, rec[0] if rec else ''))
"
done
