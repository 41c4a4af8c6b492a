/* moe generate: tokens from a language model checkpoint (a Hugging Face directory of a family moe.h lists). The
 * prompt runs through the model once, filling the KV cache; each new token then costs one position.
 * --prompt "text" goes through the checkpoint's tokenizer.json (as `moe tokenizer encode` does) and
 * the new tokens' text goes to stdout; --prompt-ids takes ids and prints the new ids, one line. Under
 * mpirun the experts are spread over the ranks: every rank decodes the same sequence and takes rank
 * 0's sample, which rank 0 prints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "lm_budget.h"
#include "lm_data.h"
#include "rank_errors.h"

static const char *CMD = "generate";

static void usage(FILE *f) {
  fprintf(f, "usage: moe generate --checkpoint DIR (--prompt \"text\" | --prompt-ids \"1 2 3\") [--max-tokens N]\n"
             "                    [--temperature T] [--top-p P] [--seed S] [--threads N] [--tokenizer F] [--json]\n"
             "                    [--ignore-eos] [--dtype f32|bf16] [--logprobs N]\n"
             "                    [--memory-budget SIZE [--policy P] [--prefetch auto|on|off] [--page-cache keep|drop]\n"
             "                     [--placement equal|miss-cost --placement-trace T.csv] [--pin-from T.csv [--pin N]]]\n"
             "                    [--trace T.csv]\n"
             "Samples N new tokens (default 32) after the prompt: temperature 0 is greedy (default 1), top-p\n"
             "keeps the most probable tokens up to that mass (default 1); the same seed gives the same tokens.\n"
             "Stops before N at the end of text (config.json's and generation_config.json's eos_token_id,\n"
             "tokenizer_config.json's eos_token, the tokenizer's <|endoftext|>),\n"
             "which is not printed, unless --ignore-eos.\n"
             "--prompt: the text through DIR/tokenizer.json (or --tokenizer F); prints the new text.\n"
             "DIR may be a GGUF file (llama.cpp's format): its tokenizer, EOS ids and weights come from it.\n"
             "--prompt-ids: prints the new token ids on one line. --json: one JSON line at the end instead,\n"
             "{\"prompt_tokens\", \"ids\", with --prompt \"text\" (bytes that are not UTF-8 as U+FFFD), the\n"
             "seconds of the prompt's forward and of the new tokens' (\"prompt_seconds\", \"decode_seconds\") and\n"
             "\"decode_tokens_per_s\", the new tokens' forwards (all but the last) over the latter}.\n"
             "--dtype bf16: the experts' GEMMs in bf16 (bf16 weights and inputs, fp32 accumulation; default f32).\n"
             "--logprobs N (with --json): each new token's log-probability under the model (its softmax at\n"
             "temperature 1) as \"logprobs\", and the N (0 to 20) most probable tokens' as \"top_logprobs\".\n"
             LM_BUDGET_USAGE
             "--trace T.csv: the experts each forward used (step 0 the prompt, then one step a token), as serve\n"
             "--trace writes (rank 0's under mpirun): what --placement-trace, --pin-from and moe cachesim read.\n"
             "With --json, \"experts\": the caches' stats over the prompt and new tokens (hit rate, bytes read\n"
             "per token, stall seconds, prefetch precision and recall; overall and per layer) and \"seconds\".\n");
}

typedef struct {
  const char *ck, *prompt, *text, *tokenizer, *trace;
  int max_tokens, threads, json, ignore_eos;
  int logprobs; /* -1: none; else the alternatives per token */
  moe_dtype dtype;
  float temperature, top_p;
  uint64_t seed;
  lm_budget_opts budget;
} gen_opts;

