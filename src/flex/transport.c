/* Expert parallelism over FlexMoE's replicas (moe__transport_flex, DESIGN 3.4): the placement table
 * replaces block ownership. Each rank all-gathers its per-expert row counts (a W x E matrix, which
 * also gives the counts over all ranks) and routes them with moe__flex_route: r[g][e][h] of rank g's
 * expert-e rows go to rank h. A rank's rows of one expert are contiguous; it stages them
 * destination-major (the first r[g][e][g] to itself, the next to each other rank in ascending order),
 * exchanges them with one all-to-all-v, and reorders what it receives expert-major over the experts it
 * holds (ascending: row j of its expert tensors holds the j-th), sources in rank order. The way back is
 * the inverse. One micro-batch, dynamic dispatch (checked at init). */
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "flex/wire.h"

void moe__flex_layer_sync_held(moe__flex_layer *f) {
  f->nh = 0;
  for (int e = 0; e < f->t.E; e++)
    if (moe__flex_count(&f->t, e, f->me)) f->held[f->nh++] = e;
}

static void flex_free(void *self) {
  moe__flex_layer *f = self;
  if (!f) return;
  moe__flex_table_free(&f->t);
  moe__flex_comms_free(f->comms);
  free(f->held), free(f->Isrc), free(f->r), free(f->gather);
  free(f);
}

/* The initial placement: each rank's own block of experts. */
static moe_status flex_init(const moe_layer_t *l, void **self) {
  int W = moe_dist_size(l->cfg.dist), E = l->cfg.E, Ev = l->cfg.replica_slots;
  moe__flex_layer *f = calloc(1, sizeof *f);
  MOE_TRY(f, MOE_ERR_NOMEM, "replicas: out of memory");
  *self = f; /* the layer frees it, whatever follows */
  f->W = W;
  f->me = moe_dist_rank(l->cfg.dist);
  MOE_CHECK(moe__flex_table_init(&f->t, W, Ev, E, 3 * 4 * moe__flex_expert_floats(&l->cfg))); /* + AdamW's moments */
  f->held = malloc(sizeof *f->held * (size_t)Ev);
  f->Isrc = malloc(sizeof *f->Isrc * (size_t)W * E);
  f->r = malloc(sizeof *f->r * (size_t)W * E * W);
  f->gather = malloc(sizeof *f->gather * (size_t)W * E);
  MOE_TRY(f->held && f->Isrc && f->r && f->gather, MOE_ERR_NOMEM, "replicas: tables of %d experts",
          E);
  moe__flex_layer_sync_held(f);
  return MOE_OK;
}

size_t moe__flex_expert_floats(const moe_layer_config *c) {
  size_t H = (size_t)c->H, D = (size_t)c->D;
  return (2 + (c->act == MOE_ACT_SWIGLU)) * H * D + (c->expert_bias ? H + D : 0);
}

int moe__flex_row(const moe_layer_t *l, int e) {
  const moe__flex_layer *f = moe__flex_of(l);
  for (int j = 0; j < f->nh; j++)
    if (f->held[j] == e) return j;
  return -1;
}

static moe_status flex_begin(void *self, const moe__env *env, int T, size_t *route_bytes) {
  (void)self, (void)T;
  *route_bytes = moe__ep_route_bytes(&env->l->cfg);
  return MOE_OK;
}

/* The W x E counts, all-gathered (a sum of rows that each rank fills its own of), and the counts over
 * all ranks from them: one collective for both. */
static moe_status flex_view(void *self, const moe__env *env, const moe__plan *p, moe__view *v) {
  (void)p;
  moe__flex_layer *f = self;
  int W = f->W, E = env->l->cfg.E;
  int32_t *counts = moe__arena_alloc(env->route, (size_t)E * 4);
  MOE_TRY(counts, MOE_ERR_STATE, "internal: routing workspace too small");
  memset(f->gather, 0, sizeof *f->gather * (size_t)W * E);
  for (int e = 0; e < E; e++) f->gather[(size_t)f->me * E + e] = v->counts[e];
  MOE_CHECK(moe_dist_allreduce(env->l->cfg.dist, f->gather, W * E));
  for (int e = 0; e < E; e++) {
    double n = 0;
    for (int g = 0; g < W; g++) n += f->Isrc[(size_t)g * E + e] = (int64_t)f->gather[(size_t)g * E + e];
    counts[e] = (int32_t)n;
  }
  v->counts = counts;
  return MOE_OK;
}

