// Makes tests/fixtures/pretok_unicode.txt (lines of mixed Unicode: Latin, Greek, Cyrillic, CJK, Hangul,
// Arabic, Devanagari with its combining marks, digits of several scripts, emoji, Unicode spaces,
// contractions) and tests/fixtures/pretok_unicode.splits (per line, the UTF-8 byte length of each of its
// pre-tokens under GPT-2's regex as JavaScript runs it with Unicode classes: the reference the
// GPT-2 encoder port on npm, gpt-3-encoder, uses). Left out: the few code points whose \s differs between
// JavaScript, PCRE2 and Python's regex (U+001C-U+001F, U+0085, U+180E, U+FEFF).
//   node dev/gen_pretok_fixture.js tests/fixtures
const fs = require('fs');
const dir = process.argv[2] || 'tests/fixtures';
const re = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const pools = [
  'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ', 'éèêëàâäôöûüçñÉÀßøåæœ', 'αβγδεζηθλμπσωΑΒΓΔΩ',
  'абвгдежзиклмнопрстуфхцчшщыэюяАБВГД', '的一是不了人我在有他这中大来上国个到说们', 'ㄱ한국어가나다라마바사아', 'مرحباالعربيةكتب',
  'नमस्तेहिंदीभाषाकि', '0123456789', '٠١٢٣٤٥٦٧٨٩', '०१२३४५६७८९', '０１２３４５６７８９', '½²³¼',
  '.,;:!?-_()[]{}"/\\@#$%^&*+=<>|~`', '…—–«»¡¿„“”‘’', '🦙😀🚀🌍👍🏽❤️', '   ', '\t', ' \u00a0\u2003\u3000\u2009',
];
const fixed = ["🦙's", "The\u00a0jury said more words", "l'été d'Émile", "don't won't they'll we've I'm",
  "123abc ١٢٣ ४५ ６７", "naïve café  \t résumé", "東京タワー is 333m", "Привет, мир!", "a\u2003b\u3000c  d",
  "emoji👍🏽mixed🚀text", "’s ’t curly 's", "  leading and trailing  ", "x\u00a0\u00a0y", "नमस्ते दुनिया",
  "٣ apples and ४ pears", "½ cup", "ABC—def–ghi…", "tab\tand\u2009thin"];
let s = 7;
const rnd = (n) => { s = (s * 1103515245 + 12345) % 2147483648; return s % n; };
const lines = fixed.slice();
for (let i = 0; i < 300; i++) {
  let line = '';
  const len = 5 + rnd(40);
  for (let j = 0; j < len; j++) {
    const p = Array.from(pools[rnd(pools.length)]);
    line += rnd(9) === 0 ? "'" + 'stmdrvl'[rnd(7)] : p[rnd(p.length)];
  }
  lines.push(line);
}
const splits = lines.map((l) => Array.from(l.matchAll(re), (m) => Buffer.byteLength(m[0])).join(' '));
fs.writeFileSync(dir + '/pretok_unicode.txt', lines.join('\n') + '\n');
fs.writeFileSync(dir + '/pretok_unicode.splits', splits.join('\n') + '\n');
