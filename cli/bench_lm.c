/* moe bench --lm: a language model's prefill and decode speed, as llama.cpp's llama-bench measures
 * its pp and tg tests (so that the two compare on the same model): prefill runs P tokens through an
 * empty KV cache in one call; decode runs N tokens one call each from an empty cache; the tokens are
 * fixed pseudo-random ids (no sampling, as llama-bench), and each call's logits those of its last
 * position only (as llama-bench's batches ask). One untimed run of each first, then R timed. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define CMD "bench"

typedef struct {
  const char *lm;
  int prompt, gen, reps, threads, json;
  moe_dtype dtype;
} lm_opts;

static int parse(int argc, char **argv, lm_opts *o) {
  *o = (lm_opts){.prompt = 512, .gen = 128, .reps = 3, .dtype = MOE_DT_F32};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { o->json = 1; continue; }
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    const char *v = argv[++i];
    int ok = 1;
    if (cli_flag_is(f, "lm")) o->lm = v;
    else if (cli_flag_is(f, "prompt_tokens")) ok = cli_parse_int(v, &o->prompt) && o->prompt >= 0;
    else if (cli_flag_is(f, "gen_tokens")) ok = cli_parse_int(v, &o->gen) && o->gen >= 0;
    else if (cli_flag_is(f, "reps")) ok = cli_parse_int(v, &o->reps) && o->reps >= 1 && o->reps <= 100;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0;
    else if (cli_flag_is(f, "dtype")) ok = moe_dtype_parse(v, "--dtype", &o->dtype) == MOE_OK;
    else return cli_usage_error(CMD, "with --lm: unknown flag %s", f);
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  return 0; /* both 0: the load alone */
}

/* Seconds of one run: n tokens through an empty cache, all in one call (prefill) or one call each. */
static int run(moe_lm_t *m, const int32_t *ids, int n, int one_by_one, double *secs) {
  moe_lm_cache *kv;
  if (moe_lm_cache_new(&kv, m, 1)) return cli_fail(CMD);
  moe_lm_cache_last_logits(kv, 1);
  double t0 = cli_now();
  int rc = 0;
  for (int i = 0; !rc && i < n; i += one_by_one ? 1 : n) rc = moe_lm_decode(m, kv, ids + i, one_by_one ? 1 : n) ? cli_fail(CMD) : 0;
  *secs = cli_now() - t0;
  moe_lm_cache_free(kv);
  return rc;
}

/* Bytes a value of type t takes. */
static double value_bytes(moe_gguf_type t) { return (double)moe_gguf_type_block_bytes(t) / moe_gguf_type_block(t); }

/* The weights one decode step reads, in bytes: every parameter but the experts no token uses (E - k
 * in each MoE layer) and the embedding rows but one, each at the size of the type it is computed in
 * (a GGUF file's weights kept in their quantized type, moe_lm_param_type; fp32 ones at 4 bytes); the
 * used experts at their stored size (quantized experts, bound bytes, are no parameters: blocks of each
 * projection's type, moe_layer_expert_type; fp32 experts at dsize bytes a value). */
static double active_bytes(const moe_lm_t *m, int dsize) {
  const moe_lm_config *c = &m->cfg;
  int q = c->moe.expert_type > 0;
  double b = 0, matrix = (double)c->moe.H * c->moe.D;
  for (int i = 0; i < m->nrefs; i++) b += value_bytes(moe_lm_param_type(m, m->refs[i].name)) * m->refs[i].numel;
  for (int i = 0; i < c->n_layers; i++) {
    if (moe_lm_layer_dense(c, i)) continue;
    double per = 0; /* bytes of one expert's values: its three projections */
    for (int fc = 1; fc <= 3; fc++) per += q ? value_bytes(moe_layer_expert_type(&m->layers[i], fc)) : dsize;
    b += matrix * (per * c->moe.top_k - (q ? 0 : 3 * 4.0 * c->moe.E));
  }
  return b - value_bytes(moe_lm_param_type(m, "model.embed_tokens.weight")) * (c->vocab - 1) * c->moe.D * !c->tie_embeddings;
}

