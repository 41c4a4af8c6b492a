/* Expert parallelism (deployment paper, section V; Tutel's flexible layout). Every rank routes its own
 * tokens and owns experts [rank*El, (rank+1)*El), El = E/W. After routing, the rows of a rank's
 * assignments are already sorted by expert, so the rows for each owner are contiguous:
 *   1. size exchange: each rank sends every owner the counts of its El experts (an all-to-all);
 *   2. token exchange: an all-to-all-v of exactly those rows, no padding;
 *   3. the owner reorders the received rows expert-major (rows of local expert e from every rank
 *      together), so each expert's GEMM shape does not depend on W.
 * The way back is the inverse permutation and the reverse all-to-all-v.
 * This file is that transport (moe__transport_a2a: dynamic dispatch; the all-to-all is Linear or 2DH,
 * as moe_dist_set_a2a chose) and the bookkeeping that static dispatch's transport (transports/static_exchange.c)
 * shares. */
#include <stdlib.h>
#include <string.h>

#include "dist/comm_stream.h"
#include "dist/dist.h"
#include "layer/plugins.h"

static int world(const moe__env *env) { return moe_dist_size(env->l->cfg.dist); }

/* The transport's state: the exchanges' tickets on the communication thread (each way's next
 * micro-batch's exchange in, and the last one posted), the staging (rows in source order), and the
 * rank blocks and permutation of this forward. */
typedef struct {
  moe__tickets tk;
  float *xr;     /* staging */
  int32_t *rc;   /* (W, E/W) rows from rank s for local expert e */
  int32_t *perm; /* (grows) each expert-major row's place in its micro-batch's staging */
} a2a_self;

moe_status moe__ep_self_new(size_t bytes, void **self) {
  *self = calloc(1, bytes);
  MOE_TRY(*self, MOE_ERR_NOMEM, "expert parallelism: out of memory");
  return MOE_OK;
}

void moe__ep_self_free(void *self) { free(self); }

static moe_status a2a_init(const moe_layer_t *l, void **self) {
  (void)l;
  return moe__ep_self_new(sizeof(a2a_self), self);
}

void moe__ep_book(const moe__env *env, double t0, double bytes) {
  env->comm->seconds += moe__now() - t0;
  env->comm->bytes += bytes;
  env->comm->exchanges++;
}

size_t moe__ep_route_bytes(const moe_layer_config *cfg) {
  size_t W = (size_t)moe_dist_size(cfg->dist), E = (size_t)cfg->E;
  return moe__arena_size(E * 4) * 2 + moe__arena_size((E + 1) * 4) +
         moe__arena_size((2 * E + 2) * sizeof(double)) + moe__arena_size(6 * W * sizeof(int));
}

static moe_status a2a_groups(void *self, const moe__env *env, moe__plan *p) {
  a2a_self *x = self;
  int W = world(env), El = env->l->cfg.E / W;
  moe__arena *a = env->route;
  x->rc = moe__arena_alloc(a, (size_t)env->l->cfg.E * 4);
  p->goffs = moe__arena_alloc(a, (size_t)(El + 1) * 4);
  int *cnt = moe__arena_alloc(a, 6 * (size_t)W * sizeof(int));
  MOE_TRY(x->rc && p->goffs && cnt, MOE_ERR_STATE, "internal: exchange workspace too small");
  int *sc = cnt, *sd = cnt + W, *rcn = cnt + 2 * W, *rd = cnt + 3 * W;
  for (int q = 0; q < W; q++) {
    sc[q] = rcn[q] = El;
    sd[q] = rd[q] = q * El;
  }
  double t0 = moe__now();
  MOE_CHECK(moe__dist_alltoallv_i32(env->l->cfg.dist, p->kept, sc, sd, x->rc, rcn, rd)); /* 1. sizes */
  moe__ep_book(env, t0, 4.0 * El * (W - 1));
  p->ng = El;
  p->goffs[0] = 0;
  for (int e = 0; e < El; e++) {
    int n = 0;
    for (int q = 0; q < W; q++) n += x->rc[q * El + e];
    p->goffs[e + 1] = p->goffs[e] + n;
  }
  p->grows = p->goffs[El]; /* every rank's rows for the local experts */
  return MOE_OK;
}

/* Rows of one buffer: all the groups' rows, or (plan.slotted) one micro-batch's. */
static size_t buffer_rows(const moe__plan *p) { return (size_t)(p->slotted ? p->mb_rows : p->grows); }

/* Staging (rows in source order): the whole batch; or, slotted, two micro-batches per way in (the
 * exchange of i + 1 lands while i's rows are read), the way back reusing way 0's. */
static size_t staging_rows(const moe__plan *p) { return buffer_rows(p) * (p->slotted ? 4 : 1); }

static size_t a2a_work_bytes(void *self, const moe__env *env, const moe__plan *p) {
  (void)self;
  size_t R = (size_t)p->grows, D = (size_t)env->l->cfg.D;
  return moe__arena_size(R * 4) + moe__arena_size(staging_rows(p) * D * 4) +
         3 * moe__arena_size(buffer_rows(p) * D * 4); /* perm, xr, gx, gout, gdx */
}

