#!/bin/sh
# The main job for now: one MoE layer (swiglu, k=3, dropless) forward and backward from files with
# `moe layer-run`, checked tensor by tensor against the PyTorch reference output.
set -e
MOE=${1:-build/moe}
CASE=tests/fixtures/swiglu_k3_cap1_index_dynamic
OUT=$(mktemp -d)/out.safetensors
"$MOE" --version
"$MOE" layer-run --weights $CASE/w.safetensors --input $CASE/x.safetensors --out "$OUT" --backward --spec
"$MOE" compare "$OUT" $CASE/ref.safetensors --rtol 1e-5
echo "layer-run output matches the PyTorch reference ($CASE)"
rm -rf "$(dirname "$OUT")"
