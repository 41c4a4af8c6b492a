// Encoding speed of a tokenizer.json under @lenml/tokenizers (transformers.js's tokenizers), measured as
// bench/tokenizer_speed.c measures libmoe's: each line of TEXT (its newline included) one encode call
// without special tokens, REPEATS passes (default 3), the best printed:
//   lenml: <MB/s> MB/s <ids> ids <bytes> bytes
// usage: NODE_PATH=DIR/node_modules node bench/tokenizer_speed.js TOKENIZER_DIR TEXT [REPEATS]
const fs = require('fs');
const { TokenizerLoader } = require('@lenml/tokenizers');
const [dir, textPath, rep] = process.argv.slice(2);
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf-8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf-8')),
});
const buf = fs.readFileSync(textPath);
const text = buf.toString('utf-8');
const lines = text.split(/(?<=\n)/);
let best = Infinity, total = 0;
for (let r = 0; r < (rep ? +rep : 3); r++) {
  total = 0;
  const t0 = process.hrtime.bigint();
  for (const line of lines) total += tok.encode(line, { add_special_tokens: false }).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  if (s < best) best = s;
}
console.log(`lenml: ${(buf.length / best / 1e6).toFixed(2)} MB/s ${total} ids ${buf.length} bytes`);