/* Micro-batch i's staging: its rows from every source rank, source after source. */
static float *staging(const a2a_self *x, const moe__env *env, const moe__plan *p, int way, int i) {
  size_t at = p->slotted ? (size_t)(2 * way + i % 2) * (size_t)p->mb_rows : (size_t)p->mb[i].lo;
  return x->xr + at * (size_t)env->l->cfg.D;
}

/* perm: each expert-major row's place in its micro-batch's staging. */
static void micro_perm(a2a_self *x, const moe__env *env, const moe__plan *p) {
  int W = world(env), El = p->ng;
  for (int i = 0; i < p->n; i++) {
    int e0 = p->mb[i].e0, e1 = p->mb[i].e1, src = 0;
    for (int q = 0; q < W; q++)
      for (int e = e0; e < e1; e++) {
        int dst = p->goffs[e];
        for (int r = 0; r < q; r++) dst += x->rc[r * El + e]; /* rows of e from lower ranks first */
        for (int j = 0; j < x->rc[q * El + e]; j++) x->perm[dst + j] = src + j;
        src += x->rc[q * El + e];
      }
  }
}

static moe_status a2a_alloc(void *self, const moe__env *env, const moe__plan *p, moe__expert_bufs *b) {
  a2a_self *x = self;
  size_t D = (size_t)env->l->cfg.D, B = buffer_rows(p);
  moe__arena *a = env->work;
  x->perm = moe__arena_alloc(a, (size_t)p->grows * 4);
  x->xr = moe__arena_alloc(a, staging_rows(p) * D * 4);
  b->gx = moe__arena_alloc(a, B * D * 4);
  b->gout = moe__arena_alloc(a, B * D * 4);
  b->gdx = moe__arena_alloc(a, B * D * 4);
  MOE_TRY((x->perm && b->gdx) || p->grows == 0, MOE_ERR_STATE, "internal: exchange workspace too small");
  micro_perm(x, env, p);
  return MOE_OK;
}

/* Row counts of micro-batch i's exchange (local experts [e0, e1) of every owner), in the order MPI
 * wants (send, sdispl, recv, rdispl); reverse: the way back. The rows sit in this rank's expert-sorted
 * rows, and, on the owner, in the micro-batch's staging, source after source. */
static void micro_counts(const a2a_self *x, const moe__env *env, const moe__plan *p, int i, int reverse, int *out) {
  int W = world(env), El = p->ng, e0 = p->mb[i].e0, e1 = p->mb[i].e1;
  int *sc = out + (reverse ? 2 : 0) * W, *sd = out + (reverse ? 3 : 1) * W;
  int *rcn = out + (reverse ? 0 : 2) * W, *rd = out + (reverse ? 1 : 3) * W;
  for (int q = 0, at = 0; q < W; q++) {
    sc[q] = p->offs[q * El + e1] - p->offs[q * El + e0];
    sd[q] = p->offs[q * El + e0];
    int in = 0;
    for (int e = e0; e < e1; e++) in += x->rc[q * El + e];
    rcn[q] = in;
    rd[q] = at;
    at += in;
  }
}

/* Micro-batch i's token exchange (reverse: the way back), its bytes booked. With micro-batches it is
 * posted on the communication stream (*t: its ticket) to overlap the experts of another micro-batch;
 * with one there is nothing to overlap and it runs at once (*t = 0), its time booked. */
static moe_status exchange(a2a_self *x, const moe__env *env, const moe__plan *p, int i, int reverse, const float *send,
                           float *recv, uint64_t *t) {
  int W = world(env), c[4 * MOE__EP_MAX_RANKS], D = env->l->cfg.D;
  micro_counts(x, env, p, i, reverse, c);
  double t0 = moe__now(), sent = 0;
  for (int q = 0; q < W; q++) sent += q == moe_dist_rank(env->l->cfg.dist) ? 0 : 4.0 * D * c[q];
  *t = 0;
  if (p->n == 1)
    MOE_CHECK(moe__dist_alltoallv_rows(env->l->cfg.dist, send, c, c + W, recv, c + 2 * W, c + 3 * W, D));
  else
    MOE_CHECK(moe__stream_alltoallv_rows(env->l->cfg.dist, send, c, recv, D, t));
  if (*t) x->tk.last = *t;
  moe__ep_book(env, t0, sent);
  return MOE_OK;
}

/* Micro-batch i's rows in; the next micro-batch's exchange is posted before i's rows are reordered, so
 * that it overlaps the reorder and i's experts (the stream's order is MPipeMoE's S1 S2 R1 S3 R2 ...,
 * so a staging slot is free again when the exchange that reuses it starts). */