/* The prompt's ids (at most cap), each checked against the vocabulary; -1 after printing on an error. */
static int parse_ids(const char *s, int vocab, int32_t *ids, int cap) {
  int n = 0;
  for (char *end; *s;) {
    while (*s == ' ' || *s == ',') s++;
    if (!*s) break;
    long v = strtol(s, &end, 10);
    if (end == s || v < 0 || v >= vocab)
      return cli_usage_error(CMD, "--prompt-ids: '%.20s' is not a token id in [0, %d)", s, vocab), -1;
    if (n == cap) return cli_usage_error(CMD, "--prompt-ids: more than %d tokens (max_seq)", cap), -1;
    ids[n++] = (int32_t)v;
    s = end;
  }
  if (!n) return cli_usage_error(CMD, "--prompt-ids: no token ids"), -1;
  return n;
}

static int parse(int argc, char **argv, gen_opts *o) {
  *o = (gen_opts){.max_tokens = 32, .temperature = 1.0f, .top_p = 1.0f, .dtype = MOE_DT_F32, .logprobs = -1};
  lm_budget_defaults(&o->budget);
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json") || cli_flag_is(f, "ignore-eos")) { /* flags without a value */
      if (cli_flag_is(f, "json")) o->json = 1;
      else o->ignore_eos = 1;
      continue;
    }
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    const char *v = argv[++i];
    int ok = 1, seed;
    if (lm_budget_flag(f, v, &o->budget, &ok)) {
    } else if (cli_flag_is(f, "checkpoint")) o->ck = v;
    else if (cli_flag_is(f, "prompt-ids")) o->prompt = v;
    else if (cli_flag_is(f, "prompt")) o->text = v;
    else if (cli_flag_is(f, "tokenizer")) o->tokenizer = v;
    else if (cli_flag_is(f, "trace")) o->trace = v;
    else if (cli_flag_is(f, "max-tokens")) ok = cli_parse_int(v, &o->max_tokens) && o->max_tokens >= 0;
    else if (cli_flag_is(f, "temperature")) ok = cli_parse_float(v, &o->temperature) && o->temperature >= 0;
    else if (cli_flag_is(f, "top-p")) ok = cli_parse_float(v, &o->top_p) && o->top_p > 0 && o->top_p <= 1;
    else if (cli_flag_is(f, "seed")) ok = cli_parse_int(v, &seed) && seed >= 0, o->seed = (uint64_t)seed;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0;
    else if (cli_flag_is(f, "dtype")) ok = moe_dtype_parse(v, "--dtype", &o->dtype) == MOE_OK;
    else if (cli_flag_is(f, "logprobs")) ok = cli_parse_int(v, &o->logprobs) && o->logprobs >= 0 && o->logprobs <= 20;
    else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  if (!o->ck || !o->prompt == !o->text)
    return cli_usage_error(CMD, "--checkpoint and one of --prompt and --prompt-ids are required");
  if (o->logprobs >= 0 && !o->json) return cli_usage_error(CMD, "--logprobs needs --json");
  if (!o->budget.s.budget && o->budget.policy_set) return cli_usage_error(CMD, "--policy needs --memory-budget");
  if (lm_budget_misuse(&o->budget)) return cli_usage_error(CMD, "%s", lm_budget_misuse(&o->budget));
  return 0;
}

/* The ids of --prompt's text (at most cap) through the tokenizer; -1 after printing on an error. */
static int encode_prompt(const moe_tokenizer *t, const char *text, int vocab, int32_t *ids, int cap) {
  size_t len = strlen(text), k = 0;
  int32_t *all = NULL; /* a tokenizer may give more ids than the text has bytes (byte fallback, a prepended "▁") */
  int rc = moe_tokenizer_encode_alloc(t, text, len, 0, &all, &k) != MOE_OK ? cli_fail(CMD)
           : !k ? cli_usage_error(CMD, "--prompt: no text")
           : k > (size_t)cap ? cli_usage_error(CMD, "--prompt: %zu tokens, more than the model's context %d", k, cap)
           : moe_tokenizer_vocab_size(t) != vocab
               ? cli_usage_error(CMD, "the tokenizer has %d token ids, the model %d", moe_tokenizer_vocab_size(t),
                                 vocab)
               : 0;
  if (!rc) memcpy(ids, all, k * sizeof *ids);
  free(all);
  return rc ? -1 : (int)k;
}

