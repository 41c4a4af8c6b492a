/* Expert parallelism (deployment paper, section V; Tutel's flexible layout). Every rank routes its own
 * tokens and owns experts [rank*El, (rank+1)*El), El = E/W. After routing, the rows of a rank's
 * assignments are already sorted by expert, so the rows for each owner are contiguous:
 *   1. size exchange: each rank sends every owner the counts of its El experts (an all-to-all);
 *   2. token exchange: an all-to-all-v of exactly those rows, no padding;
 *   3. the owner reorders the received rows expert-major (rows of local expert e from every rank
 *      together), so each expert's GEMM shape does not depend on W.
 * The way back is the inverse permutation and the reverse all-to-all-v.
 * Static dispatch keeps GShard's fixed (E, C, D) buffers, with the positions of one process: the
 * routing of all tokens is gathered so that each rank places its assignments where one process
 * would; the owners of each expert sum the ranks' buffers (a reduce-scatter: slots are disjoint),
 * and every rank gathers all expert outputs for its combine (an all-gather). */
#include <string.h>

#include "dist/dist.h"
#include "layer_internal.h"

static int world(const moe_layer_t *l) { return moe_dist_size(l->cfg.dist); }

/* Books one exchange: its time since t0 and the bytes this rank sent to others. */
static void book(moe_layer_t *l, double t0, double bytes) {
  l->st->comm.seconds += moe__now() - t0;
  l->st->comm.bytes += bytes;
  l->st->comm.exchanges++;
}

void moe_layer_comm_stats(const moe_layer_t *l, moe_comm_stats *out) { *out = l->st->comm; }
void moe_layer_comm_reset(moe_layer_t *l) { memset(&l->st->comm, 0, sizeof l->st->comm); }

size_t moe__ep_route_bytes(const moe_layer_t *l) {
  size_t W = (size_t)world(l), E = (size_t)l->cfg.E;
  return moe__arena_size(4 * W * sizeof(int)) + moe__arena_size(E * 4) * 2 + moe__arena_size((E + 1) * 4) +
         moe__arena_size((2 * E + 2) * sizeof(double)) + moe__arena_size(6 * W * sizeof(int));
}

moe_status moe__ep_sizes(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  int W = world(l), El = l->cfg.E / W;
  moe__arena *a = &s->route;
  s->ex = moe__arena_alloc(a, 4 * (size_t)W * sizeof(int));
  s->rc = moe__arena_alloc(a, (size_t)l->cfg.E * 4);
  s->goffs = moe__arena_alloc(a, (size_t)(El + 1) * 4);
  int *cnt = moe__arena_alloc(a, 6 * (size_t)W * sizeof(int));
  MOE_TRY(s->ex && s->rc && s->goffs && cnt, MOE_ERR_STATE, "internal: exchange workspace too small");
  int *sc = cnt, *sd = cnt + W, *rcn = cnt + 2 * W, *rd = cnt + 3 * W;
  for (int q = 0; q < W; q++) {
    sc[q] = rcn[q] = El;
    sd[q] = rd[q] = q * El;
  }
  double t0 = moe__now();
  MOE_CHECK(moe__dist_alltoallv_i32(l->cfg.dist, s->kept, sc, sd, s->rc, rcn, rd)); /* 1. sizes */
  book(l, t0, 4.0 * El * (W - 1));
  int *srows = s->ex, *sdisp = s->ex + W, *rrows = s->ex + 2 * W, *rdisp = s->ex + 3 * W;
  int total = 0;
  for (int q = 0; q < W; q++) {
    srows[q] = s->offs[(q + 1) * El] - s->offs[q * El];
    sdisp[q] = s->offs[q * El];
    rrows[q] = 0;
    for (int e = 0; e < El; e++) rrows[q] += s->rc[q * El + e];
    rdisp[q] = total;
    total += rrows[q];
  }
  s->ng = El;
  s->grows = total;
  s->goffs[0] = 0;
  for (int e = 0; e < El; e++) {
    int n = 0;
    for (int q = 0; q < W; q++) n += s->rc[q * El + e];
    s->goffs[e + 1] = s->goffs[e] + n;
  }
  return MOE_OK;
}

size_t moe__ep_work_bytes(const moe_layer_t *l) {
  size_t R = (size_t)l->st->grows, D = (size_t)l->cfg.D;
  return moe__arena_size(R * 4) + 3 * moe__arena_size(R * D * 4); /* perm, xr, gx, gout */
}

moe_status moe__ep_plan(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  int W = world(l), El = s->ng, R = s->grows, D = l->cfg.D;
  moe__arena *a = &s->work;
  s->perm = moe__arena_alloc(a, (size_t)R * 4);
  s->xr = moe__arena_alloc(a, (size_t)R * D * 4);
  s->gx = moe__arena_alloc(a, (size_t)R * D * 4);
  s->gout = moe__arena_alloc(a, (size_t)R * D * 4);
  MOE_TRY((s->perm && s->xr && s->gx && s->gout) || R == 0, MOE_ERR_STATE, "internal: exchange workspace too small");
  const int *rdisp = s->ex + 3 * W;
  for (int q = 0; q < W; q++) {
    int src = rdisp[q];
    for (int e = 0; e < El; e++) {
      int dst = s->goffs[e];
      for (int p = 0; p < q; p++) dst += s->rc[p * El + e]; /* rows of e from lower ranks first */
      for (int i = 0; i < s->rc[q * El + e]; i++) s->perm[dst + i] = src + i;
      src += s->rc[q * El + e];
    }
  }
  return MOE_OK;
}