/* The routing, the exchange's counts and the groups: the experts this rank holds, each with the rows
 * every rank sends it, sources in rank order. */
static moe_status flex_groups(void *self, const moe__env *env, moe__plan *p) {
  moe__flex_layer *f = self;
  int W = f->W, E = env->l->cfg.E, me = f->me;
  for (int e = 0; e < E; e++) /* dynamic dispatch keeps every row: the gathered counts are the rows */
    MOE_TRY(p->kept[e] == f->Isrc[(size_t)me * E + e], MOE_ERR_STATE,
            "internal: replicas: expert %d has %d rows on rank %d, its count says %lld", e, p->kept[e], me,
            (long long)f->Isrc[(size_t)me * E + e]);
  MOE_CHECK(moe__flex_route(&f->t, f->Isrc, f->r));
  int *sc = f->cnt, *sd = sc + W, *rc = sd + W, *rd = rc + W;
  for (int h = 0, at = 0; h < W; h++) { /* send staging: destination-major, experts ascending */
    sc[h] = 0;
    sd[h] = at;
    for (int e = 0; e < E; e++) sc[h] += (int)f->r[((size_t)me * E + e) * W + h];
    at += sc[h];
  }
  p->ng = f->nh;
  p->goffs = moe__arena_alloc(env->route, (size_t)(f->nh + 1) * 4);
  MOE_TRY(p->goffs, MOE_ERR_STATE, "internal: routing workspace too small");
  p->goffs[0] = 0;
  for (int j = 0; j < f->nh; j++) {
    int64_t n = 0;
    for (int q = 0; q < W; q++) n += f->r[((size_t)q * E + f->held[j]) * W + me];
    p->goffs[j + 1] = p->goffs[j] + (int32_t)n;
  }
  p->grows = p->goffs[f->nh];
  for (int q = 0, at = 0; q < W; q++) { /* receive staging: source-major, experts ascending */
    rc[q] = 0;
    rd[q] = at;
    for (int e = 0; e < E; e++) rc[q] += (int)f->r[((size_t)q * E + e) * W + me];
    at += rc[q];
  }
  return MOE_OK;
}

static size_t flex_work_bytes(void *self, const moe__env *env, const moe__plan *p) {
  (void)self;
  size_t R = (size_t)p->grows, rows = (size_t)p->rows, D = (size_t)env->l->cfg.D;
  return moe__arena_size(rows * 4) + moe__arena_size(R * 4) + moe__arena_size(rows * D * 4) +
         4 * moe__arena_size(R * D * 4); /* sperm, rperm, sbuf, xr, gx, gout, gdx */
}

/* sperm: each dispatch row's place in the send staging; rperm: each expert-major row's place in the
 * receive staging. */
static void flex_perms(moe__flex_layer *f, int E, const moe__plan *p) {
  int W = f->W, me = f->me;
  const int *sd = f->cnt + W, *rd = f->cnt + 3 * W;
  int at[MOE__FLEX_MAX_RANKS];
  for (int h = 0; h < W; h++) at[h] = sd[h];
  for (int e = 0; e < E; e++) {
    int row = p->offs[e];
    for (int h = 0; h < W; h++) { /* itself first (locality), then the other ranks ascending */
      int dst = h == 0 ? me : h <= me ? h - 1 : h;
      for (int64_t j = 0; j < f->r[((size_t)me * E + e) * W + dst]; j++) f->sperm[row++] = at[dst]++;
    }
  }
  for (int q = 0; q < W; q++) at[q] = rd[q];
  /* the receive staging from q: q's rows of every expert this rank holds, ascending */
  for (int q = 0; q < W; q++)
    for (int j = 0; j < f->nh; j++) {
      int e = f->held[j], dst = p->goffs[j];
      for (int r = 0; r < q; r++) dst += (int)f->r[((size_t)r * E + e) * W + me];
      for (int64_t k = 0; k < f->r[((size_t)q * E + e) * W + me]; k++) f->rperm[dst + k] = at[q]++;
    }
}

