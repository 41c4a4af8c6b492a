/* Experts streamed from the checkpoint under a memory budget (moe.h, moe_lm_load_streaming): the model
 * is loaded with external experts (moe_lm_load reads no expert tensor then), each MoE layer gets an
 * expert cache over the checkpoint's file, or the shards of its index (lm_shards.h: each shard opened
 * once, on its first expert tensor, and shared by every layer's cache; gpt-oss's fused tensors too,
 * each from its shard), with its share of the budget, and the layer hook (lm_stream.h) predicts the next
 * MoE layer's experts from the current layer's hidden state and prefetches them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"
#include "kernels/gemm.h"
#include "lm_family.h"
#include "lm_gguf.h"
#include "lm_gptoss.h"
#include "lm_shards.h"
#include "lm_stream.h"

/* The predictor's buffers, grown with the rows of a pass. */
struct moe_lm_prefetch {
  moe_expert_cache **caches; /* the model's, by layer (moe_lm_experts.caches) */
  int rows;        /* rows the buffers hold */
  float *xn, *rstd, *logits; /* (rows, D), (rows), (rows, E) */
  int *list;       /* (E) the predicted experts */
  char *mark;      /* (2 E) the predicted experts, and a row's top-k so far */
};

void moe_lm_stream_config_default(moe_lm_stream_config *s) {
  memset(s, 0, sizeof *s);
  s->policy = MOE_CACHE_LRU;
  s->prefetch = MOE_PREFETCH_AUTO;
  s->placement = MOE_LM_PLACE_EQUAL;
}

void moe__lm_prefetch_free(struct moe_lm_prefetch *p) {
  if (!p) return;
  free(p->xn), free(p->rstd), free(p->logits), free(p->list), free(p->mark), free(p);
}

/* The MoE layer after layer i, or -1. */
static int next_moe(const moe_lm_t *m, int i) {
  for (int j = i + 1; j < m->cfg.n_layers; j++)
    if (!moe_lm_layer_dense(&m->cfg, j)) return j;
  return -1;
}

/* The k largest of n scores into mark (ties to the lower index, as the router). */
static void mark_top(const float *s, size_t n, int k, char *mark, char *taken) {
  memset(taken, 0, n);
  for (int j = 0; j < k && (size_t)j < n; j++) {
    size_t best = n;
    for (size_t e = 0; e < n; e++)
      if (!taken[e] && (best == n || s[e] > s[best])) best = e;
    taken[best] = 1;
    mark[best] = 1;
  }
}

/* The hook: layer j's router (its norm, weights, biases; sigmoid scores for DeepSeek-V3's selection bias)
 * over layer i's hidden state h, and the union of the rows' top-k read ahead into layer j's cache. */
static moe_status predict(void *ctx, const moe_lm_t *m, int i, const float *h, int N, int nt) {
  struct moe_lm_prefetch *p = ctx;
  int j = next_moe(m, i);
  if (j < 0) return MOE_OK;
  const moe_layer_config *lc = &m->layers[j].cfg;
  int D = lc->D, E = lc->E;
  if (N > p->rows) {
    float *xn = realloc(p->xn, (size_t)N * D * 4), *rstd = realloc(p->rstd, (size_t)N * 4),
          *lg = realloc(p->logits, (size_t)N * E * 4);
    if (xn) p->xn = xn;
    if (rstd) p->rstd = rstd;
    if (lg) p->logits = lg;
    MOE_TRY(xn && rstd && lg, MOE_ERR_NOMEM, "prefetch: out of memory for %d rows", N);
    p->rows = N;
  }
  char name[96];
  snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", j);
  const moe_tensor_ref *ln = moe_lm_find(m, name);
  MOE_TRY(ln && ln->data, MOE_ERR_STATE, "prefetch: the model has no '%s'", name);
  moe__rmsnorm_forward(h, ln->data, N, D, m->cfg.rms_eps, p->xn, p->rstd, nt);
  moe_layer_t *l = &m->layers[j];
  const float *wg = moe_layer_param(l, "gate.weight"), *bg = moe_layer_param(l, "gate.bias"),
              *sel = moe_layer_param(l, "gate.select_bias");
  moe__gemm g = {false, true, N, E, D, 1.0f, 0.0f, p->xn, D, wg, D, p->logits, E, false};
  MOE_CHECK(moe__gemm_run(&g, 1, nt));
  memset(p->mark, 0, (size_t)E);
  char *taken = p->mark + E;
  for (int r = 0; r < N; r++) {
    float *s = p->logits + (size_t)r * E;
    for (int e = 0; e < E; e++) {
      float v = s[e] + (bg ? bg[e] : 0.0f);
      if (sel) v = 1.0f / (1.0f + expf(-v)) + sel[e];
      s[e] = v;
    }
    mark_top(s, (size_t)E, lc->top_k, p->mark, taken);
  }
  int n = 0;
  for (int e = 0; e < E; e++)
    if (p->mark[e]) p->list[n++] = e;
  return moe_expert_cache_prefetch(p->caches[j], p->list, n);
}

