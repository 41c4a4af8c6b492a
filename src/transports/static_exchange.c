/* Static dispatch expert-parallel (moe__transport_static): GShard's fixed (E, C, D) buffers, with the
 * positions of one process. The routing of all tokens is gathered so that each rank places its
 * assignments where one process would; the owners of each expert sum the ranks' buffers (a
 * reduce-scatter: slots are disjoint), and every rank gathers all expert outputs for its combine (an
 * all-gather).
 * With micro-batches (MPipeMoE), micro-batch i is local experts [e0, e1) of every owner (micro.c): each
 * rank sends every owner its rows of them, which the owner sums in rank order (the reduce-scatter's
 * sum: a slot is non-zero on one rank at most, so any order gives the same bits), and every owner
 * sends its outputs of them to every rank (the all-gather). Both are all-to-all-v exchanges on the
 * communication stream (comm_stream.h), micro-batch i+1's posted before i's rows are summed, so that it
 * overlaps i's experts as in transports/alltoall.c. */
#include <string.h>

#include "dist/comm_stream.h"
#include "dist/dist.h"
#include "layer/plugins.h"

static int world(const moe__env *env) { return moe_dist_size(env->l->cfg.dist); }

/* The transport's state: the exchanges' tickets (as in transports/alltoall.c), the micro-batches'
 * staging, and where this rank's tokens sit among all ranks' (t0 of Tv). */
typedef struct {
  moe__tickets tk;
  float *xr;
  int t0, Tv;
} static_self;

static moe_status static_init(const moe_layer_t *l, void **self) {
  (void)l;
  return moe__ep_self_new(sizeof(static_self), self);
}

/* Where this rank's tokens sit among all ranks' (t0, Tv), before routing, and the routing workspace
 * that the gathered routing needs. */
static moe_status static_begin(void *self, const moe__env *env, int T, size_t *route_bytes) {
  static_self *x = self;
  const moe_layer_config *cfg = &env->l->cfg;
  int W = world(env), r = moe_dist_rank(cfg->dist);
  double n[MOE__EP_MAX_RANKS] = {0};
  n[r] = T;
  MOE_CHECK(moe_dist_allreduce(cfg->dist, n, W));
  double t0 = 0, tg = 0;
  for (int q = 0; q < W; q++) {
    t0 += q < r ? n[q] : 0;
    tg += n[q];
  }
  MOE_TRY(tg * cfg->top_k <= INT32_MAX / 2, MOE_ERR_ARG, "static dispatch: %.0f tokens over all ranks is too many", tg);
  x->t0 = (int)t0;
  x->Tv = (int)tg;
  size_t Tg = (size_t)x->Tv, k = (size_t)cfg->top_k;
  *route_bytes = moe__ep_route_bytes(cfg) + moe__arena_size(Tg * (k + 1) * sizeof(double)) +
                 moe__arena_size(Tg * k * 4) + 2 * moe__arena_size(Tg * 4) + moe__arena_size(Tg * 8);
  return MOE_OK;
}

/* Every rank's routing, gathered: the experts, and the scores only where they order the tokens. */
static moe_status static_view(void *self, const moe__env *env, const moe__plan *p, moe__view *v) {
  const static_self *x = self;
  MOE_CHECK(moe__ep_global_counts(env, v));
  int T = p->T, k = p->k, Tv = x->Tv, t0 = x->t0;
  int with_p = env->l->cfg.priority == MOE_PRIORITY_SCORE;
  double *g = moe__arena_alloc(env->route, (size_t)Tv * (k + 1) * sizeof *g);
  int32_t *gte = moe__arena_alloc(env->route, (size_t)Tv * k * 4);
  float *gtp = moe__arena_alloc(env->route, (size_t)Tv * 4);
  int32_t *order = moe__arena_alloc(env->route, (size_t)Tv * 4);
  MOE_TRY((g && gte && gtp && order) || Tv == 0, MOE_ERR_STATE, "internal: routing workspace too small");
  memset(g, 0, (size_t)Tv * (k + with_p) * sizeof *g);
  for (size_t a = 0; a < (size_t)T * k; a++) g[(size_t)t0 * k + a] = p->top_e[a];
  for (int t = 0; t < T && with_p; t++) g[(size_t)Tv * k + t0 + t] = v->score[(size_t)t * v->stride];
  MOE_CHECK(moe_dist_allreduce(env->l->cfg.dist, g, Tv * (k + with_p)));
  for (size_t a = 0; a < (size_t)Tv * k; a++) gte[a] = (int32_t)g[a];
  for (int t = 0; t < Tv && with_p; t++) gtp[t] = (float)g[(size_t)Tv * k + t];
  *v = (moe__view){Tv, t0, gte, gtp, 1, v->counts, order};
  return MOE_OK;
}

