/* The token flows of Tutel's adaptive parallelism r (shard.h): every rank routes its own tokens; its rows
 * of expert e go, once per slice of e (the local repeat of P2 1.3), to the member of that slice's
 * sub-group that shard.h names (itself at r = 0: nothing moves but the sizes); the member computes
 * its slice of H on them and sends the partial outputs back, where the slices' outputs are summed
 * (the local sum). Backward sends the output gradients the same way (each slice needs all of them)
 * and sums the slices' input gradients on the way back. One all-to-all-v each way; the rows a rank
 * receives are reordered task-major (source after source within a task), as in transports/alltoall.c.
 * With micro-batches (MPipeMoE), micro-batch i is the tasks of experts [k0, k1) on every rank (micro.c,
 * plan.gkey): its rows are contiguous in each destination's part of the send staging and in each
 * source's part of the receive staging, so each micro-batch is one all-to-all-v of those parts each
 * way, posted on the communication stream (comm_stream.h) in transports/alltoall.c's order, i+1's before i's rows are
 * unpacked. The way back lands in the send staging; the local sums run in finish, once every exchange
 * is in. The tasks' weights are gathered before the first exchange (alloc) and their gradients sent
 * back in backward's finish, so that no weight exchange meets a token exchange in flight. */
#include <stdlib.h>
#include <string.h>

#include "dist/comm_stream.h"
#include "dist/dist.h"
#include "shard/shard.h"

static int world(const moe__env *env) { return moe_dist_size(env->l->cfg.dist); }

/* Segments: (row of xs, row of the send staging, rows, slice, expert, destination) each rank sends;
 * (row of the receive staging, row of the groups, rows, expert, source) it receives. At most E + W sent
 * (one per slice), W E received. */
enum { SEND_INTS = 6, RECV_INTS = 5 };
static size_t max_segs(const moe__env *env) {
  return (size_t)(env->l->cfg.E + world(env)) * SEND_INTS + (size_t)world(env) * env->l->cfg.E * RECV_INTS;
}

/* This step's r: the one asked, clipped, or the layer's dictionary's (adapt/layer_setup.c: its entry,
 * a trial's r while it searches), picked after routing. */
static int pick_r(const moe__shard *sh, const moe__env *env) {
  return sh->r != MOE_PARALLEL_AUTO ? moe__shard_clip(world(env), env->l->cfg.E, sh->r) : env->setup_r;
}

static moe_status sh_begin(void *self, const moe__env *env, int T, size_t *route_bytes) {
  (void)T;
  moe__shard *sh = self;
  size_t W = (size_t)world(env), E = (size_t)env->l->cfg.E;
  *route_bytes = moe__ep_route_bytes(&env->l->cfg) + moe__arena_size(W * E * 4) + moe__arena_size(4 * W * sizeof(int)) +
                 moe__arena_size(max_segs(env) * 4) + moe__arena_size((E + 1) * 4) + moe__arena_size(E * 4);
  sh->bwd_done = 0; /* a new forward, then its backward */
  sh->back = NULL;
  return MOE_OK;
}

