#!/bin/sh
# Encoding speed, libmoe against @lenml/tokenizers under node, on the real models' tokenizers
# (scripts/get-tokenizers.sh) and the same text, alternated: for each model, RUNS rounds of
# (libmoe, node), each the best of 3 passes over the text's lines (one encode call per line).
# Prints a table row per model: the medians in MB/s, their ratio, and whether the ids counts agree.
# usage: bench/tokenizer_speed.sh NODE_MODULES_PARENT [TEXT] [RUNS]
#   NODE_MODULES_PARENT: a directory where `npm install @lenml/tokenizers@3.7.2` was run
#   TEXT: default data/brown/test.txt, its first 2 MB at most (scripts/get-brown.sh)
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NPM=${1:?usage: bench/tokenizer_speed.sh NODE_MODULES_PARENT [TEXT] [RUNS]}
TEXT=${2:-}
RUNS=${3:-3}
BIN=$ROOT/build/tokenizer_speed
[ -x "$BIN" ] || { echo "build first: make build" >&2; exit 1; }
if [ -z "$TEXT" ]; then
  TEXT=$(mktemp /tmp/tokenizer_speed.XXXXXX)
  trap 'rm -f "$TEXT"' EXIT
  head -c 2000000 "$ROOT/data/brown/test.txt" > "$TEXT"
fi
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "text: $(wc -c < "$TEXT") bytes, $(wc -l < "$TEXT") lines; $RUNS alternated runs, each the best of 3 passes"
echo "| tokenizer | libmoe MB/s | @lenml/tokenizers MB/s | ratio | ids (libmoe / node) |"
echo "|---|---|---|---|---|"
for model in qwen3 deepseek_v3 gptoss llama2 llama3; do
  dir=$ROOT/data/tokenizers/$model
  [ -f "$dir/tokenizer.json" ] || { echo "| $model | (not fetched) | | | |"; continue; }
  : > /tmp/tokspeed.moe; : > /tmp/tokspeed.node
  for r in $(seq "$RUNS"); do
    "$BIN" "$dir/tokenizer.json" "$TEXT" >> /tmp/tokspeed.moe
    NODE_PATH=$NPM/node_modules node "$ROOT/bench/tokenizer_speed.js" "$dir" "$TEXT" >> /tmp/tokspeed.node
  done
  a=$(awk '{print $2}' /tmp/tokspeed.moe | median); b=$(awk '{print $2}' /tmp/tokspeed.node | median)
  ia=$(awk 'NR==1{print $4}' /tmp/tokspeed.moe); ib=$(awk 'NR==1{print $4}' /tmp/tokspeed.node)
  echo "| $model | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2fx", a/b}') | $ia / $ib |"
done
rm -f /tmp/tokspeed.moe /tmp/tokspeed.node