/* This rank's experts' slots of the (E, C, D) buffer (C each, or per-expert capacities). */
static moe_status static_groups(void *self, const moe__env *env, moe__plan *p) {
  (void)self;
  p->ng = env->l->cfg.E / world(env);
  int e0 = moe_dist_rank(env->l->cfg.dist) * p->ng; /* global id of this rank's first expert */
  p->grows = p->offs[e0 + p->ng] - p->offs[e0];
  p->goffs = moe__arena_alloc(env->route, (size_t)(p->ng + 1) * 4);
  MOE_TRY(p->goffs, MOE_ERR_STATE, "internal: routing workspace too small");
  for (int e = 0; e <= p->ng; e++) p->goffs[e] = p->offs[e0 + e] - p->offs[e0];
  return MOE_OK;
}

/* Rows of one expert-side buffer: all the groups' rows, or (plan.slotted) one micro-batch's. */
static size_t buffer_rows(const moe__plan *p) { return (size_t)(p->slotted ? p->mb_rows : p->grows); }

/* Staging of micro-batches (n > 1; the collectives of one stage nothing): every rank's rows of a
 * micro-batch, rank after rank, for the whole batch; or, slotted, two micro-batches per way in (the
 * exchange of i + 1 lands while i's rows are summed), the way back reusing way 0's. */
static size_t staging_rows(const moe__env *env, const moe__plan *p) {
  return p->n > 1 ? buffer_rows(p) * (size_t)world(env) * (p->slotted ? 4 : 1) : 0;
}

static size_t static_work_bytes(void *self, const moe__env *env, const moe__plan *p) {
  (void)self;
  size_t D = (size_t)env->l->cfg.D;
  return 3 * moe__arena_size(buffer_rows(p) * D * 4) + moe__arena_size(staging_rows(env, p) * D * 4); /* gx, gout, gdx, xr */
}

static moe_status static_alloc(void *self, const moe__env *env, const moe__plan *p, moe__expert_bufs *b) {
  static_self *x = self;
  size_t n = buffer_rows(p) * env->l->cfg.D * 4, ns = staging_rows(env, p) * env->l->cfg.D * 4;
  b->gx = moe__arena_alloc(env->work, n);
  b->gout = moe__arena_alloc(env->work, n);
  b->gdx = moe__arena_alloc(env->work, n);
  x->xr = ns ? moe__arena_alloc(env->work, ns) : NULL;
  MOE_TRY(((b->gx && b->gout && b->gdx) || n == 0) && (x->xr || ns == 0), MOE_ERR_STATE,
          "internal: expert workspace too small");
  return MOE_OK;
}

/* Each owner's block of the (E, C, D) buffers, in floats: its experts' slots (C each, or per-expert
 * capacities), the same on every rank; MPI's reductions take int counts of floats. */
static moe_status static_blocks(const moe__env *env, const moe__plan *p, int *n) {
  int W = world(env), El = env->l->cfg.E / W, D = env->l->cfg.D;
  for (int r = 0; r < W; r++) {
    int64_t rows = p->offs[(r + 1) * El] - p->offs[r * El], f = rows * D;
    MOE_TRY(f <= INT32_MAX, MOE_ERR_ARG,
            "static dispatch, expert-parallel: rank %d's experts take %lld rows of D=%d, %lld floats, more than "
            "an exchange can count (%d); use dynamic dispatch or a smaller capacity", r, (long long)rows, D,
            (long long)f, INT32_MAX);
    n[r] = (int)f;
  }
  return MOE_OK;
}

/* The owners sum the ranks' buffers of their experts (the whole batch at once). */
static moe_status whole_send(const moe__env *env, const moe__plan *p, const float *rows, float *g) {
  double t0 = moe__now(), others = 0;
  int n[MOE__EP_MAX_RANKS], me = moe_dist_rank(env->l->cfg.dist);
  MOE_CHECK(static_blocks(env, p, n));
  for (int r = 0; r < world(env); r++) others += r == me ? 0 : n[r];
  MOE_CHECK(moe__dist_reduce_scatter_f32(env->l->cfg.dist, rows, g, n));
  moe__ep_book(env, t0, 4.0 * others); /* every other owner's block */
  return MOE_OK;
}

/* Every rank gathers all outputs (the whole batch at once). */
static moe_status whole_recv(const moe__env *env, const moe__plan *p, const float *g, float *rows) {
  double t0 = moe__now();
  int n[MOE__EP_MAX_RANKS];
  MOE_CHECK(static_blocks(env, p, n));
  MOE_CHECK(moe__dist_allgather_f32(env->l->cfg.dist, g, rows, n));
  moe__ep_book(env, t0, 4.0 * n[moe_dist_rank(env->l->cfg.dist)] * (world(env) - 1)); /* this owner's block, to every other rank */
  return MOE_OK;
}

