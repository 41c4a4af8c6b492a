#!/bin/sh
# Fetches the official OpenAI JavaScript client (npm `openai`, version 5.23.2: no dependencies, runs
# under node >= 18) into DATA_DIR/openai/ (its package directory). tests/test_openai_client.c runs
# tests/openai_client.mjs with it against `moe serve`, and skips when it or node is absent. Not
# committed. Usage: scripts/get-openai-client.sh [DATA_DIR] (default <repo>/data/npm). Safe to run
# again: nothing to do when it is there. Needs npm (installed with apt-get if missing).
set -e
SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$SCRIPT_DIR")
DATA_DIR=${1:-$ROOT/data/npm}
VERSION=5.23.2
SHA1=f13e2dc2ef6b88aab6a9b97cdc68d41a1d083c68 # dist.shasum of openai@5.23.2 in the npm registry
. "$SCRIPT_DIR/npm-fetch.sh"
if [ -f "$DATA_DIR/openai/index.mjs" ]; then
  echo "get-openai-client: $DATA_DIR/openai already there"
  exit 0
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/get-openai-client.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
npm_fetch get-openai-client "openai@$VERSION" "openai-$VERSION.tgz" "$SHA1" "$TMP"
mkdir -p "$DATA_DIR"
rm -rf "$DATA_DIR/openai.tmp"
mv "$TMP/package" "$DATA_DIR/openai.tmp"
mv "$DATA_DIR/openai.tmp" "$DATA_DIR/openai" # whole or not at all
echo "get-openai-client: done"
