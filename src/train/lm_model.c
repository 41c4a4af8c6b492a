/* The language model behind the trainer's model interface: batches of windows of a token stream in a
 * per-epoch order, the loss and gradients of moe_lm_*, evaluation over fixed validation windows, and
 * the Hugging Face directory (with tokenizer.json) as the model's files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
  moe_lm_t *m;
  const moe_tokenizer *tok;
  const int32_t *train, *valid;
  size_t n_valid;
  int T, B, eval_windows;
  int b0, b1;          /* this rank's rows of every batch */
  int nwin, per_epoch; /* the stream's non-overlapping windows of T + 1 tokens; steps an epoch */
  int epoch;           /* of perm (-1: none yet) */
  uint64_t seed;
  int32_t *perm;       /* (nwin) */
  int32_t *x, *y, *ids; /* (B, T) the batch, its targets, its samples (token t of window w: w T + t) */
} lm_task;

/* A window is the same tokens every epoch, so its tokens are the samples whose experts assignment
 * caching records. Fewer windows than B: a batch repeats some. */
static moe_status lm_batch(void *self, int64_t s, const int32_t **samples, int *n) {
  lm_task *k = self;
  int T = k->T, epoch = (int)(s / k->per_epoch);
  if (epoch != k->epoch) moe_train_shuffle(k->perm, k->nwin, k->seed, k->epoch = epoch);
  for (int b = 0; b < k->B; b++) {
    int w = k->perm[((size_t)(s % k->per_epoch) * k->B + (size_t)b) % (size_t)k->nwin];
    const int32_t *src = k->train + (size_t)w * T;
    memcpy(k->x + (size_t)b * T, src, (size_t)T * sizeof *k->x);
    memcpy(k->y + (size_t)b * T, src + 1, (size_t)T * sizeof *k->y);
    for (int t = 0; t < T; t++) k->ids[b * T + t] = w * T + t;
  }
  *samples = k->ids;
  *n = k->B * T;
  return MOE_OK;
}

static moe_status lm_forward(void *self, moe_train_batch_stats *out) {
  lm_task *k = self;
  moe_lm_t *m = k->m;
  moe_lm_zero_grad(m);
  moe_lm_times_reset(m);
  moe_lm_stats st;
  size_t off = (size_t)k->b0 * k->T;
  MOE_CHECK(moe_lm_forward(m, k->x + off, k->y + off, k->b1 - k->b0, k->T, &st));
  const moe_layer_config *l = &m->cfg.moe;
  int moe_layers = 0;
  for (int i = 0; i < m->cfg.n_layers; i++) moe_layers += !moe_lm_layer_dense(&m->cfg, i);
  double N = (double)k->B * k->T, assigned = N * l->top_k * moe_layers;
  memset(out, 0, sizeof *out);
  out->loss = st.loss;
  out->ce = st.ce;
  out->tokens = st.tokens;
  out->dropped = st.dropped;
  out->assigned = assigned;
  /* SwiGLU: 3 GEMMs of 2 D H a row forward, 6 backward; this rank's experts take 1/W of them, about */
  out->expert_flops = 18.0 * (assigned - st.dropped) * l->D * l->H / moe_dist_size(l->dist);
  return MOE_OK;
}

static moe_status lm_backward(void *self, moe_train_batch_stats *st) {
  lm_task *k = self;
  MOE_CHECK(moe_lm_backward(k->m));
  moe_lm_times t;
  moe_lm_times_get(k->m, &t);
  st->attention_s = t.attention;
  st->experts_s = t.experts;
  st->router_s = t.router;
  return MOE_OK;
}

static void lm_params_changed(void *self) { moe_lm_params_changed(((lm_task *)self)->m); }

static moe_status lm_balance_bias(void *self, float gamma) {
  moe_lm_t *m = ((lm_task *)self)->m;
  MOE_CHECK(moe_lm_balance_bias(m, gamma));
  moe_lm_params_changed(m);
  return MOE_OK;
}

static moe_status lm_evaluate(void *self, double *loss, double *accuracy) {
  lm_task *k = self;
  (void)accuracy; /* none */
  return moe_lm_eval_windows(k->m, k->valid, k->n_valid, k->T, k->B, k->eval_windows, loss);
}

