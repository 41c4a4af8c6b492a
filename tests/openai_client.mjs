// The official OpenAI JavaScript client (npm `openai`, fetched by scripts/get-openai-client.sh) against
// `moe serve` on 127.0.0.1 (tests/test_openai_client.c runs it): completions and chat completions,
// streamed and not, with stop sequences and logprobs, each equal to what `moe generate` gives or to
// the same request unstreamed; bad requests (malformed JSON, unknown and unimplemented fields, a bad
// role, an oversize body) are 4xx errors the client raises with the server's JSON message.
// Usage: node openai_client.mjs MOE CHECKPOINT OPENAI_PACKAGE_DIR. Exits 1 after naming each failure.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [MOE, CK, PKG] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(path.join(PKG, "index.mjs")).href);
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what), console.error("FAIL:", what);
};

// A copy of CK (links to its files) whose tokenizer_config.json holds a chat template.
const chatCk = CK.replace(/\/$/, "") + "_openai";
fs.rmSync(chatCk, { recursive: true, force: true });
fs.mkdirSync(chatCk);
for (const f of fs.readdirSync(CK)) fs.symlinkSync(path.resolve(CK, f), path.join(chatCk, f));
const TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}a:{% endif %}";
fs.writeFileSync(path.join(chatCk, "tokenizer_config.json"), JSON.stringify({ chat_template: TEMPLATE }));

const server = spawn(MOE, ["serve", "--checkpoint", chatCk, "--port", "0", "--threads", "1", "--max-batch", "4"],
                     { stdio: ["ignore", "pipe", "inherit"] });
const port = await new Promise((resolve, reject) => {
  let line = "";
  server.stdout.on("data", (d) => {
    line += d;
    const m = line.match(/listening on http:\/\/[^:]+:(\d+)/);
    if (m) resolve(Number(m[1]));
  });
  server.on("exit", (code) => reject(new Error(`moe serve exited ${code} before listening: ${line}`)));
});
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0, timeout: 300000 });

// moe generate --json for a prompt: {ids, text}.
const generate = (prompt, maxTokens) =>
  JSON.parse(execFileSync(MOE, ["generate", "--checkpoint", chatCk, "--json", "--threads", "1", "--temperature", "0",
                                "--max-tokens", String(maxTokens), "--ignore-eos", "--prompt", prompt]).toString());

// The streamed completion's text joined, with its last chunk's finish_reason (null in the others).
async function streamed(req) {
  let text = "", finish = null, n = 0;
  for await (const chunk of await client.completions.create({ ...req, stream: true })) {
    check(finish === null, `${req.prompt}: a chunk after the one with finish_reason ${finish}`);
    text += chunk.choices[0].text;
    finish = chunk.choices[0].finish_reason;
    n++;
  }
  check(n >= 1, `${req.prompt}: no chunk`);
  return { text, finish };
}