static moe_status sh_groups(void *self, const moe__env *env, moe__plan *p) {
  moe__shard *sh = self;
  int W = world(env), E = env->l->cfg.E, H = env->l->cfg.H, me = moe_dist_rank(env->l->cfg.dist);
  int r = pick_r(sh, env);
  MOE_CHECK(moe__shard_use(sh, &env->l->cfg, r));
  moe__arena *a = env->route;
  sh->K = moe__arena_alloc(a, (size_t)W * E * 4);
  sh->cnt = moe__arena_alloc(a, 4 * (size_t)W * sizeof(int));
  sh->seg = moe__arena_alloc(a, max_segs(env) * 4);
  p->goffs = moe__arena_alloc(a, (size_t)(sh->nt + 1) * 4);
  int32_t *key = moe__arena_alloc(a, (size_t)E * 4);
  MOE_TRY(sh->K && sh->cnt && sh->seg && p->goffs && key, MOE_ERR_STATE, "internal: exchange workspace too small");
  for (int t = 0; t < sh->nt; t++) key[t] = sh->tasks[t].e;
  p->gkey = key; /* micro-batches cut by expert: the same cuts on every rank */
  int *sc = sh->cnt, *sd = sc + W, *rc = sc + 2 * W, *rd = sc + 3 * W;
  for (int q = 0; q < W; q++) sc[q] = rc[q] = E, sd[q] = 0, rd[q] = q * E;
  double t0 = moe__now();
  MOE_CHECK(moe__dist_alltoallv_i32(env->l->cfg.dist, p->kept, sc, sd, sh->K, rc, rd)); /* every rank's kept rows */
  moe__ep_book(env, t0, 4.0 * E * (W - 1));
  const int32_t *K = sh->K;
  /* the groups: my tasks, each the rows of its expert from the sources that send them to me */
  p->ng = sh->nt;
  p->goffs[0] = 0;
  for (int t = 0; t < sh->nt; t++) {
    int n = 0;
    for (int q = 0; q < W; q++)
      n += moe__shard_member(W, E, H, r, sh->tasks[t].e, sh->tasks[t].j, q) == me ? K[q * E + sh->tasks[t].e] : 0;
    p->goffs[t + 1] = p->goffs[t] + n;
  }
  p->grows = p->goffs[sh->nt];
  /* sent: my rows of every (e, j) to its member, destination after destination */
  memset(sc, 0, 4 * (size_t)W * sizeof(int));
  for (int e = 0; e < E; e++)
    for (int j = 0; j < moe__shard_slices(W, E, H, r, e); j++) sc[moe__shard_member(W, E, H, r, e, j, me)] += K[me * E + e];
  for (int q = 0, at = 0; q < W; at += sc[q++]) sd[q] = at;
  sh->srows = sd[W - 1] + sc[W - 1];
  int32_t *sg = sh->seg;
  sh->nsend = 0;
  for (int q = 0; q < W; q++) rc[q] = sd[q]; /* rc: each destination's next row, for now */
  for (int e = 0; e < E; e++)
    for (int j = 0; j < moe__shard_slices(W, E, H, r, e); j++) {
      int q = moe__shard_member(W, E, H, r, e, j, me);
      int32_t *x = sg + SEND_INTS * sh->nsend++;
      x[0] = p->offs[e], x[1] = rc[q], x[2] = K[me * E + e], x[3] = j, x[4] = e, x[5] = q;
      rc[q] += x[2];
    }
  /* received: from each source, its rows of my tasks in task order, into the task's rows */
  int32_t *rg = sg + SEND_INTS * sh->nsend;
  sh->nrecv = 0;
  for (int q = 0, at = 0; q < W; q++) {
    rd[q] = at;
    for (int t = 0; t < sh->nt; t++) {
      const moe__task *k = &sh->tasks[t];
      if (moe__shard_member(W, E, H, r, k->e, k->j, q) != me) continue;
      int got = p->goffs[t]; /* after the rows of the lower sources */
      for (int u = 0; u < q; u++) got += moe__shard_member(W, E, H, r, k->e, k->j, u) == me ? K[u * E + k->e] : 0;
      int32_t *x = rg + RECV_INTS * sh->nrecv++;
      x[0] = at, x[1] = got, x[2] = K[q * E + k->e], x[3] = k->e, x[4] = q;
      at += x[2];
    }
    rc[q] = at - rd[q];
  }
  return MOE_OK;
}

/* Stagings: one, or two when backward sends the forward's inputs again (plan.slotted): a way each. */
static int ways(const moe__plan *p) { return p->slotted ? 2 : 1; }

static size_t sh_work_bytes(void *self, const moe__env *env, const moe__plan *p) {
  const moe__shard *sh = self;
  size_t D = (size_t)env->l->cfg.D;
  size_t w = (size_t)ways(p);
  return w * moe__arena_size((size_t)sh->srows * D * 4) + w * moe__arena_size((size_t)p->grows * D * 4) +
         3 * moe__arena_size((size_t)p->grows * D * 4);
}