/* Micro-batch i's staging: every rank's rows of it, rank after rank. */
static float *staging(const static_self *x, const moe__env *env, const moe__plan *p, int way, int i) {
  size_t at = p->slotted ? (size_t)(2 * way + i % 2) * (size_t)p->mb_rows : (size_t)p->mb[i].lo;
  return x->xr + at * (size_t)world(env) * (size_t)env->l->cfg.D;
}

/* Micro-batch i's exchange, posted on the stream (*t its ticket), its bytes booked: in, every owner gets
 * every rank's rows of its experts of the micro-batch (rank after rank into recv); back, every rank gets
 * every owner's outputs of them (from send, into their rows of the (E, C, D) buffer recv). */
static moe_status exchange(static_self *x, const moe__env *env, const moe__plan *p, int i, int back, const float *send,
                           float *recv, uint64_t *t) {
  int W = world(env), El = p->ng, D = env->l->cfg.D, me = moe_dist_rank(env->l->cfg.dist), e0 = p->mb[i].e0,
      e1 = p->mb[i].e1;
  int c[4 * MOE__EP_MAX_RANKS], *sc = c, *sd = c + W, *rc = c + 2 * W, *rd = c + 3 * W;
  int mine = p->offs[me * El + e1] - p->offs[me * El + e0];
  double sent = 0;
  for (int q = 0; q < W; q++) {
    int at = p->offs[q * El + e0], rows = p->offs[q * El + e1] - at; /* owner q's block of the micro-batch */
    sc[q] = back ? mine : rows;
    sd[q] = back ? 0 : at;
    rc[q] = back ? rows : mine;
    rd[q] = back ? at : q * mine;
    sent += q == me ? 0 : 4.0 * D * sc[q];
  }
  double t0 = moe__now();
  MOE_CHECK(moe__stream_alltoallv_rows(env->l->cfg.dist, send, c, recv, D, t));
  if (*t) x->tk.last = *t;
  moe__ep_book(env, t0, sent);
  return MOE_OK;
}

/* Micro-batch i's rows in, summed over the ranks; the next micro-batch's exchange is posted first, so
 * that it overlaps the sum and i's experts (the stream's order S1 S2 R1 S3 R2 ... frees a slot before
 * the exchange that reuses it starts, as in transports/alltoall.c). */
static moe_status static_send(void *self, const moe__env *env, const moe__plan *p, int way, int i, const float *rows,
                              float *g) {
  static_self *x = self;
  if (p->n == 1) return whole_send(env, p, rows, g);
  uint64_t *next = &x->tk.next[way];
  if (i == 0) MOE_CHECK(exchange(x, env, p, 0, 0, rows, staging(x, env, p, way, 0), next));
  MOE_CHECK(moe__stream_wait_timed(env->l->cfg.dist, *next, &env->comm->seconds));
  if (i + 1 < p->n) MOE_CHECK(exchange(x, env, p, i + 1, 0, rows, staging(x, env, p, way, i + 1), next));
  const float *in = staging(x, env, p, way, i);
  size_t m = (size_t)p->mb[i].rows * env->l->cfg.D;
  int W = world(env);
#pragma omp parallel for num_threads(env->threads) schedule(static)
  for (size_t u = 0; u < m; u++) {
    float v = in[u];
    for (int q = 1; q < W; q++) v += in[q * m + u];
    g[u] = v;
  }
  return MOE_OK;
}

/* Micro-batch i's outputs to every rank; slotted, from a copy in its staging (free: send summed it),
 * since the next micro-batch's experts write g while the exchange may still read it. */
static moe_status static_recv(void *self, const moe__env *env, const moe__plan *p, int i, const float *g, float *rows) {
  static_self *x = self;
  if (p->n == 1) return whole_recv(env, p, g, rows);
  if (p->slotted && p->mb[i].rows) {
    float *copy = staging(x, env, p, 0, i);
    memcpy(copy, g, (size_t)p->mb[i].rows * env->l->cfg.D * 4);
    g = copy;
  }
  uint64_t t;
  return exchange(x, env, p, i, 1, g, rows, &t);
}

static moe_status static_finish(void *self, const moe__env *env, const moe__plan *p) {
  (void)p;
  return moe__tickets_finish(&((static_self *)self)->tk, env);
}

const moe__transport moe__transport_static = {"static exchange", 0,           static_init,       moe__ep_self_free,
                                              static_begin,      static_view, static_groups,     static_work_bytes,
                                              static_alloc,      static_send, static_recv,       static_finish,
                                              moe__ep_agree,     moe__ep_whole, moe__ep_local,     NULL};