/* Row counts of the exchange, times D, in the order MPI wants (send, sdispl, recv, rdispl). */
static void scaled(const moe_layer_t *l, int reverse, int *out) {
  int W = world(l), D = l->cfg.D;
  const int *ex = l->st->ex;
  for (int q = 0; q < W; q++) {
    out[q] = ex[(reverse ? 2 : 0) * W + q] * D;
    out[W + q] = ex[(reverse ? 3 : 1) * W + q] * D;
    out[2 * W + q] = ex[(reverse ? 0 : 2) * W + q] * D;
    out[3 * W + q] = ex[(reverse ? 1 : 3) * W + q] * D;
  }
}

/* The token exchange (reverse: the way back), with its time and the bytes sent to other ranks booked. */
static moe_status exchange(moe_layer_t *l, int reverse, const float *send, float *recv) {
  int W = world(l), c[4 * MOE__EP_MAX_RANKS];
  scaled(l, reverse, c);
  double t0 = moe__now(), sent = 0;
  for (int q = 0; q < W; q++) sent += q == moe_dist_rank(l->cfg.dist) ? 0 : 4.0 * c[q];
  MOE_CHECK(moe__dist_alltoallv_f32(l->cfg.dist, send, c, c + W, recv, c + 2 * W, c + 3 * W));
  book(l, t0, sent);
  return MOE_OK;
}

moe_status moe__ep_scatter(moe_layer_t *l, const float *rows, float *g) {
  moe__layer_state *s = l->st;
  int D = l->cfg.D;
  MOE_CHECK(exchange(l, 0, rows, s->xr)); /* 2. */
#pragma omp parallel for num_threads(s->threads) schedule(static)
  for (int i = 0; i < s->grows; i++) /* 3. expert-major */
    memcpy(g + (size_t)i * D, s->xr + (size_t)s->perm[i] * D, (size_t)D * 4);
  return MOE_OK;
}

moe_status moe__ep_gather(moe_layer_t *l, float *g, float *rows) {
  moe__layer_state *s = l->st;
  int D = l->cfg.D;
  float *stage = g == s->xr ? s->gx : s->xr; /* any dead buffer of the same size */
#pragma omp parallel for num_threads(s->threads) schedule(static)
  for (int i = 0; i < s->grows; i++)
    memcpy(stage + (size_t)s->perm[i] * D, g + (size_t)i * D, (size_t)D * 4);
  return exchange(l, 1, stage, rows);
}

moe_status moe__ep_static_view(moe_layer_t *l, int T) {
  moe__layer_state *s = l->st;
  int W = world(l), r = moe_dist_rank(l->cfg.dist);
  double n[MOE__EP_MAX_RANKS] = {0};
  n[r] = T;
  MOE_CHECK(moe_dist_allreduce(l->cfg.dist, n, W));
  double t0 = 0, tg = 0;
  for (int q = 0; q < W; q++) {
    t0 += q < r ? n[q] : 0;
    tg += n[q];
  }
  MOE_TRY(tg * l->cfg.top_k <= INT32_MAX / 2, MOE_ERR_ARG, "static dispatch: %.0f tokens over all ranks is too many", tg);
  s->t0 = (int)t0;
  s->Tgi = (int)tg;
  return MOE_OK;
}

size_t moe__ep_static_route_bytes(const moe_layer_t *l) {
  size_t Tg = (size_t)l->st->Tgi, k = (size_t)l->cfg.top_k;
  return moe__arena_size(Tg * (k + 1) * sizeof(double)) + moe__arena_size(Tg * k * 4) + 2 * moe__arena_size(Tg * 4) +
         moe__arena_size(Tg * 8);
}

/* n (W): floats in each owner's block of the (E, C, D) buffer: its experts' slots (C each, or
 * per-expert capacities), the same on every rank. */
static void static_blocks(const moe_layer_t *l, int *n) {
  int W = world(l), El = l->cfg.E / W, D = l->cfg.D;
  for (int r = 0; r < W; r++) n[r] = (l->st->offs[(r + 1) * El] - l->st->offs[r * El]) * D;
}

moe_status moe__ep_static_scatter(moe_layer_t *l, const float *rows, float *g) {
  double t0 = moe__now(), others = 0;
  int n[MOE__EP_MAX_RANKS], me = moe_dist_rank(l->cfg.dist);
  static_blocks(l, n);
  for (int r = 0; r < world(l); r++) others += r == me ? 0 : n[r];
  MOE_CHECK(moe__dist_reduce_scatter_f32(l->cfg.dist, rows, g, n));
  book(l, t0, 4.0 * others); /* every other owner's block */
  return MOE_OK;
}

moe_status moe__ep_static_gather(moe_layer_t *l, const float *g, float *rows) {
  double t0 = moe__now();
  int n[MOE__EP_MAX_RANKS];
  static_blocks(l, n);
  MOE_CHECK(moe__dist_allgather_f32(l->cfg.dist, g, rows, n));
  book(l, t0, 4.0 * n[moe_dist_rank(l->cfg.dist)] * (world(l) - 1)); /* this owner's block, to every other rank */
  return MOE_OK;
}