static moe_status sh_alloc(void *self, const moe__env *env, const moe__plan *p, moe__expert_bufs *b) {
  moe__shard *sh = self;
  size_t D = (size_t)env->l->cfg.D, R = (size_t)p->grows, S = (size_t)sh->srows;
  moe__arena *a = env->work;
  sh->sbuf = moe__arena_alloc(a, (size_t)ways(p) * S * D * 4);
  sh->xr = moe__arena_alloc(a, (size_t)ways(p) * R * D * 4);
  b->gx = moe__arena_alloc(a, R * D * 4);
  b->gout = moe__arena_alloc(a, R * D * 4);
  b->gdx = moe__arena_alloc(a, R * D * 4);
  MOE_TRY((b->gdx || R == 0) && (sh->sbuf || S == 0), MOE_ERR_STATE, "internal: exchange workspace too small");
  return moe__shard_weights(sh, env, 0);
}

/* Whether a segment's expert is in micro-batch i (every micro-batch at n = 1). */
static int in_micro(const moe__plan *p, int i, int e) {
  const moe__micro *m = &p->mb[i];
  return e >= m->k0 && e < m->k1;
}

/* Micro-batch i's exchange (back: the way back), from the send staging sb to the receive staging xr or
 * back, its bytes booked; posted on the stream with micro-batches (*t its ticket), else run at once. */
static moe_status exchange(moe__shard *sh, const moe__env *env, const moe__plan *p, int i, int back, float *sb,
                           float *xr, uint64_t *t) {
  int W = world(env), D = env->l->cfg.D, me = moe_dist_rank(env->l->cfg.dist);
  int c[4 * MOE__EP_MAX_RANKS] = {0}, *sc = c, *sd = c + W, *rc = c + 2 * W, *rd = c + 3 * W;
  for (int q = 0; q < W; q++) sd[q] = rd[q] = -1;
  for (int k = 0; k < sh->nsend; k++) { /* to each destination: its segments of the micro-batch's experts */
    const int32_t *x = sh->seg + SEND_INTS * k;
    if (!in_micro(p, i, x[4])) continue;
    if (sd[x[5]] < 0) sd[x[5]] = x[1];
    sc[x[5]] += x[2];
  }
  const int32_t *rg = sh->seg + SEND_INTS * sh->nsend;
  for (int k = 0; k < sh->nrecv; k++) { /* from each source: its rows of the micro-batch's tasks */
    const int32_t *x = rg + RECV_INTS * k;
    if (!in_micro(p, i, x[3])) continue;
    if (rd[x[4]] < 0) rd[x[4]] = x[0];
    rc[x[4]] += x[2];
  }
  double t0 = moe__now(), sent = 0;
  for (int q = 0; q < W; q++) {
    sd[q] = sd[q] < 0 ? 0 : sd[q], rd[q] = rd[q] < 0 ? 0 : rd[q];
    sent += q == me ? 0 : 4.0 * D * (back ? rc[q] : sc[q]);
  }
  for (int q = 0; back && q < 2 * W; q++) { /* the same counts, the other way */
    int u = c[q];
    c[q] = c[2 * W + q], c[2 * W + q] = u;
  }
  float *from = back ? xr : sb, *to = back ? sb : xr;
  *t = 0;
  if (p->n == 1) MOE_CHECK(moe__dist_alltoallv_rows(env->l->cfg.dist, from, sc, sd, to, rc, rd, D));
  else MOE_CHECK(moe__stream_alltoallv_rows(env->l->cfg.dist, from, c, to, D, t));
  if (*t) sh->tk.last = *t;
  moe__ep_book(env, t0, sent);
  return MOE_OK;
}

/* Copies n rows of D floats. */
static void rows_copy(float *to, const float *from, int n, int D) {
  if (n) memcpy(to, from, (size_t)n * D * 4);
}

/* Micro-batch i's rows in: the way's whole send staging packed at i = 0, the next micro-batch's
 * exchange posted before i's rows are unpacked into g (its groups' rows, from the micro-batch's first). */
