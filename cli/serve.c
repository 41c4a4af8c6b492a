/* moe serve: an HTTP server for a language model checkpoint with continuous batching (DESIGN 4.7).
 * The library's engine (moe_engine) owns the model; libmicrohttpd (serve_http.c) the connections. SIGTERM or
 * SIGINT: new requests get 503, those queued and running finish, then the process exits 0. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "lm_budget.h"
#include "lm_data.h"
#include "serve.h"

static const char *CMD = "serve";

/* The bytes MoE layer l holds its E experts in, biases included: E slots of its cache's layout (cache not
 * NULL: streamed or buffered; a GGUF file's stored types differ per layer), or resident in their stored
 * types (bound or quantized: each projection's rows in its type) beside its fp32 expert parameters (the
 * biases, and a quantized layer's master copy), or in the fp32 (bf16) layout of a slot. */
static size_t held_expert_bytes(const moe_layer_t *l, moe_expert_cache *cache) {
  const moe_layer_config *c = &l->cfg;
  moe_expert_cache_stats cs = {.expert_bytes = moe_expert_cache_slot_bytes(c)};
  if (cache) moe_expert_cache_get_stats(cache, &cs);
  if (cache || c->expert_type <= 0) return (size_t)c->E * cs.expert_bytes;
  size_t bytes = 0;
  const int64_t rows[3] = {c->H, c->D, c->H}, cols[3] = {c->D, c->H, c->D};
  for (int fc = 1; fc <= 3; fc++) {
    moe_gguf_type t = moe_layer_expert_type(l, fc);
    if (fc == 3 && t == MOE_GGUF_F32) continue; /* no fc3: not gated */
    bytes += (size_t)c->E * (size_t)rows[fc - 1] * (size_t)(cols[fc - 1] / moe_gguf_type_block(t)) * moe_gguf_type_block_bytes(t);
  }
  for (int j = 0; j < l->nparams; j++)
    if (!strncmp(l->info[j].name, "experts.", 8)) bytes += l->info[j].numel * 4;
  return bytes;
}

static void usage(FILE *f) {
  fprintf(f, "usage: moe serve --checkpoint DIR [--host 127.0.0.1] [--port 8080] [--max-batch B] [--threads N]\n"
             "                 [--cache K | --memory-budget SIZE] [--policy P] [--prefetch auto|on|off]\n"
             "                 [--page-cache keep|drop] [--placement equal|miss-cost --placement-trace T.csv]\n"
             "                 [--pin-from T.csv [--pin N]]\n"
             "                 [--trace F] [--context N]\n"
             "                 [--max-connections C] [--timeout S] [--dtype f32|bf16]\n"
             "Serves POST /v1/completions (OpenAI's completion request: prompt as text, through DIR/tokenizer.json,\n"
             "or token ids; max_tokens, temperature, top_p, seed, stream, ignore_eos, stop; other fields are\n"
             "refused unless turned off), POST /v1/chat/completions (messages through the chat_template of\n"
             "DIR/tokenizer_config.json; the same fields), GET /v1/models, POST /tokenize, POST /detokenize,\n"
             "GET /health and GET /metrics\n"
             "(Prometheus). A request stops at the end of text (config.json's and generation_config.json's\n"
             "eos_token_id, tokenizer_config.json's eos_token, the tokenizer's <|endoftext|>) unless ignore_eos. Up to B\n"
             "requests (default 32) decode together; others wait in a queue. --port 0: a free port. It listens\n"
             "before loading the model (stderr: \"http://HOST:PORT answers 503 until the model is loaded\"): until\n"
             "then /health says 503 \"loading\" and every request gets 503. Prints\n"
             "\"listening on http://HOST:PORT\" when ready. --cache K: K experts of each\n"
             "MoE layer in memory (default all; any family), the rest read on demand from DIR/model.safetensors, evicting\n"
             "by --policy (default lifo; the model is loaded whole first, then its experts freed).\n"
             LM_BUDGET_USAGE
             "/metrics then has per layer the hit rate, bytes read, stall seconds, prefetch precision, slots and pins.\n"
             "--trace F: the experts each decode step used, as moe trace writes.\n"
             "--context N: a request's prompt and max_tokens at most (default the model's\n"
             "max_position_embeddings). --max-connections C (default 1024): past C connections /health still\n"
             "answers and the rest get 503. --timeout S (default 30): a connection idle S seconds, or a request\n"
             "whose body has not all come S seconds after its headers, is closed (SIGTERM waits no longer).\n"
             "--dtype bf16: the experts' GEMMs in bf16 (bf16 weights and inputs, fp32 accumulation; default f32).\n");
}