moe_status moe__lm_open_cache(const moe_lm_t *m, moe_lm_experts *x, moe__lm_shards *files, int i,
                              const moe_layer_config *lc, int K, moe_cache_policy p) {
  moe__st_files fs;
  moe__lm_shards_files(files, &fs);
  if (m->cfg.family == MOE_LM_GPT_OSS) {
    moe__expert_reader r;
    MOE_CHECK(moe__gptoss_expert_reader(&fs, &m->cfg, i, &r));
    return moe__expert_cache_open_reader(&x->caches[i], lc, K, p, &r);
  }
  char prefix[96];
  snprintf(prefix, sizeof prefix, "model.layers.%d.%s.experts.", i, moe__lm_family(m->cfg.family)->ffn);
  return moe__expert_cache_open_files(&x->caches[i], &fs, prefix, lc, K, p);
}

/* Each MoE layer's cache over the checkpoint's files (lm_shards.h), or its reader rd[i] (rd not
 * NULL: GGUF files; each taken by its cache, its free set NULL), of K[j] slots for the j-th MoE layer. */
static moe_status open_caches(moe_lm_t *m, moe_lm_experts *x, moe__lm_shards *files, moe__expert_reader *rd,
                              const int *K, moe_cache_policy policy, int keep) {
  const moe_lm_config *c = &m->cfg;
  for (int i = 0, j = 0; i < c->n_layers; i++) {
    if (moe_lm_layer_dense(c, i)) continue;
    moe_status st = rd ? moe__expert_cache_open_reader(&x->caches[i], &m->layers[i].cfg, K[j++], policy, &rd[i])
                       : moe__lm_open_cache(m, x, files, i, &m->layers[i].cfg, K[j++], policy);
    if (rd) rd[i].free = NULL; /* the cache's now, opened or not */
    MOE_CHECK(st);
    MOE_CHECK(moe_layer_set_expert_cache(&m->layers[i], x->caches[i]));
    moe_expert_cache_set_drop_pages(x->caches[i], !keep);
  }
  return MOE_OK;
}

/* The bytes of a slot of each MoE layer (slot[j] for the j-th): a GGUF file's by its readers (rd, not
 * NULL: made here, each layer's at rd[i]), which know each projection's stored type. The file is parsed
 * and opened once for every layer: the readers share its descriptor, closed with the last of them. */