static moe_status flex_alloc(void *self, const moe__env *env, const moe__plan *p, moe__expert_bufs *b) {
  moe__flex_layer *f = self;
  size_t D = (size_t)env->l->cfg.D, R = (size_t)p->grows, rows = (size_t)p->rows;
  moe__arena *a = env->work;
  f->sperm = moe__arena_alloc(a, rows * 4);
  f->rperm = moe__arena_alloc(a, R * 4);
  f->sbuf = moe__arena_alloc(a, rows * D * 4);
  f->xr = moe__arena_alloc(a, R * D * 4);
  b->gx = moe__arena_alloc(a, R * D * 4);
  b->gout = moe__arena_alloc(a, R * D * 4);
  b->gdx = moe__arena_alloc(a, R * D * 4);
  MOE_TRY((f->sperm && f->sbuf) || rows == 0, MOE_ERR_STATE, "internal: exchange workspace too small");
  MOE_TRY((f->rperm && b->gdx) || R == 0, MOE_ERR_STATE, "internal: exchange workspace too small");
  flex_perms(f, env->l->cfg.E, p);
  return MOE_OK;
}

/* The exchange (reverse: the way back), its bytes and time booked. */
static moe_status exchange(moe__flex_layer *f, const moe__env *env, int reverse, const float *send, float *recv) {
  int W = f->W, D = env->l->cfg.D;
  const int *c = f->cnt, *sc = c + (reverse ? 2 : 0) * W, *sd = c + (reverse ? 3 : 1) * W;
  const int *rc = c + (reverse ? 0 : 2) * W, *rd = c + (reverse ? 1 : 3) * W;
  double t0 = moe__now(), sent = 0;
  for (int q = 0; q < W; q++) sent += q == f->me ? 0 : 4.0 * D * sc[q];
  MOE_CHECK(moe__dist_alltoallv_rows(env->l->cfg.dist, send, sc, sd, recv, rc, rd, D));
  moe__ep_book(env, t0, sent);
  return MOE_OK;
}

/* dst[perm[r]] = src[r] (scatter) or dst[r] = src[perm[r]] for n rows of D floats. */
static void permute_rows(int threads, int n, int D, const int32_t *perm, int scatter, const float *src, float *dst) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int r = 0; r < n; r++) {
    size_t a = (size_t)(scatter ? perm[r] : r) * D, b = (size_t)(scatter ? r : perm[r]) * D;
    memcpy(dst + a, src + b, (size_t)D * 4);
  }
}

/* Rows to the replicas (reverse 0: dispatch rows in, expert-major rows out; staged destination-major,
 * exchanged, reordered expert-major) or back (reverse 1: the mirror image). */
static moe_status through(moe__flex_layer *f, const moe__env *env, const moe__plan *p, int reverse, const float *in,
                          float *out) {
  int D = env->l->cfg.D, n = p->rows, R = p->grows;
  float *stage_in = reverse ? f->xr : f->sbuf, *stage_out = reverse ? f->sbuf : f->xr;
  permute_rows(env->threads, reverse ? R : n, D, reverse ? f->rperm : f->sperm, 1, in, stage_in);
  MOE_CHECK(exchange(f, env, reverse, stage_in, stage_out));
  permute_rows(env->threads, reverse ? n : R, D, reverse ? f->sperm : f->rperm, 0, stage_out, out);
  return MOE_OK;
}

static moe_status flex_send(void *self, const moe__env *env, const moe__plan *p, int way, int i, const float *rows,
                            float *g) {
  (void)way, (void)i;
  return through(self, env, p, 0, rows, g);
}

static moe_status flex_recv(void *self, const moe__env *env, const moe__plan *p, int i, const float *g, float *rows) {
  (void)i;
  return through(self, env, p, 1, g, rows);
}

/* The whole tensor's element j in this rank's rows of the experts it holds, or -1. */
static long long flex_local(void *self, const moe_layer_t *l, const moe_param_info *p, size_t j) {
  (void)self;
  size_t per = p->numel / (size_t)p->shape[0];
  int row = moe__flex_row(l, (int)(j / per));
  return row >= 0 ? (long long)((size_t)row * per + j % per) : -1;
}

static moe_status flex_reduce_grads(void *self, moe_layer_t *l) {
  (void)self;
  return moe__flex_reduce_grads(l);
}

const moe__transport moe__transport_flex = {"all-to-all-v over replicas", 0, flex_init, flex_free, flex_begin,
                                            flex_view, flex_groups, flex_work_bytes, flex_alloc, flex_send,
                                            flex_recv, NULL, moe__ep_agree, moe__ep_whole, flex_local,
                                            flex_reduce_grads};