static moe_status lm_save(void *self, const char *dir) {
  lm_task *k = self;
  char path[4096];
  MOE_CHECK(moe_lm_save(k->m, dir));
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (k->tok && moe_dist_rank(k->m->cfg.moe.dist) == 0) MOE_CHECK(moe_tokenizer_save(k->tok, path));
  return MOE_OK;
}

static moe_status lm_gather(void *self, const float *local, float *whole) {
  return moe_lm_gather(((lm_task *)self)->m, local, whole);
}

static moe_status lm_scatter(void *self, const float *whole, float *local) {
  return moe_lm_scatter(((lm_task *)self)->m, whole, local);
}

static const moe_layer_stats *lm_layer_stats(void *self, int i) { return moe_lm_layer_stats(((lm_task *)self)->m, i); }

static void lm_free(void *self) {
  lm_task *k = self;
  if (!k) return;
  free(k->perm);
  free(k->x);
  free(k->y);
  free(k->ids);
  free(k);
}

moe_status moe_train_lm(moe_train_model *out, moe_lm_t *m, const moe_tokenizer *t, const int32_t *train,
                        size_t n_train, const int32_t *valid, size_t n_valid, const moe_trainer_config *c) {
  memset(out, 0, sizeof *out);
  int T = c->context, B = c->batch;
  MOE_TRY(T > 0 && B > 0 && c->eval_windows > 0, MOE_ERR_ARG,
          "trainer: context %d, batch %d and eval_windows %d must be positive", T, B, c->eval_windows);
  MOE_TRY(T <= m->cfg.max_seq, MOE_ERR_ARG, "context %d exceeds the model's max_position_embeddings %d", T,
          m->cfg.max_seq);
  MOE_TRY(n_train >= (size_t)T + 1 && n_valid >= (size_t)T + 1, MOE_ERR_ARG,
          "%zu training and %zu validation tokens, fewer than one window of context %d + 1", n_train, n_valid, T);
  const moe_dist *d = m->cfg.moe.dist;
  int W = moe_dist_size(d), r = moe_dist_rank(d);
  MOE_TRY(B >= W, MOE_ERR_ARG, "batch %d is fewer than the %d ranks: each takes a slice of it", B, W);
  lm_task *k = calloc(1, sizeof *k);
  size_t nwin = (n_train - 1) / (size_t)T, N = (size_t)B * T;
  if (k) {
    *k = (lm_task){m, t, train, valid, n_valid, T, B, c->eval_windows, B * r / W, B * (r + 1) / W,
                   nwin < INT32_MAX / (size_t)T ? (int)nwin : INT32_MAX / T, 1, -1, c->seed, NULL, NULL, NULL, NULL};
    k->per_epoch = k->nwin / B > 0 ? k->nwin / B : 1;
    k->perm = malloc((size_t)k->nwin * sizeof *k->perm);
    k->x = malloc(N * sizeof *k->x);
    k->y = malloc(N * sizeof *k->y);
    k->ids = malloc(N * sizeof *k->ids);
  }
  if (!k || !k->perm || !k->x || !k->y || !k->ids) {
    lm_free(k);
    MOE_TRY(0, MOE_ERR_NOMEM, "trainer: out of memory for a batch of %d x %d and %zu windows", B, T, nwin);
  }
  *out = (moe_train_model){.self = k, .refs = m->refs, .nrefs = m->nrefs, .numel = m->numel, .dist = d,
                           .layer = &m->cfg.moe, .whole_numel = moe_lm_whole_numel(m),
                           .samples = (int64_t)k->nwin * T, .steps_per_epoch = k->per_epoch, .batch = lm_batch,
                           .forward = lm_forward, .backward = lm_backward, .params_changed = lm_params_changed,
                           .evaluate = lm_evaluate, .save = lm_save, .gather = lm_gather, .scatter = lm_scatter,
                           .free = lm_free, .layer_stats = lm_layer_stats, .rows = B * T,
                           .balance_bias = m->cfg.moe.select_bias ? lm_balance_bias : NULL};
  int dense = 0; /* Qwen's dense layers (mlp_only_layers, decoder_sparse_step) have no MoE layer to adjust */
  for (int i = 0; i < m->cfg.n_layers; i++) dense |= moe_lm_layer_dense(&m->cfg, i);
  if (!dense) out->moe_layers = m->layers, out->n_moe_layers = m->cfg.n_layers;
  return MOE_OK;
}
