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
#include <string.h>

#include "dist/comm_stream.h"
#include "dist/dist.h"
#include "layer/layer_internal.h"

static int world(const moe_layer_t *l) { return moe_dist_size(l->cfg.dist); }

void moe__ep_book(moe_layer_t *l, double t0, double bytes) {
  l->st->comm.seconds += moe__now() - t0;
  l->st->comm.bytes += bytes;
  l->st->comm.exchanges++;
}

void moe_layer_comm_stats(const moe_layer_t *l, moe_comm_stats *out) { *out = l->st->comm; }
void moe_layer_comm_reset(moe_layer_t *l) { memset(&l->st->comm, 0, sizeof l->st->comm); }

size_t moe__ep_route_bytes(const moe_layer_t *l) {
  size_t W = (size_t)world(l), E = (size_t)l->cfg.E;
  return moe__arena_size(E * 4) * 2 + moe__arena_size((E + 1) * 4) +
         moe__arena_size((2 * E + 2) * sizeof(double)) + moe__arena_size(6 * W * sizeof(int));
}

static moe_status a2a_groups(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  int W = world(l), El = l->cfg.E / W;
  moe__arena *a = &s->route;
  s->p.rc = moe__arena_alloc(a, (size_t)l->cfg.E * 4);
  s->p.goffs = moe__arena_alloc(a, (size_t)(El + 1) * 4);
  int *cnt = moe__arena_alloc(a, 6 * (size_t)W * sizeof(int));
  MOE_TRY(s->p.rc && s->p.goffs && cnt, MOE_ERR_STATE, "internal: exchange workspace too small");
  int *sc = cnt, *sd = cnt + W, *rcn = cnt + 2 * W, *rd = cnt + 3 * W;
  for (int q = 0; q < W; q++) {
    sc[q] = rcn[q] = El;
    sd[q] = rd[q] = q * El;
  }
  double t0 = moe__now();
  MOE_CHECK(moe__dist_alltoallv_i32(l->cfg.dist, s->p.kept, sc, sd, s->p.rc, rcn, rd)); /* 1. sizes */
  moe__ep_book(l, t0, 4.0 * El * (W - 1));
  s->p.ng = El;
  s->p.goffs[0] = 0;
  for (int e = 0; e < El; e++) {
    int n = 0;
    for (int q = 0; q < W; q++) n += s->p.rc[q * El + e];
    s->p.goffs[e + 1] = s->p.goffs[e] + n;
  }
  s->p.grows = s->p.goffs[El]; /* every rank's rows for the local experts */
  return MOE_OK;
}

/* Rows of one buffer: all the groups' rows, or (plan.slotted) one micro-batch's. */
static size_t buffer_rows(const moe_layer_t *l) {
  return (size_t)(l->st->p.slotted ? l->st->p.mb_rows : l->st->p.grows);
}

/* Staging (rows in source order): the whole batch; or, slotted, two micro-batches per way in (the
 * exchange of i + 1 lands while i's rows are read), the way back reusing way 0's. */
static size_t staging_rows(const moe_layer_t *l) { return buffer_rows(l) * (l->st->p.slotted ? 4 : 1); }

static size_t a2a_work_bytes(const moe_layer_t *l) {
  size_t R = (size_t)l->st->p.grows, D = (size_t)l->cfg.D;
  return moe__arena_size(R * 4) + moe__arena_size(staging_rows(l) * D * 4) +
         3 * moe__arena_size(buffer_rows(l) * D * 4); /* perm, xr, gx, gout, gdx */
}

/* Micro-batch i's staging: its rows from every source rank, source after source. */
static float *staging(const moe_layer_t *l, int way, int i) {
  const moe__plan *p = &l->st->p;
  size_t at = p->slotted ? (size_t)(2 * way + i % 2) * (size_t)p->mb_rows : (size_t)p->mb[i].lo;
  return l->st->xr + at * (size_t)l->cfg.D;
}