int cmd_bench_lm(int argc, char **argv) {
  lm_opts o;
  if (parse(argc, argv, &o)) return 1;
  moe_lm_config c;
  moe_lm_t m;
  if (!o.lm) return cli_usage_error(CMD, "--lm: the model to time (a checkpoint directory)");
  if (moe_lm_read_config(o.lm, &c)) return cli_fail(CMD);
  c.moe.threads = o.threads;
  c.moe.dtype = o.dtype;
  int n = o.prompt > o.gen ? o.prompt : o.gen;
  if (n > c.max_seq) c.max_seq = n; /* the rotary tables and the cache grow as used: a longer context costs nothing */
  double t0 = cli_now();
  if (moe_lm_load(&m, o.lm, &c)) return cli_fail(CMD);
  double load_s = cli_now() - t0; /* what llama-bench leaves out: reported beside, as llama.cpp's load time */
  int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
  if (!ids) return moe_lm_free(&m), cli_usage_error(CMD, "out of memory");
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < n; i++) x = x * 6364136223846793005ull + 1442695040888963407ull, ids[i] = (int32_t)((x >> 33) % (uint64_t)c.vocab);
  const char *names[2] = {"prefill", "decode"};
  int lens[2] = {o.prompt, o.gen}, rc = 0;
  double tps[2][100], med[2] = {0, 0};
  for (int k = 0; k < 2 && !rc; k++) {
    if (!lens[k]) continue;
    double s;
    rc = run(&m, ids, lens[k], k, &s); /* untimed: first touches of the weights and buffers */
    for (int r = 0; r < o.reps && !rc; r++) {
      rc = run(&m, ids, lens[k], k, &s);
      tps[k][r] = lens[k] / s;
    }
    if (!rc) med[k] = cli_median(tps[k], o.reps);
  }
  double bytes = active_bytes(&m, o.dtype == MOE_DT_BF16 ? 2 : 4);
  if (!rc && o.json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", o.lm);
    cJSON_AddNumberToObject(j, "threads", o.threads);
    cJSON_AddStringToObject(j, "dtype", moe_compute_dtype_name(o.dtype));
    cJSON_AddStringToObject(j, "experts", m.cfg.moe.expert_type > 0 ? moe_gguf_type_name((moe_gguf_type)m.cfg.moe.expert_type)
                                                                    : moe_compute_dtype_name(o.dtype));
    for (int k = 0; k < 2; k++) {
      if (!lens[k]) continue;
      char key[32];
      snprintf(key, sizeof key, "%s_tokens", names[k]);
      cJSON_AddNumberToObject(j, key, lens[k]);
      snprintf(key, sizeof key, "%s_tok_s", names[k]);
      cJSON_AddNumberToObject(j, key, med[k]);
    }
    cJSON_AddNumberToObject(j, "decode_weight_bytes", bytes);
    cJSON_AddNumberToObject(j, "load_s", load_s);
    cJSON_AddNumberToObject(j, "mapped_bytes", (double)moe_lm_mapped_bytes(&m));
    cli_json_line(j);
  } else if (!rc) {
    printf("model %s, %s experts, %d threads, %d reps (median, min-max)\n", o.lm,
           m.cfg.moe.expert_type > 0 ? moe_gguf_type_name((moe_gguf_type)m.cfg.moe.expert_type)
                                     : moe_compute_dtype_name(o.dtype),
           o.threads, o.reps);
    printf("load     %.3f s, %.1f MB of the weights mapped from the file\n", load_s, moe_lm_mapped_bytes(&m) / 1e6);
    for (int k = 0; k < 2; k++) {
      if (!lens[k]) continue;
      cli_sort_doubles(tps[k], o.reps);
      printf("%-8s %5d tokens  %10.1f tok/s  (%.1f-%.1f)\n", names[k], lens[k], med[k], tps[k][0], tps[k][o.reps - 1]);
    }
    if (lens[1]) printf("decode reads %.1f MB of weights a token: %.2f GB/s\n", bytes / 1e6, bytes * med[1] / 1e9);
  }
  free(ids);
  moe_lm_free(&m);
  return rc;
}