try {
  for (const prompt of ["the cat sat", "experts route", "caf\u00e9"]) {
    const want = generate(prompt, 12);
    const req = { model: "moe", prompt, max_tokens: 12, temperature: 0, ignore_eos: true };
    const c = await client.completions.create(req);
    check(c.object === "text_completion" && c.choices.length === 1, `completion shape ${JSON.stringify(c)}`);
    check(c.choices[0].text === want.text, `${prompt}: ${JSON.stringify(c.choices[0].text)}, moe generate ${JSON.stringify(want.text)}`);
    check(c.choices[0].finish_reason === "length", `${prompt}: finish_reason ${c.choices[0].finish_reason}`);
    check(c.usage.completion_tokens === 12 && c.usage.total_tokens === c.usage.prompt_tokens + 12, `usage ${JSON.stringify(c.usage)}`);
    const s = await streamed(req);
    check(s.text === want.text && s.finish === "length", `${prompt} streamed: ${JSON.stringify(s)}, want ${JSON.stringify(want.text)}`);
    // a stop sequence from the middle of the greedy text: the text ends where it starts
    const at = [...want.text].length > 6 ? want.text.indexOf([...want.text].slice(3, 5).join("")) : -1;
    if (at >= 0) {
      const stop = [...want.text].slice(3, 5).join("");
      for (const stream of [false, true]) {
        const r = stream ? await streamed({ ...req, stop: [stop] })
                         : (({ text, finish_reason }) => ({ text, finish: finish_reason }))((await client.completions.create({ ...req, stop })).choices[0]);
        check(r.text === want.text.slice(0, at) && r.finish === "stop",
              `${prompt} stop ${JSON.stringify(stop)} stream=${stream}: ${JSON.stringify(r)}, want ${JSON.stringify(want.text.slice(0, at))}`);
      }
    }
    // logprobs: one entry a token, each the chosen token's and its 2 alternatives', greedy: the best
    const lp = (await client.completions.create({ ...req, logprobs: 2 })).choices[0].logprobs;
    check(lp.tokens.length === 12 && lp.token_logprobs.length === 12 && lp.top_logprobs.length === 12,
          `${prompt} logprobs lengths ${JSON.stringify(lp).slice(0, 200)}`);
    lp.token_logprobs.forEach((x, i) => {
      const alts = Object.values(lp.top_logprobs[i]);
      check(x <= 0 && alts.length >= 1 && alts.length <= 2 && Math.abs(Math.max(...alts) - x) < 1e-5,
            `${prompt} token ${i}: logprob ${x}, alternatives ${JSON.stringify(lp.top_logprobs[i])}`);
    });
  }

  // chat: the answer a completion of the rendered conversation gives, streamed or not
  const messages = [{ role: "system", content: "be brief" }, { role: "user", content: "a dog" }];
  const rendered = "s:be brief\nu:a dog\na:";
  const base = { model: "moe", max_tokens: 10, temperature: 0, ignore_eos: true };
  const want = (await client.completions.create({ ...base, prompt: rendered })).choices[0].text;
  const chat = await client.chat.completions.create({ ...base, messages, logprobs: true, top_logprobs: 2 });
  const m = chat.choices[0];
  check(chat.object === "chat.completion" && m.message.role === "assistant", `chat shape ${JSON.stringify(chat)}`);
  check(m.message.content === want && m.finish_reason === "length", `chat ${JSON.stringify(m)}, completion ${JSON.stringify(want)}`);
  check(m.logprobs.content.length === 10 && m.logprobs.content.every((t) => t.logprob <= 0 && t.top_logprobs.length === 2),
        `chat logprobs ${JSON.stringify(m.logprobs).slice(0, 200)}`);
  let content = "", role = null, finish = null;
  for await (const chunk of await client.chat.completions.create({ ...base, messages, stream: true })) {
    const d = chunk.choices[0].delta;
    role = role ?? d.role;
    content += d.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  check(content === want && role === "assistant" && finish === "length", `chat streamed ${JSON.stringify({ content, role, finish })}`);
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === "moe", `models ${JSON.stringify(models.data)}`);

  // errors the client raises: 4xx with the server's message
  const refused = async (what, status, msg, call) => {
    try {
      await call();
      check(false, `${what}: no error`);
    } catch (e) {
      check(e instanceof OpenAI.APIError && e.status === status && String(e.message).includes(msg),
            `${what}: ${e.constructor.name} ${e.status} ${e.message}, want ${status} naming ${msg}`);
    }
  };
  await refused("n 2", 400, '"n" 2 is not implemented', () => client.completions.create({ model: "moe", prompt: "hi", n: 2 }));
  await refused("unknown field", 400, 'unknown field "frobnicate"',
                () => client.completions.create({ model: "moe", prompt: "hi", frobnicate: 1 }));
  await refused("bad role", 400, 'role "wizard"',
                () => client.chat.completions.create({ model: "moe", messages: [{ role: "wizard", content: "x" }] }));
  await refused("oversize", 413, "larger than 1 MiB", () => client.completions.create({ model: "moe", prompt: "x".repeat(1 << 21) }));
  const bad = await fetch(`http://127.0.0.1:${port}/v1/completions`, { method: "POST", body: "{", headers: { "Content-Type": "application/json" } });
  const body = await bad.json();
  check(bad.status === 400 && body.error.message.includes("not valid JSON"), `malformed body: ${bad.status} ${JSON.stringify(body)}`);
} catch (e) {
  check(false, `unexpected: ${e.stack || e}`);
} finally {
  server.kill("SIGTERM");
  const code = await new Promise((resolve) => (server.exitCode !== null ? resolve(server.exitCode) : server.on("exit", resolve)));
  check(code === 0, `moe serve exited ${code} after SIGTERM`);
  fs.rmSync(chatCk, { recursive: true, force: true });
}
console.error(`openai client: ${failures.length} failures`);
process.exit(failures.length ? 1 : 0);