/* perm: each expert-major row's place in its micro-batch's staging. */
static void micro_perm(moe_layer_t *l) {
  moe__plan *p = &l->st->p;
  int W = world(l), El = p->ng;
  for (int i = 0; i < p->n; i++) {
    int e0 = p->mb[i].e0, e1 = p->mb[i].e1, src = 0;
    for (int q = 0; q < W; q++)
      for (int e = e0; e < e1; e++) {
        int dst = p->goffs[e];
        for (int r = 0; r < q; r++) dst += p->rc[r * El + e]; /* rows of e from lower ranks first */
        for (int j = 0; j < p->rc[q * El + e]; j++) p->perm[dst + j] = src + j;
        src += p->rc[q * El + e];
      }
  }
}

static moe_status a2a_alloc(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  size_t D = (size_t)l->cfg.D, B = buffer_rows(l);
  moe__arena *a = &s->work;
  s->p.perm = moe__arena_alloc(a, (size_t)s->p.grows * 4);
  s->xr = moe__arena_alloc(a, staging_rows(l) * D * 4);
  s->gx = moe__arena_alloc(a, B * D * 4);
  s->gout = moe__arena_alloc(a, B * D * 4);
  s->gdx = moe__arena_alloc(a, B * D * 4);
  MOE_TRY((s->p.perm && s->gdx) || s->p.grows == 0, MOE_ERR_STATE, "internal: exchange workspace too small");
  micro_perm(l);
  return MOE_OK;
}

/* Row counts of micro-batch i's exchange (local experts [e0, e1) of every owner), in the order MPI
 * wants (send, sdispl, recv, rdispl); reverse: the way back. The rows sit in this rank's expert-sorted
 * rows, and, on the owner, in the micro-batch's staging, source after source. */
static void micro_counts(const moe_layer_t *l, int i, int reverse, int *out) {
  const moe__plan *p = &l->st->p;
  int W = world(l), El = p->ng, e0 = p->mb[i].e0, e1 = p->mb[i].e1;
  int *sc = out + (reverse ? 2 : 0) * W, *sd = out + (reverse ? 3 : 1) * W;
  int *rcn = out + (reverse ? 0 : 2) * W, *rd = out + (reverse ? 1 : 3) * W;
  for (int q = 0, at = 0; q < W; q++) {
    sc[q] = p->offs[q * El + e1] - p->offs[q * El + e0];
    sd[q] = p->offs[q * El + e0];
    int in = 0;
    for (int e = e0; e < e1; e++) in += p->rc[q * El + e];
    rcn[q] = in;
    rd[q] = at;
    at += in;
  }
}

/* Micro-batch i's token exchange (reverse: the way back), its bytes booked. With micro-batches it is
 * posted on the communication stream (*t: its ticket) to overlap the experts of another micro-batch;
 * with one there is nothing to overlap and it runs at once (*t = 0), its time booked. */
static moe_status exchange(moe_layer_t *l, int i, int reverse, const float *send, float *recv, uint64_t *t) {
  int W = world(l), c[4 * MOE__EP_MAX_RANKS], D = l->cfg.D;
  micro_counts(l, i, reverse, c);
  double t0 = moe__now(), sent = 0;
  for (int q = 0; q < W; q++) sent += q == moe_dist_rank(l->cfg.dist) ? 0 : 4.0 * D * c[q];
  *t = 0;
  if (l->st->p.n == 1)
    MOE_CHECK(moe__dist_alltoallv_rows(l->cfg.dist, send, c, c + W, recv, c + 2 * W, c + 3 * W, D));
  else
    MOE_CHECK(moe__stream_alltoallv_rows(l->cfg.dist, send, c, recv, D, t));
  if (*t) l->st->tk_last = *t;
  moe__ep_book(l, t0, sent);
  return MOE_OK;
}

/* Waits for exchange t; the wait is booked as time in exchanges: the part the experts did not hide. */
static moe_status await(moe_layer_t *l, uint64_t t) {
  double t0 = moe__now();
  MOE_CHECK(moe__stream_wait(l->cfg.dist, t));
  l->st->comm.seconds += moe__now() - t0;
  return MOE_OK;
}