/* One new token: its text with a tokenizer (what it adds to the text, through d), else its id. */
static int emit(moe_detokenizer *d, int32_t id, int first) {
  const char *b;
  size_t len;
  if (!d) return printf("%s%d", first ? "" : " ", id), 0;
  if (moe_detokenizer_push(d, id, &b, &len)) return cli_fail(CMD);
  fwrite(b, 1, len, stdout);
  return 0;
}

/* The new tokens as one JSON line: their ids, and with a tokenizer their text, bytes that are not UTF-8
 * replaced by U+FFFD (JSON is Unicode; Python's errors="replace" does the same). */
/* The log-probabilities of n tokens (each with top alternatives, their ids and log-probabilities) into o. */
typedef struct {
  int top;         /* alternatives per token, or -1: none */
  float *lp;       /* (max_tokens) */
  int32_t *top_id; /* (max_tokens, top) */
  float *top_lp;   /* (max_tokens, top) */
} gen_logprobs;

static int add_logprobs(cJSON *o, const gen_logprobs *g, int n) {
  cJSON *lp = cJSON_AddArrayToObject(o, "logprobs"), *top = cJSON_AddArrayToObject(o, "top_logprobs");
  int ok = lp && top;
  for (int i = 0; ok && i < n; i++) {
    cJSON *alt = cJSON_CreateArray();
    ok = alt && cJSON_AddItemToArray(lp, cJSON_CreateNumber(g->lp[i])) && cJSON_AddItemToArray(top, alt);
    for (int j = 0; ok && j < g->top; j++) {
      cJSON *e = cJSON_CreateObject();
      ok = e && cJSON_AddItemToArray(alt, e) && cJSON_AddNumberToObject(e, "id", g->top_id[(size_t)i * g->top + j]) &&
           cJSON_AddNumberToObject(e, "logprob", g->top_lp[(size_t)i * g->top + j]);
    }
  }
  return ok;
}

/* The text of the n new tokens after the prompt's np (what a detokenizer following the prompt gives:
 * UTF-8, SentencePiece's first piece keeping its space), malloc'd; NULL on failure. */
static char *continuation(const moe_tokenizer *t, const int32_t *prompt, int np, const int32_t *ids, int n) {
  moe_detokenizer *d = NULL;
  char *text = NULL;
  size_t len = 0, k;
  const char *b;
  int ok = moe_detokenizer_new(&d, t) == MOE_OK && moe_detokenizer_follow(d, prompt, (size_t)np) == MOE_OK;
  for (int i = 0; ok && i <= n; i++) {
    ok = (i < n ? moe_detokenizer_push(d, ids[i], &b, &k) : moe_detokenizer_flush(d, &b, &k)) == MOE_OK;
    char *p = ok ? realloc(text, len + k + 1) : NULL;
    if (!p) ok = 0;
    else {
      if (k) memcpy(p + len, b, k);
      len += k, p[len] = 0, text = p;
    }
  }
  moe_detokenizer_free(d);
  if (!ok) free(text);
  return ok ? text : NULL;
}

/* ids follow the prompt's prompt_tokens in one buffer. */
/* times: the prompt's forward and the new tokens' (each token's forward and sample), in seconds. */
static int print_json(const moe_tokenizer *t, const int32_t *ids, int n, int prompt_tokens, const gen_logprobs *g,
                      const double times[2], cJSON *experts) {
  cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateArray();
  int ok = o && a;
  for (int i = 0; ok && i < n; i++) ok = cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i])) && cJSON_GetArraySize(a) == i + 1;
  char *utf = NULL;
  if (ok && t) ok = (utf = continuation(t, ids - prompt_tokens, prompt_tokens, ids, n)) != NULL;
  if (ok) {
    cJSON_AddNumberToObject(o, "prompt_tokens", prompt_tokens);
    cJSON_AddItemToObject(o, "ids", a), a = NULL;
    if (utf) cJSON_AddStringToObject(o, "text", utf);
    cJSON_AddNumberToObject(o, "prompt_seconds", times[0]);
    cJSON_AddNumberToObject(o, "decode_seconds", times[1]);
    if (n > 1) cJSON_AddNumberToObject(o, "decode_tokens_per_s", (n - 1) / times[1]); /* the last has no forward */
    ok = g->top < 0 || add_logprobs(o, g, n);
    if (ok && experts) cJSON_AddItemToObject(o, "experts", experts), experts = NULL;
  }
  if (ok) {
    cli_json_line(o), o = NULL;
  }
  cJSON_Delete(o);
  cJSON_Delete(a);
  cJSON_Delete(experts);
  free(utf);
  return ok ? 0 : cli_usage_error(CMD, "out of memory for the JSON line");
}