typedef struct {
  const char *ck, *host, *trace;
  int port, max_batch, threads, cache;
  moe_dtype dtype;
  lm_budget_opts budget; /* its policy for --cache K too */
  serve_http_opts http;
} serve_opts;

static int parse(int argc, char **argv, serve_opts *o) {
  *o = (serve_opts){.host = "127.0.0.1", .port = 8080, .max_batch = 32, .dtype = MOE_DT_F32,
                    .http = {.max_connections = 1024, .timeout_s = 30}};
  lm_budget_defaults(&o->budget);
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    const char *v = argv[++i];
    int ok = 1;
    if (lm_budget_flag(f, v, &o->budget, &ok)) {
    } else if (cli_flag_is(f, "checkpoint")) o->ck = v;
    else if (cli_flag_is(f, "host")) o->host = v;
    else if (cli_flag_is(f, "trace")) o->trace = v;
    else if (cli_flag_is(f, "port")) ok = cli_parse_int(v, &o->port) && o->port >= 0 && o->port <= 65535;
    else if (cli_flag_is(f, "max-batch")) ok = cli_parse_int(v, &o->max_batch) && o->max_batch >= 1 && o->max_batch <= 4096;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0;
    else if (cli_flag_is(f, "dtype")) ok = moe_dtype_parse(v, "--dtype", &o->dtype) == MOE_OK;
    else if (cli_flag_is(f, "cache")) ok = cli_parse_int(v, &o->cache) && o->cache >= 1;
    else if (cli_flag_is(f, "context")) ok = cli_parse_int(v, &o->http.context) && o->http.context >= 1;
    else if (cli_flag_is(f, "max-connections"))
      ok = cli_parse_int(v, &o->http.max_connections) && o->http.max_connections >= 1 && o->http.max_connections <= 65536;
    else if (cli_flag_is(f, "timeout")) ok = cli_parse_int(v, &o->http.timeout_s) && o->http.timeout_s >= 1;
    else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  if (!o->ck) return cli_usage_error(CMD, "--checkpoint is required");
  if (o->cache && o->budget.s.budget) return cli_usage_error(CMD, "--cache K and --memory-budget: one or the other");
  if (!o->cache && !o->budget.s.budget && o->budget.policy_set)
    return cli_usage_error(CMD, "--policy needs --cache K or --memory-budget");
  if (o->cache && !o->budget.policy_set) o->budget.s.policy = MOE_CACHE_LIFO;
  if (lm_budget_misuse(&o->budget)) return cli_usage_error(CMD, "%s", lm_budget_misuse(&o->budget));
  return 0;
}