static moe_status slot_sizes(const moe_lm_t *m, const char *gguf, moe__expert_reader *rd, size_t *slot) {
  const moe_lm_config *c = &m->cfg;
  moe_gguf *g = NULL;
  moe__lm_gguf_fd *f = NULL;
  moe_status st = rd ? moe_gguf_open(&g, gguf) : MOE_OK;
  if (st == MOE_OK && rd) st = moe__lm_gguf_fd_open(&f, gguf);
  for (int i = 0, j = 0; st == MOE_OK && i < c->n_layers; i++) {
    if (moe_lm_layer_dense(c, i)) continue;
    slot[j] = moe_expert_cache_slot_bytes(&m->layers[i].cfg);
    if (rd) st = moe__lm_gguf_expert_reader(g, f, c, i, &rd[i]);
    if (rd && st == MOE_OK) st = moe__expert_cache_reader_slot_bytes(&m->layers[i].cfg, &rd[i], &slot[j]);
    j++;
  }
  moe__lm_gguf_fd_release(f);
  moe_gguf_close(g);
  return st;
}

moe_status moe_lm_load_streaming(moe_lm_t *m, const char *dir, const moe_lm_config *c, const moe_lm_stream_config *s,
                                 moe_lm_experts *x) {
  MOE_TRY(m && dir && s && x, MOE_ERR_ARG, "moe_lm_load_streaming: NULL argument");
  MOE_TRY(s->prefetch == MOE_PREFETCH_OFF || s->prefetch == MOE_PREFETCH_ON || s->prefetch == MOE_PREFETCH_AUTO,
          MOE_ERR_ARG, "moe_lm_load_streaming: unknown prefetch mode %d", (int)s->prefetch);
  memset(m, 0, sizeof *m);
  memset(x, 0, sizeof *x);
  int gguf = moe__lm_gguf_is(dir);
  moe_lm_config own;
  if (!c) MOE_CHECK(moe_lm_read_config(dir, &own));
  else own = *c;
  MOE_TRY(!own.moe.dist, MOE_ERR_ARG, "moe_lm_load_streaming: one process only (no expert parallelism)");
  own.moe.external_experts = 1;
  MOE_CHECK(moe_lm_load(m, dir, &own));
  x->budget = s->budget;
  x->n = own.n_layers;
  moe__lm_shards *files = NULL;
  int *K = malloc(sizeof *K * (size_t)own.n_layers);
  size_t *slot = malloc(sizeof *slot * (size_t)own.n_layers);
  moe__expert_reader *rd = gguf ? calloc((size_t)own.n_layers, sizeof *rd) : NULL;
  moe_status st = K && slot && (rd || !gguf) ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert caches: out of memory");
  if (st == MOE_OK) st = slot_sizes(m, dir, rd, slot);
  if (st == MOE_OK) st = moe__lm_stream_slots(m, s, slot, K);
  if (st == MOE_OK && !gguf) st = moe__lm_shards_open(&files, dir, 0);
  if (st == MOE_OK && !(x->caches = calloc((size_t)x->n, sizeof *x->caches)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert caches: out of memory");
  if (st == MOE_OK) st = open_caches(m, x, files, rd, K, s->policy, s->keep_page_cache);
  moe__lm_shards_release(files); /* the caches hold them */
  for (int i = 0; rd && i < own.n_layers; i++) /* those no cache took */
    if (rd[i].free) rd[i].free(rd[i].ctx);
  free(K), free(slot), free(rd);
  if (st == MOE_OK) st = moe__lm_stream_pin(m, s, x);
  for (int i = 0; st == MOE_OK && i < x->n; i++)
    if (x->caches[i]) st = moe_expert_cache_set_prefetch(x->caches[i], s->prefetch);
  if (st == MOE_OK && s->prefetch != MOE_PREFETCH_OFF) {
    struct moe_lm_prefetch *p = x->prefetch = calloc(1, sizeof *p);
    if (p) p->caches = x->caches, p->list = malloc((size_t)own.moe.E * sizeof *p->list), p->mark = malloc(2 * (size_t)own.moe.E);
    if (!p || !p->list || !p->mark) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "prefetch: out of memory");
    else moe__lm_set_hook(m, predict, p);
  }
  if (st != MOE_OK) {
    moe_lm_free(m);
    moe_lm_experts_free(x);
  }
  return st;
}