static moe_status sh_send(void *self, const moe__env *env, const moe__plan *p, int way, int i, const float *rows,
                          float *g) {
  moe__shard *sh = self;
  int D = env->l->cfg.D, lo = p->mb[i].lo;
  float *sb = sh->sbuf + (size_t)way * sh->srows * D, *xr = sh->xr + (size_t)way * p->grows * D;
  uint64_t *next = &sh->tk.next[way];
  if (i == 0) {
    for (int k = 0; k < sh->nsend; k++) {
      const int32_t *x = sh->seg + SEND_INTS * k;
      rows_copy(sb + (size_t)x[1] * D, rows + (size_t)x[0] * D, x[2], D);
    }
    MOE_CHECK(exchange(sh, env, p, 0, 0, sb, xr, next));
  }
  MOE_CHECK(moe__stream_wait_timed(env->l->cfg.dist, *next, &env->comm->seconds));
  if (i + 1 < p->n) MOE_CHECK(exchange(sh, env, p, i + 1, 0, sb, xr, next));
  const int32_t *rg = sh->seg + SEND_INTS * sh->nsend;
  for (int k = 0; k < sh->nrecv; k++) {
    const int32_t *x = rg + RECV_INTS * k;
    if (in_micro(p, i, x[3])) rows_copy(g + (size_t)(x[1] - lo) * D, xr + (size_t)x[0] * D, x[2], D);
  }
  return MOE_OK;
}

/* Micro-batch i's partial outputs back, through its part of the receive staging (free: send unpacked
 * it) into its part of the send staging; finish sums them into rows. */
static moe_status sh_recv(void *self, const moe__env *env, const moe__plan *p, int i, const float *g, float *rows) {
  moe__shard *sh = self;
  int D = env->l->cfg.D, lo = p->mb[i].lo;
  const int32_t *rg = sh->seg + SEND_INTS * sh->nsend;
  for (int k = 0; k < sh->nrecv; k++) {
    const int32_t *x = rg + RECV_INTS * k;
    if (in_micro(p, i, x[3])) rows_copy(sh->xr + (size_t)x[0] * D, g + (size_t)(x[1] - lo) * D, x[2], D);
  }
  sh->back = rows;
  uint64_t t;
  return exchange(sh, env, p, i, 1, sh->sbuf, sh->xr, &t);
}

/* Every exchange in; then the local sums of the way back (slice 0 first, in slice order), and after a
 * backward's last micro-batch the tasks' gradients back to the shards. */
static moe_status sh_finish(void *self, const moe__env *env, const moe__plan *p) {
  moe__shard *sh = self;
  MOE_CHECK(moe__tickets_finish(&sh->tk, env));
  float *rows = sh->back;
  sh->back = NULL;
  int D = env->l->cfg.D;
  for (int k = 0; rows && k < sh->nsend; k++) {
    const int32_t *x = sh->seg + SEND_INTS * k;
    float *to = rows + (size_t)x[0] * D;
    const float *from = sh->sbuf + (size_t)x[1] * D;
    if (x[3] == 0) rows_copy(to, from, x[2], D);
    else
      for (size_t u = 0; u < (size_t)x[2] * D; u++) to[u] += from[u];
  }
  if (sh->bwd_done < p->n) return MOE_OK;
  sh->bwd_done = 0;
  return moe__shard_weights(sh, env, 1);
}

/* Every expert, this rank's part of each tensor (shard.h). */
static void sh_whole(void *self, const moe_layer_t *l, const moe_param_info *p, int64_t w[3]) {
  (void)self;
  int lo, hi;
  if (!moe__shard_axis(l, p, 0, w, &lo, &hi)) /* not split: whole here */
    w[0] = p->shape[0], w[1] = p->ndim > 1 ? p->shape[1] : 1, w[2] = p->ndim > 2 ? p->shape[2] : 1;
}

static long long sh_local(void *self, const moe_layer_t *l, const moe_param_info *p, size_t j) {
  (void)self;
  return moe__shard_local(l, p, j);
}

const moe__transport moe__transport_shard = {"sharded", 0,         moe__shard_new, moe__shard_free, sh_begin,
                                             moe__ep_view, sh_groups, sh_work_bytes, sh_alloc,      sh_send,
                                             sh_recv,   sh_finish, moe__ep_agree, sh_whole,       sh_local,
                                             NULL};