/* Room for many connections: the soft limit on open files raised to the hard one. */
static void more_files(void) {
  struct rlimit r;
  if (!getrlimit(RLIMIT_NOFILE, &r) && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

/* The tokenizer of DIR when it has one (text prompts), else NULL (token ids only); -1 on a bad one. */
static int load_tokenizer(const char *dir, moe_tokenizer **t) {
  char path[4096];
  *t = NULL;
  if (!lm_has_tokenizer(dir)) return 0;
  return moe_tokenizer_load(t, lm_tokenizer_path(dir, path, sizeof path)) == MOE_OK ? 0 : -1;
}

/* What the engine's steps feed: the metrics, and the expert trace's rows (step,layer,expert,tokens). */
typedef struct {
  serve_metrics *met;
  moe_trace_writer *trace;
  int64_t step;
  int L, E;
} step_sink;

static void on_step(void *ctx, const moe_engine_step *s) {
  step_sink *k = ctx;
  serve_metrics_step(k->met, s->rows, s->tokens, s->prompt_tokens, s->seconds);
}

static void on_decode(void *ctx, const int32_t *cnt) { /* one row per expert used, per layer */
  step_sink *k = ctx;
  if (!k->trace) return;
  moe_trace_writer_add_counts(k->trace, k->step++, cnt, k->L, k->E); /* a row it cannot keep fails the close */
}

/* Serves until SIGTERM or SIGINT (blocked in every thread, taken here with sigwait), then stops *h
 * (NULL after) before the engine it calls goes. */
static int serve(const serve_opts *o, serve_http **h, int port, moe_lm_t *m, const moe_tokenizer *tok,
                 const moe_chat_template *chat, const int32_t *eos, int n_eos, serve_metrics *met, moe_trace_writer *trace,
                 const sigset_t *sigs) {
  step_sink sink = {met, trace, 0, m->cfg.n_layers, m->cfg.moe.E};
  moe_engine_config ec = {o->max_batch, tok, eos, n_eos, on_step, on_decode, &sink};
  moe_engine *e;
  if (moe_engine_new(&e, m, &ec)) return cli_fail(CMD);
  serve_http_ready(*h, e, &m->cfg, tok, chat);
  printf("listening on http://%s:%d\n", o->host, port);
  fflush(stdout);
  int sig;
  sigwait(sigs, &sig);
  fprintf(stderr, "moe serve: %s: finishing the requests under way\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  moe_engine_drain(e);
  serve_http_stop(*h);
  *h = NULL;
  moe_engine_free(e);
  return 0;
}

/* Loads the model of c (the tokenizer, the end-of-text ids, the expert caches) while *h answers 503,
 * then serves it. */
static int load_and_serve(serve_opts *o, moe_lm_config *c, serve_http **h, int port, serve_metrics *met,
                          const sigset_t *sigs) {
  moe_lm_t m;
  moe_tokenizer *tok = NULL;
  moe_chat_template *chat = NULL;
  moe_lm_experts x;
  if (lm_budget_load(&m, o->ck, c, &o->budget, &x)) return cli_fail(CMD);
  int32_t eos[MOE_LM_MAX_EOS];
  int n_eos = 0;
  char path[4096];
  const char *chat_path = lm_chat_template_path(o->ck, path, sizeof path); /* chat needs it */
  moe_status no_chat = MOE_OK; /* a tokenizer_config.json without a template: chat is refused */
  if ((o->cache && moe_lm_buffer_experts(&m, o->ck, o->cache, o->budget.s.policy, &x)) || load_tokenizer(o->ck, &tok) ||
      moe_lm_eos_ids(o->ck, tok, c->vocab, eos, MOE_LM_MAX_EOS, &n_eos) ||
      (chat_path && (no_chat = moe_chat_template_load(&chat, chat_path)) && no_chat != MOE_ERR_MISSING)) {
    moe_tokenizer_free(tok);
    moe_lm_free(&m);
    moe_lm_experts_free(&x);
    return cli_fail(CMD);
  }
  moe_trace_writer *trace = NULL;
  int rc = 1;
  if (o->trace && moe_trace_writer_open(&trace, o->trace, 0) != MOE_OK) cli_fail(CMD);
  else {
    met->L = c->n_layers, met->caches = x.caches; /* read by /metrics only once h is ready */
    met->all_expert_bytes = 0;
    for (int i = 0; i < c->n_layers; i++)
      if (!moe_lm_layer_dense(c, i)) met->all_expert_bytes += held_expert_bytes(&m.layers[i], x.caches ? x.caches[i] : NULL);
    rc = serve(o, h, port, &m, tok, chat, eos, n_eos, met, trace, sigs);
  }
  if (moe_trace_writer_close(trace) != MOE_OK) rc = cli_fail(CMD);
  moe_chat_template_free(chat);
  moe_tokenizer_free(tok);
  moe_lm_free(&m);
  moe_lm_experts_free(&x); /* after the layers that read from it */
  return rc;
}

int cmd_serve(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) return usage(stdout), 0;
  serve_opts o;
  if (parse(argc, argv, &o)) return 1;
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* before any thread starts: they inherit the mask */
  signal(SIGPIPE, SIG_IGN);
  more_files();
  moe_lm_config c;
  if (moe_lm_read_config(o.ck, &c)) return cli_fail(CMD);
  c.moe.threads = o.threads;
  c.moe.dtype = o.dtype;
  serve_metrics met;
  serve_metrics_init(&met, 0, NULL, 0); /* the model's part once it is loaded */
  serve_http *h;
  int port, rc = 1;
  if (!serve_http_start(&h, o.host, o.port, &met, &o.http, &port)) {
    fprintf(stderr, "moe serve: http://%s:%d answers 503 until the model is loaded\n", o.host, port);
    rc = load_and_serve(&o, &c, &h, port, &met, &sigs);
    if (h) serve_http_stop(h); /* still loading, or the engine failed */
  }
  serve_metrics_free(&met);
  return rc;
}