static moe_status a2a_send(void *self, const moe__env *env, const moe__plan *p, int way, int i, const float *rows,
                           float *g) {
  a2a_self *x = self;
  int D = env->l->cfg.D, lo = p->mb[i].lo, n = p->mb[i].rows;
  uint64_t *next = &x->tk.next[way];
  if (i == 0) MOE_CHECK(exchange(x, env, p, 0, 0, rows, staging(x, env, p, way, 0), next)); /* 2. */
  /* the wait is booked as time in exchanges: the part the experts did not hide */
  MOE_CHECK(moe__stream_wait_timed(env->l->cfg.dist, *next, &env->comm->seconds));
  if (i + 1 < p->n) MOE_CHECK(exchange(x, env, p, i + 1, 0, rows, staging(x, env, p, way, i + 1), next));
  const float *in = staging(x, env, p, way, i);
#pragma omp parallel for num_threads(env->threads) schedule(static)
  for (int r = 0; r < n; r++) /* 3. expert-major */
    memcpy(g + (size_t)r * D, in + (size_t)x->perm[lo + r] * D, (size_t)D * 4);
  return MOE_OK;
}

static moe_status a2a_recv(void *self, const moe__env *env, const moe__plan *p, int i, const float *g, float *rows) {
  a2a_self *x = self;
  int D = env->l->cfg.D, lo = p->mb[i].lo, n = p->mb[i].rows;
  float *out = staging(x, env, p, 0, i); /* free: its rows were read by send */
#pragma omp parallel for num_threads(env->threads) schedule(static)
  for (int r = 0; r < n; r++)
    memcpy(out + (size_t)x->perm[lo + r] * D, g + (size_t)r * D, (size_t)D * 4);
  uint64_t t;
  return exchange(x, env, p, i, 1, out, rows, &t);
}

moe_status moe__tickets_finish(moe__tickets *t, const moe__env *env) {
  uint64_t last = t->last;
  *t = (moe__tickets){{0, 0}, 0};
  return moe__stream_wait_timed(env->l->cfg.dist, last, &env->comm->seconds);
}

static moe_status a2a_finish(void *self, const moe__env *env, const moe__plan *p) {
  (void)p;
  return moe__tickets_finish(&((a2a_self *)self)->tk, env);
}

moe_status moe__ep_agree(void *self, const moe__env *env, moe_status mine) {
  (void)self;
  int W = world(env);
  double failed[MOE__EP_MAX_RANKS] = {0};
  failed[moe_dist_rank(env->l->cfg.dist)] = mine != MOE_OK;
  moe_status st = moe_dist_allreduce(env->l->cfg.dist, failed, W);
  if (mine != MOE_OK) return mine; /* this rank's own message stays */
  MOE_CHECK(st);
  for (int q = 0; q < W; q++)
    MOE_TRY(!failed[q], MOE_ERR_STATE,
            "rank %d of %d failed its checks in this layer (its message says why): every rank stops here instead of "
            "waiting for it in an exchange", q, W);
  return MOE_OK;
}

moe_status moe__ep_global_counts(const moe__env *env, moe__view *v) {
  int E = env->l->cfg.E;
  double *g = moe__arena_alloc(env->route, (size_t)E * sizeof *g);
  int32_t *counts = moe__arena_alloc(env->route, (size_t)E * 4);
  MOE_TRY(g && counts, MOE_ERR_STATE, "internal: routing workspace too small");
  for (int e = 0; e < E; e++) g[e] = v->counts[e];
  MOE_CHECK(moe_dist_allreduce(env->l->cfg.dist, g, E));
  for (int e = 0; e < E; e++) counts[e] = (int32_t)g[e];
  v->counts = counts;
  return MOE_OK;
}

moe_status moe__ep_view(void *self, const moe__env *env, const moe__plan *p, moe__view *v) {
  (void)self, (void)p;
  return moe__ep_global_counts(env, v);
}

void moe__ep_whole(void *self, const moe_layer_t *l, const moe_param_info *p, int64_t w[3]) {
  (void)self;
  w[0] = l->cfg.E;
  w[1] = p->ndim > 1 ? p->shape[1] : 1;
  w[2] = p->ndim > 2 ? p->shape[2] : 1;
}

long long moe__ep_local(void *self, const moe_layer_t *l, const moe_param_info *p, size_t j) {
  (void)self;
  size_t per = p->numel / (size_t)p->shape[0]; /* one expert's (a row of this rank's tensor) */
  int El = l->cfg.E / moe_dist_size(l->cfg.dist), e = (int)(j / per) - moe_dist_rank(l->cfg.dist) * El;
  return e >= 0 && e < El ? (long long)((size_t)e * per + j % per) : -1;
}

static moe_status a2a_begin(void *self, const moe__env *env, int T, size_t *route_bytes) {
  (void)self, (void)T;
  *route_bytes = moe__ep_route_bytes(&env->l->cfg);
  return MOE_OK;
}

const moe__transport moe__transport_a2a = {"all-to-all-v", 0,         a2a_init,       moe__ep_self_free, a2a_begin,
                                           moe__ep_view,   a2a_groups, a2a_work_bytes, a2a_alloc,         a2a_send,
                                           a2a_recv,       a2a_finish, moe__ep_agree,  moe__ep_whole,     moe__ep_local,
                                           NULL};