/* Expert-parallel: rank 0's token on every rank (their logits may differ in the last bits). */
static int rank0_token(const moe_dist *d, int32_t *id) {
  double v = moe_dist_rank(d) == 0 ? *id : 0;
  if (moe_dist_size(d) < 2) return 0;
  if (moe_dist_allreduce(d, &v, 1) != MOE_OK) return cli_fail(CMD);
  *id = (int32_t)v;
  return 0;
}

/* The experts the last decode through kv used, as trace step `step` (nothing without a trace). */
static int trace_step(moe_trace_writer *w, const moe_lm_t *m, const moe_lm_cache *kv, int64_t step) {
  if (!w) return 0;
  return moe_trace_writer_add_counts(w, step, moe_lm_cache_expert_counts(kv), m->cfg.n_layers, m->cfg.moe.E) ? cli_fail(CMD) : 0;
}

/* Prompt, then one token at a time until an id of eos (n_eos of them; none with --ignore-eos); the new
 * tokens are printed as they come. */
static int run(moe_lm_t *m, const moe_lm_experts *x, const gen_opts *o, const moe_tokenizer *t, int32_t *ids, int n,
               const int32_t *eos, int n_eos, moe_trace_writer *trace) {
  double t0 = cli_now();
  const moe_lm_config *c = &m->cfg;
  if (n + o->max_tokens > c->max_seq)
    return cli_usage_error(CMD, "the prompt (%d tokens) and --max-tokens %d exceed the model's context of %d", n,
                           o->max_tokens, c->max_seq);
  gen_logprobs g = {o->logprobs < c->vocab ? o->logprobs : c->vocab, NULL, NULL, NULL};
  size_t nt = (size_t)o->max_tokens * (g.top > 0 ? (size_t)g.top : 1);
  if (g.top >= 0 && (!(g.lp = malloc(nt * 4 + 4)) || !(g.top_id = malloc(nt * 4 + 4)) || !(g.top_lp = malloc(nt * 4 + 4)))) {
    free(g.lp), free(g.top_id), free(g.top_lp);
    return cli_usage_error(CMD, "out of memory for --logprobs");
  }
  moe_lm_cache *kv;
  if (moe_lm_cache_new(&kv, m, 1)) return free(g.lp), free(g.top_id), free(g.top_lp), cli_fail(CMD);
  moe_lm_cache_last_logits(kv, 1); /* the prompt's next token only */
  uint64_t rng = o->seed;
  double tp = cli_now();
  int rc = moe_lm_decode(m, kv, ids, n) ? cli_fail(CMD) : trace_step(trace, m, kv, 0);
  double t1 = cli_now();
  int32_t *out = ids + n; /* the new tokens follow the prompt (ids holds both) */
  int k = 0;
  moe_detokenizer *d = NULL;
  if (!rc && t && !o->json && (moe_detokenizer_new(&d, t) || moe_detokenizer_follow(d, ids, (size_t)n))) rc = cli_fail(CMD);
  for (; !rc && k < o->max_tokens; k++) {
    int32_t next;
    if (moe_lm_sample(moe_lm_logits(m), c->vocab, o->temperature, o->top_p, &rng, &next)) {
      rc = cli_fail(CMD);
      break;
    }
    if ((rc = cli_settle(m->cfg.moe.dist, CMD, rank0_token(m->cfg.moe.dist, &next)))) break;
    if (!o->ignore_eos && lm_is_eos(eos, n_eos, next)) break;
    if (g.top >= 0 && (rc = moe_lm_logprobs(moe_lm_logits(m), c->vocab, next, g.top, &g.lp[k],
                                            g.top_id + (size_t)k * g.top, g.top_lp + (size_t)k * g.top) ? cli_fail(CMD) : 0))
      break;
    if (k + 1 < o->max_tokens && (moe_lm_decode(m, kv, &next, 1) ? cli_fail(CMD) : trace_step(trace, m, kv, k + 1))) {
      rc = 1; /* rank 0's token on every rank */
      break;
    }
    out[k] = next;
    if (!o->json) {
      if ((rc = emit(d, next, k == 0))) break;
      fflush(stdout);
    }
  }
  const char *rest;
  size_t len;
  if (d && !rc && moe_detokenizer_flush(d, &rest, &len)) rc = cli_fail(CMD);
  else if (d && !rc) fwrite(rest, 1, len, stdout);
  moe_detokenizer_free(d);
  if (!o->json) printf("\n");
  else if (!rc) {
    cJSON *experts = lm_budget_json(x, &o->budget, n + k);
    if (experts) cJSON_AddNumberToObject(experts, "seconds", cli_now() - t0);
    rc = print_json(t, out, k, n, &g, (double[2]){t1 - tp, cli_now() - t1}, experts);
  }
  moe_lm_cache_free(kv);
  free(g.lp), free(g.top_id), free(g.top_lp);
  return rc;
}

