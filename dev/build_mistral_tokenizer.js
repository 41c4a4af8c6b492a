// Builds a Hugging Face tokenizer.json from mistral-tokenizer-js (npm), which ships Mistral's and
// Mixtral's 32,000-token vocabulary and 58,980 merges as JavaScript rather than as a tokenizer.json.
// The file has the form of the Hub's Mixtral-8x7B tokenizer.json: BPE with byte_fallback and fuse_unk,
// unk_token <unk>; the normalizer Prepend("▁") then Replace(" " -> "▁") and no pre-tokenizer (as
// Llama 2's); <unk>, <s>, </s> as special added tokens; a post-processor adding <s>; the decoders
// Replace("▁" -> " "), ByteFallback, Fuse, Strip(one leading space). The merges keep the package's
// order (its priorities 1, 3, 5, ... become ranks 0, 1, 2, ...). scripts/get-tokenizers.sh runs it:
//   node dev/build_mistral_tokenizer.js PACKAGE_DIR/mistral-tokenizer.js OUT/tokenizer.json
// Same input, same bytes. Exits non-zero, naming what is wrong, if the package's data is not a BPE
// vocabulary (a merge whose result is not a token, a token twice, no byte tokens).
const fs = require('fs');
const path = require('path');
const { pathToFileURL } = require('url');

function fail(msg) {
  console.error('build_mistral_tokenizer: ' + msg);
  process.exit(1);
}

async function main() {
  const [src, out] = process.argv.slice(2);
  if (!src || !out) fail('usage: node dev/build_mistral_tokenizer.js mistral-tokenizer.js OUT/tokenizer.json');
  const tok = (await import(pathToFileURL(path.resolve(src)).href)).default;
  const byId = tok.vocabById;
  const vocab = Object.create(null); // tokens such as "toString" are no prototype's members
  byId.forEach((s, id) => {
    if (s in vocab) fail(`token ${JSON.stringify(s)} is both id ${vocab[s]} and id ${id}`);
    vocab[s] = id;
  });
  for (let b = 0; b < 256; b++) {
    const s = '<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>';
    if (vocab[s] !== b + 3) fail(`byte token ${s} is not id ${b + 3}`);
  }
  // The package's Map holds "left right" -> priority, in the order of its merge data.
  const merges = [];
  let last = 0;
  for (const [pair, prio] of tok.merges) {
    if (prio <= last) fail(`merge "${pair}" has priority ${prio} after ${last}`);
    last = prio;
    const parts = pair.split(' ');
    if (parts.length !== 2 || !((parts[0] + parts[1]) in vocab)) fail(`merge "${pair}" does not make a token`);
    merges.push(pair);
  }
  const special = (id, content) =>
    ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  const bos = (type_id) => ({ SpecialToken: { id: '<s>', type_id } });
  const json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [special(0, '<unk>'), special(1, '<s>'), special(2, '</s>')],
    normalizer: {
      type: 'Sequence',
      normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }],
    },
    pre_tokenizer: null,
    post_processor: {
      type: 'TemplateProcessing',
      single: [bos(0), { Sequence: { id: 'A', type_id: 0 } }],
      pair: [bos(0), { Sequence: { id: 'A', type_id: 0 } }, bos(1), { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
    },
    decoder: {
      type: 'Sequence',
      decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' },
                 { type: 'Strip', content: ' ', start: 1, stop: 0 }],
    },
    model: {
      type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, vocab, merges,
    },
  };
  fs.mkdirSync(path.dirname(path.resolve(out)), { recursive: true });
  fs.writeFileSync(out + '.tmp', JSON.stringify(json) + '\n');
  fs.renameSync(out + '.tmp', out);
  console.log(`build_mistral_tokenizer: ${out}: ${byId.length} tokens, ${merges.length} merges`);
}

main().catch((e) => fail(String(e && e.stack || e)));
