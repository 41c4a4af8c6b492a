// Random templates rendered by @huggingface/jinja, for a longer differential check of libmoe's chat
// template renderer than the fixtures of dev/gen_chat_fixtures.js: N expressions (operators, filters,
// tests, methods, slices over a context of every value type), N texts cut by tags with and without
// whitespace control, and N nests of statements (for/else, if/elif, set, namespace, macros, call and
// filter blocks, break/continue). Writes DIR/chat/lang.json in lang.json's form; then
//   MOE_FIXTURES=DIR build/moe_tests --run chat_template_language
// renders each with libmoe and compares (the same text, or an error where the reference fails).
// Left out: what DESIGN 4.9 lists as known differences (break in a macro, printing a function).
//   NODE_PATH=/work/npm-chat/node_modules node dev/gen_chat_random.js SEED N DIR
const fs = require('fs');
const path = require('path');
const { Template } = require('@huggingface/jinja');

let s = Number(process.argv[2] || 1);
const N = Number(process.argv[3] || 2000);
const dir = process.argv[4] || '/tmp/chat_random';
const rnd = (n) => { // mulberry32
  s = s + 0x6D2B79F5 | 0;
  let t = Math.imul(s ^ s >>> 15, 1 | s);
  t = t + Math.imul(t ^ t >>> 7, 61 | t) ^ t;
  return ((t ^ t >>> 14) >>> 0) % n;
};
const pick = (a) => a[rnd(a.length)];

const ectx = {
  i: 7, n: -3, z: 0, f: 2.5, g: 2.0, t: true, u: false, nul: null, s: ' Hello, Wörld! 🦙 ΟΔΟΣ straße İx ', e: '',
  w: 'a b  c\nd', l: [3, 1, 2], ls: ['b', 'A', 'c'], d: { b: 2, a: 1, k: 'v' }, big: 1e21, tiny: 1e-7,
  ms: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'yo' }],
};
const atoms = Object.keys(ectx).concat(['1', '0', '-1', '2.5', '"x"', "'ab'", 'true', 'none', '[1, "a"]', '{"q": 1}',
  'undef', '(1, 2)', '3.0']);
const filters = ['length', 'upper', 'lower', 'trim', 'first', 'last', 'join', 'join(", ")', 'default("D")',
  'default("E", true)', 'tojson', 'tojson(indent=2)', 'tojson(ensure_ascii=true)', 'string', 'int', 'float', 'abs',
  'list', 'reverse', 'sort', 'unique', 'items', 'title', 'capitalize', 'indent', 'indent(2, true)',
  'replace("l", "L")', 'safe', 'map(attribute="role")', 'selectattr("role", "equalto", "user")', 'dictsort', 'bool',
  'sort(reverse=true)'];
const tests = ['defined', 'undefined', 'none', 'string', 'number', 'integer', 'iterable', 'mapping', 'sequence',
  'boolean', 'true', 'false', 'odd', 'even', 'lower', 'upper', 'callable'];
const methods = ['upper()', 'lower()', 'strip()', 'lstrip()', 'rstrip()', 'split()', 'split(",")', 'split(" ", 1)',
  'startswith("H")', 'endswith(" ")', 'replace("o", "0")', 'title()', 'capitalize()', 'get("a")', 'get("zz", 5)',
  'items()', 'keys()', 'values()', 'length'];
const binops = ['+', '-', '*', '/', '//', '%', '**', '~', '==', '!=', '<', '>', '<=', '>=', 'and', 'or', 'in', 'not in'];
function expr(depth) {
  if (depth > 3) return pick(atoms);
  switch (rnd(9)) {
    case 0: case 1: return pick(atoms);
    case 2: return `${expr(depth + 1)} ${pick(binops)} ${expr(depth + 1)}`;
    case 3: return `(${expr(depth + 1)})|${pick(filters)}`;
    case 4: return `(${expr(depth + 1)}) is ${rnd(2) ? 'not ' : ''}${pick(tests)}`;
    case 5: return `(${expr(depth + 1)}).${pick(methods)}`;
    case 6: return `${pick(['not ', '-', ''])}(${expr(depth + 1)})`;
    case 7: return `${expr(depth + 1)} if ${expr(depth + 1)} else ${expr(depth + 1)}`;
    default: return `(${expr(depth + 1)})[${pick(['0', '-1', '1:', ':2', '::-1', '"a"', '"role"'])}]`;
  }
}