static int generate(int argc, char **argv, moe_dist *dist) {
  gen_opts o;
  if (parse(argc, argv, &o)) return 1;
  moe_lm_config c;
  moe_lm_t m;
  if (moe_lm_read_config(o.ck, &c)) return cli_fail(CMD);
  c.moe.threads = o.threads;
  c.moe.dtype = o.dtype;
  c.moe.dist = dist;
  moe_lm_experts x;
  if (cli_settle(dist, CMD, lm_budget_load(&m, o.ck, &c, &o.budget, &x) ? cli_fail(CMD) : 0)) {
    if (m.st) moe_lm_free(&m); /* loaded here, not on another rank */
    return 1;
  }
  /* the prompt (no more tokens than bytes) and the new tokens, not the whole context */
  size_t want = strlen(o.prompt ? o.prompt : o.text) + (size_t)o.max_tokens;
  int cap = want < (size_t)c.max_seq ? (int)want : c.max_seq;
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  moe_tokenizer *t = NULL;
  char path[4096];
  lm_tokenizer_path(o.ck, path, sizeof path);
  int n = !ids ? (cli_usage_error(CMD, "out of memory"), -1)
          : o.prompt ? parse_ids(o.prompt, c.vocab, ids, cap)
          : moe_tokenizer_load(&t, o.tokenizer ? o.tokenizer : path) != MOE_OK ? (cli_fail(CMD), -1)
          : encode_prompt(t, o.text, c.vocab, ids, cap);
  int32_t eos[MOE_LM_MAX_EOS];
  int n_eos = 0;
  int rc = cli_settle(dist, CMD, n < 0 || (moe_lm_eos_ids(o.ck, t, c.vocab, eos, MOE_LM_MAX_EOS, &n_eos) && cli_fail(CMD)));
  moe_trace_writer *trace = NULL;
  if (!rc && o.trace && (!dist || moe_dist_rank(dist) == 0) && moe_trace_writer_open(&trace, o.trace, 0)) rc = cli_fail(CMD);
  if (!rc) rc = run(&m, &x, &o, t, ids, n, eos, n_eos, trace);
  if (moe_trace_writer_close(trace) && !rc) rc = cli_fail(CMD);
  free(ids);
  moe_tokenizer_free(t);
  moe_lm_free(&m);
  moe_lm_experts_free(&x);
  return rc;
}

int cmd_generate(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) return usage(stdout), 0;
  moe_dist *dist;
  int rc = lm_dist_start(CMD, &dist, &argc, &argv);
  if (!rc) rc = generate(argc, argv, dist);
  return cli_dist_end(dist, CMD, rc); /* a failure not settled stops every rank: some may be in a collective */
}