/* Micro-batch i's rows in; the next micro-batch's exchange is posted before i's rows are reordered, so
 * that it overlaps the reorder and i's experts (the stream's order is MPipeMoE's S1 S2 R1 S3 R2 ...,
 * so a staging slot is free again when the exchange that reuses it starts). */
static moe_status a2a_send(moe_layer_t *l, int way, int i, const float *rows, float *g) {
  moe__layer_state *s = l->st;
  int D = l->cfg.D, lo = s->p.mb[i].lo, n = s->p.mb[i].rows;
  uint64_t *next = &s->tk_next[way];
  if (i == 0) MOE_CHECK(exchange(l, 0, 0, rows, staging(l, way, 0), next)); /* 2. */
  MOE_CHECK(await(l, *next));
  if (i + 1 < s->p.n) MOE_CHECK(exchange(l, i + 1, 0, rows, staging(l, way, i + 1), next));
  const float *in = staging(l, way, i);
#pragma omp parallel for num_threads(s->threads) schedule(static)
  for (int r = 0; r < n; r++) /* 3. expert-major */
    memcpy(g + (size_t)r * D, in + (size_t)s->p.perm[lo + r] * D, (size_t)D * 4);
  return MOE_OK;
}

static moe_status a2a_recv(moe_layer_t *l, int i, const float *g, float *rows) {
  moe__layer_state *s = l->st;
  int D = l->cfg.D, lo = s->p.mb[i].lo, n = s->p.mb[i].rows;
  float *out = staging(l, 0, i); /* free: its rows were read by send */
#pragma omp parallel for num_threads(s->threads) schedule(static)
  for (int r = 0; r < n; r++)
    memcpy(out + (size_t)s->p.perm[lo + r] * D, g + (size_t)r * D, (size_t)D * 4);
  uint64_t t;
  return exchange(l, i, 1, out, rows, &t);
}

/* The stream runs in order: the last exchange posted done, all are. */
static moe_status a2a_finish(moe_layer_t *l) {
  uint64_t t = l->st->tk_last;
  l->st->tk_last = l->st->tk_next[0] = l->st->tk_next[1] = 0;
  return await(l, t);
}

moe_status moe__ep_agree(moe_layer_t *l, moe_status mine) {
  int W = world(l);
  double failed[MOE__EP_MAX_RANKS] = {0};
  failed[moe_dist_rank(l->cfg.dist)] = mine != MOE_OK;
  moe_status st = moe_dist_allreduce(l->cfg.dist, failed, W);
  if (mine != MOE_OK) return mine; /* this rank's own message stays */
  MOE_CHECK(st);
  for (int q = 0; q < W; q++)
    MOE_TRY(!failed[q], MOE_ERR_STATE,
            "rank %d of %d failed its checks in this layer (its message says why): every rank stops here instead of "
            "waiting for it in an exchange", q, W);
  return MOE_OK;
}

moe_status moe__ep_global_counts(moe_layer_t *l, moe__view *v) {
  moe__layer_state *s = l->st;
  int E = l->cfg.E;
  double *g = moe__arena_alloc(&s->route, (size_t)E * sizeof *g);
  int32_t *counts = moe__arena_alloc(&s->route, (size_t)E * 4);
  MOE_TRY(g && counts, MOE_ERR_STATE, "internal: routing workspace too small");
  for (int e = 0; e < E; e++) g[e] = v->counts[e];
  MOE_CHECK(moe_dist_allreduce(l->cfg.dist, g, E));
  for (int e = 0; e < E; e++) counts[e] = (int32_t)g[e];
  v->counts = counts;
  return MOE_OK;
}

static moe_status a2a_begin(moe_layer_t *l, int T, size_t *route_bytes) {
  (void)T;
  *route_bytes = moe__ep_route_bytes(l);
  return MOE_OK;
}

const moe__transport moe__transport_a2a = {"all-to-all-v", 0,         a2a_begin, moe__ep_global_counts, a2a_groups,
                                           a2a_work_bytes, a2a_alloc, a2a_send,  a2a_recv, a2a_finish,
                                           moe__ep_agree};