const texts = ['', ' ', '  ', '\n', '\n\n', ' \n  ', '\t', 'a', ' b ', 'c\n', '\n  d', '\u00a0', 'x\r\n', '}', '%', '#'];
const dash = () => pick(['', '-']);
function spaced(depth) {
  let out = '';
  for (let j = 0, k = 1 + rnd(4); j < k; j++) {
    out += pick(texts);
    const d = dash;
    const c = depth > 2 ? rnd(3) : rnd(8);
    if (c === 0) out += `{{${d()} ${pick(['"v"', 'x', 'loop.index', 'ns.a', '1 + 2', 'y|trim'])} ${d()}}}`;
    else if (c === 1) out += `{#${d()} note ${d()}#}`;
    else if (c === 2) out += `{%${d()} set x = "s" ~ ${rnd(9)} ${d()}%}`;
    else if (c === 3) out += `{%${d()} if ${pick(['true', 'false', 'x', 'y'])} ${d()}%}${spaced(depth + 1)}{%${d()} else ${d()}%}${spaced(depth + 1)}{%${d()} endif ${d()}%}`;
    else if (c === 4) out += `{%${d()} for i in [1, 2] ${d()}%}${spaced(depth + 1)}{%${d()} endfor ${d()}%}`;
    else if (c === 5) out += `{%${d()} set ns = namespace(a=1) ${d()}%}`;
    else if (c === 6) out += `{%${d()} generation ${d()}%}${spaced(depth + 1)}{%${d()} endgeneration ${d()}%}`;
    else out += `{%${d()} macro m(q) ${d()}%}${spaced(depth + 1)}{%${d()} endmacro ${d()}%}{{ m(1) }}`;
  }
  return out + pick(texts);
}

const vars = ['x', 'y', 'i', 'k', 'v', 'ns.a', 'loop.index', 'loop.first', 'loop.last', 'loop.previtem', 'm.role',
  'm.content', 'messages|length', 'varargs', 'kwargs', 'q'];
const sexpr = () => pick([pick(vars), '"s"', '1', 'none', '[1, 2]', `${pick(vars)} ~ "|"`, `${pick(vars)} is defined`,
  `f(${pick(vars)})`, 'g(1, 2, z=3)', `${pick(vars)}|tojson`, `messages[${rnd(4) - 2}].content`,
  `${pick(vars)} if ${pick(vars)} else "e"`]);
function nest(depth, inMacro) {
  let o = '';
  for (let j = 0, k = 1 + rnd(3); j < k; j++) {
    const c = depth > 2 ? rnd(4) : rnd(11);
    if (c === 0) o += `{{ ${sexpr()} }}`;
    else if (c === 1) o += `{% set ${pick(['x', 'y', 'q'])} = ${sexpr()} %}`;
    else if (c === 2) o += `{% set ns.a = ${sexpr()} %}`;
    else if (c === 3) o += pick(['a', ' ', '\n', '-']);
    else if (c === 4) o += `{% for ${pick(['i', 'm', 'k, v'])} in ${pick(['messages', 'range(3)', '[[1, 2], [3, 4]]', 'd', 'd.items()', 'messages if m.role != "user"', '[]', 'messages[::-1]'])} %}${nest(depth + 1, inMacro)}{% else %}E{% endfor %}`;
    else if (c === 5) o += `{% if ${sexpr()} %}${nest(depth + 1, inMacro)}{% elif ${sexpr()} %}${nest(depth + 1, inMacro)}{% else %}${nest(depth + 1, inMacro)}{% endif %}`;
    else if (c === 6) o += `{% macro ${pick(['f', 'g'])}(p, q=${sexpr()}) %}${nest(depth + 1, true)}{% endmacro %}`;
    else if (c === 7) o += `{% call${pick(['', '(v)'])} ${pick(['f', 'g'])}(${sexpr()}) %}${nest(depth + 1, true)}{% endcall %}`;
    else if (c === 8) o += `{% filter ${pick(['upper', 'trim', 'indent(2)', 'replace("a", "b")'])} %}${nest(depth + 1, inMacro)}{% endfilter %}`;
    else if (c === 9 && !inMacro) o += pick(['{% break %}', '{% continue %}']);
    else o += `{% set x %}${nest(depth + 1, inMacro)}{% endset %}{{ x }}`;
  }
  return o;
}
const nctx = {
  messages: [{ role: 'system', content: 'S' }, { role: 'user', content: 'U' }, { role: 'assistant', content: 'A' }],
  d: { a: 1, b: [2] },
};

const out = [];
function add(name, template, context) {
  let r;
  try {
    r = { expected: new Template(template).render(context) };
  } catch (e) {
    r = { error: String(e.message) };
  }
  out.push({ name, template, context, ...r });
}
for (let k = 0; k < N; k++) add(`expr${k}`, `{{ ${expr(0)} }}`, ectx);
for (let k = 0; k < N; k++) add(`space${k}`, spaced(0), { y: '  yy ' });
for (let k = 0; k < N; k++)
  add(`nest${k}`, '{% set ns = namespace(a=0) %}{% macro f(p) %}<{{ p }}>{% endmacro %}{% macro g(p) %}[{{ p }}]{% endmacro %}' + nest(0, false), nctx);
fs.mkdirSync(path.join(dir, 'chat'), { recursive: true });
fs.writeFileSync(path.join(dir, 'chat', 'lang.json'), JSON.stringify(out));
console.log(`${out.length} templates (${out.filter((x) => x.error).length} failing in the reference) in ${dir}/chat/lang.json`);
