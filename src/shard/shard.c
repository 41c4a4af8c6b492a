/* Tutel's adaptive parallelism r (DIGEST P2 1.3): the sharded layout, the tasks of an r (shard.h says
 * which), and the expert source that runs a rank's tasks. The source gathers the tasks' weights from
 * the shards into a one-process layer of the tasks (`cl`: task t is its expert t, of the slice's width)
 * with one all-to-all-v, runs the layer's own FFN experts on it (sources/ffn.c), and sends the tasks'
 * weight gradients back to the shards' owners, which add them: at r = 0 that is an all-gather forward
 * and a reduce-scatter backward; at r = ceil(W/E) (W > E) a rank needs only its own H rows, so nothing
 * but fc2's bias moves. The layout is the same for every r, so switching r moves no data. */
#include <stdlib.h>
#include <string.h>

#include "adapt/layer_setup.h"
#include "dist/dist.h"
#include "shard/shard.h"

int moe__shard_clip(int W, int E, int r) {
  int m = (W + E - 1) / E;
  return r < 0 ? 0 : r > m ? m : r;
}

/* Expert e's ranks [lo, hi) under r. */
static void expert_ranks(int W, int E, int r, int e, int *lo, int *hi) {
  if (r == 0) {
    *lo = 0, *hi = W;
  } else if (W > E) {
    *lo = (int)((int64_t)W * e / E), *hi = (int)((int64_t)W * (e + 1) / E);
  } else {
    *lo = (int)((int64_t)e * W / E), *hi = *lo + 1;
  }
}

int moe__shard_slices(int W, int E, int H, int r, int e) {
  if (r == 0) return 1;
  int lo, hi;
  expert_ranks(W, E, r, e, &lo, &hi);
  int n = hi - lo < r ? hi - lo : r;
  return n < H ? n : H;
}

/* Slice j's sub-group [*lo, *hi) of expert e's ranks. */
static void sub_group(int W, int E, int H, int r, int e, int j, int *lo, int *hi) {
  int a, b, ns = moe__shard_slices(W, E, H, r, e);
  expert_ranks(W, E, r, e, &a, &b);
  *lo = a + (b - a) * j / ns;
  *hi = a + (b - a) * (j + 1) / ns;
}

int moe__shard_member(int W, int E, int H, int r, int e, int j, int s) {
  int lo, hi;
  sub_group(W, E, H, r, e, j, &lo, &hi);
  return lo + s % (hi - lo);
}

int moe__shard_tasks(int W, int E, int H, int r, int p, moe__task *t) {
  int n = 0;
  for (int e = 0; e < E; e++) {
    int ns = moe__shard_slices(W, E, H, r, e);
    for (int j = 0; j < ns; j++) {
      int lo, hi;
      sub_group(W, E, H, r, e, j, &lo, &hi);
      if (p >= lo && p < hi) t[n++] = (moe__task){e, j, (int)((int64_t)H * j / ns), (int)((int64_t)H * (j + 1) / ns)};
    }
  }
  return n;
}

/* ---- the layout ---- */

int moe__shard_axis(const moe_layer_t *l, const moe_param_info *p, int q, int64_t w[3], int *lo, int *hi) {
  const moe_layer_config *c = &l->cfg;
  if (!moe__layer_sharded(c) || strncmp(p->name, "experts.", 8)) return 0;
  const char *n = p->name + 8;
  int64_t E = c->E, H = c->H, D = c->D;
  int axis = 1;
  if (!strcmp(n, "fc1.weight") || !strcmp(n, "fc3.weight")) w[0] = E, w[1] = H, w[2] = D;
  else if (!strcmp(n, "fc1.bias")) w[0] = E, w[1] = H, w[2] = 1;
  else if (!strcmp(n, "fc2.weight")) w[0] = E, w[1] = D, w[2] = H, axis = 2;
  else w[0] = E, w[1] = D, w[2] = 1; /* fc2.bias: its D columns */
  int W = moe_dist_size(c->dist);
  *lo = (int)(w[axis] * q / W);
  *hi = (int)(w[axis] * (q + 1) / W);
  return axis;
}

long long moe__shard_local(const moe_layer_t *l, const moe_param_info *p, size_t j) {
  int64_t w[3];
  int lo, hi, ax = moe__shard_axis(l, p, moe_dist_rank(l->cfg.dist), w, &lo, &hi);
  if (!ax) return (long long)j;
  int64_t e = (int64_t)j / (w[1] * w[2]), i = (int64_t)j / w[2] % w[1], c = (int64_t)j % w[2];
  int64_t x = ax == 1 ? i : c;
  if (x < lo || x >= hi) return -1;
  int64_t A = ax == 1 ? hi - lo : w[1], B = ax == 2 ? hi - lo : w[2];
  return (long long)((e * A + (ax == 1 ? i - lo : i)) * B + (ax == 2 ? c - lo : c));
}

/* Element k of rank q's shard of tensor p: its index in the whole tensor. */
static size_t whole_of(const moe_layer_t *l, const moe_param_info *p, int q, size_t k) {
  int64_t w[3];
  int lo, hi, ax = moe__shard_axis(l, p, q, w, &lo, &hi);
  if (!ax) return k; /* replicated: the whole tensor */
  int64_t A = ax == 1 ? hi - lo : w[1], B = ax == 2 ? hi - lo : w[2];
  int64_t e = (int64_t)k / (A * B), i = (int64_t)k / B % A, c = (int64_t)k % B;
  return (size_t)((e * w[1] + (ax == 1 ? i + lo : i)) * w[2] + (ax == 2 ? c + lo : c));
}

/* Rank q's floats of tensor p. */
static size_t shard_numel(const moe_layer_t *l, const moe_param_info *p, int q) {
  int64_t w[3];
  int lo, hi, ax = moe__shard_axis(l, p, q, w, &lo, &hi);
  return ax ? (size_t)(w[0] * w[1] * w[2] / w[ax] * (hi - lo)) : p->numel;
}

/* l's tensor of whole with the same name. */
static const moe_param_info *twin(const moe_layer_t *whole, const moe_param_info *p) {
  return moe_layer_param_find(whole, p->name);
}

static moe_status check_whole(const moe_layer_t *l, const moe_layer_t *whole, const char *what) {
  MOE_TRY(l && moe__shard_of(l), MOE_ERR_ARG, "%s: the layer is not sharded (parallel_r off or no dist)", what);
  MOE_TRY(whole && whole->cfg.E == l->cfg.E && whole->cfg.H == l->cfg.H && whole->cfg.D == l->cfg.D &&
              whole->nparams == l->nparams && !whole->cfg.dist,
          MOE_ERR_ARG, "%s: the whole layer must have the sharded one's E, H, D and tensors, without dist", what);
  return MOE_OK;
}

moe_status moe__shard_gather_tensor(const moe_layer_t *l, const moe_param_info *p, const float *src, float *dst) {
  const moe_dist *d = l->cfg.dist;
  int W = moe_dist_size(d), root = moe_dist_rank(d) == 0;
  int64_t w[3];
  int lo, hi;
  if (!moe__shard_axis(l, p, 0, w, &lo, &hi)) { /* replicated: rank 0's copy */
    if (root) memcpy(dst, src, p->numel * 4);
    return MOE_OK;
  }
  size_t n = (size_t)(w[0] * w[1] * w[2]);
  float *buf = root ? malloc(n * 4 + 4) : NULL; /* the shards, rank after rank */
  MOE_TRY(buf || !root, MOE_ERR_NOMEM, "%s: out of memory gathering %zu floats", p->name, n);
  moe_status st = moe_dist_gather(d, src, (int)p->numel, buf);
  for (int q = 0, at = 0; root && !st && q < W; at += (int)shard_numel(l, p, q), q++)
    for (size_t k = 0; k < shard_numel(l, p, q); k++) dst[whole_of(l, p, q, k)] = buf[at + k];
  free(buf);
  return st;
}

void moe__shard_take_tensor(const moe_layer_t *l, const moe_param_info *p, const float *whole, float *dst) {
  int me = moe_dist_rank(l->cfg.dist);
  for (size_t k = 0; k < p->numel; k++) dst[k] = whole[whole_of(l, p, me, k)];
}

moe_status moe_layer_shard_gather(const moe_layer_t *l, int grads, moe_layer_t *whole) {
  MOE_TRY(l && moe__shard_of(l), MOE_ERR_ARG, "moe_layer_shard_gather: the layer is not sharded");
  int root = moe_dist_rank(l->cfg.dist) == 0;
  if (root) MOE_CHECK(check_whole(l, whole, "moe_layer_shard_gather"));
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *p = &l->info[i];
    float *dst = root ? (grads ? whole->grads : whole->params) + twin(whole, p)->offset : NULL;
    MOE_CHECK(moe__shard_gather_tensor(l, p, (grads ? l->grads : l->params) + p->offset, dst));
  }
  return MOE_OK;
}

moe_status moe_layer_shard_take(moe_layer_t *l, const moe_layer_t *whole) {
  MOE_CHECK(check_whole(l, whole, "moe_layer_shard_take"));
  for (int i = 0; i < l->nparams; i++)
    moe__shard_take_tensor(l, &l->info[i], whole->params + twin(whole, &l->info[i])->offset,
                           l->params + l->info[i].offset);
  moe_layer_params_changed(l);
  return MOE_OK;
}

/* ---- the state and r ---- */

moe__shard *moe__shard_of(const moe_layer_t *l) { return moe__layer_transport(l, &moe__transport_shard); }

moe_status moe__shard_new(const moe_layer_t *l, void **self) {
  moe__shard *sh = calloc(1, sizeof *sh);
  moe__task *t = malloc(sizeof *t * (size_t)l->cfg.E);
  if (!sh || !t) {
    free(sh);
    free(t);
    MOE_TRY(0, MOE_ERR_NOMEM, "moe_layer_init: out of memory for the sharded layout");
  }
  *sh = (moe__shard){.r = l->cfg.parallel_r, .r_now = -1, .tasks = t, .cl_r = -1};
  *self = sh;
  return MOE_OK;
}

/* The tasks' layer. */
static void free_cl(moe__shard *sh) {
  if (sh->cl_r < 0) return;
  moe_layer_free(&sh->cl);
  sh->cl_r = -1;
}

void moe__shard_free(void *self) {
  moe__shard *sh = self;
  if (!sh) return;
  free_cl(sh);
  moe__arena_free(&sh->work);
  free(sh->wbuf);
  free(sh->tasks);
  free(sh);
}

moe_status moe_layer_set_parallel_r(moe_layer_t *l, int r) {
  moe__shard *sh = l ? moe__shard_of(l) : NULL;
  MOE_TRY(sh, MOE_ERR_ARG,
          "moe_layer_set_parallel_r: the layer is not sharded (it needs parallel_r set at init, with dist)");
  MOE_TRY(r >= MOE_PARALLEL_AUTO, MOE_ERR_ARG, "moe_layer_set_parallel_r: r must be >= 0 or -1 (auto), got %d", r);
  sh->r = r;
  l->cfg.parallel_r = r;
  return MOE_OK;
}

int moe_layer_parallel_r(const moe_layer_t *l) {
  const moe__shard *sh = l ? moe__shard_of(l) : NULL;
  return sh ? sh->r_now : -1;
}

int moe_layer_parallel_r_trial(const moe_layer_t *l) {
  const moe__shard *sh = l ? moe__shard_of(l) : NULL;
  return sh && sh->r == MOE_PARALLEL_AUTO && moe__layer_setup_trial(l);
}

moe_status moe__shard_use(moe__shard *sh, const moe_layer_config *c, int r) {
  int W = moe_dist_size(c->dist);
  sh->r_now = r;
  sh->nt = moe__shard_tasks(W, c->E, c->H, r, moe_dist_rank(c->dist), sh->tasks);
  if (sh->cl_r == r) return MOE_OK;
  free_cl(sh);
  moe_layer_config tc;
  moe_layer_config_default(&tc);
  tc.D = c->D;
  tc.H = sh->tasks[0].h1 - sh->tasks[0].h0; /* every task of a rank has this width (shard.h) */
  tc.E = sh->nt;
  tc.top_k = 1;
  tc.gate_bias = 0;
  tc.expert_bias = c->expert_bias;
  tc.act = c->act;
  tc.dtype = c->dtype;
  static const moe__plugins one_process = {&moe__transport_local, &moe__experts_own, NULL}; /* the FFN on its weights */
  MOE_CHECK(moe__layer_init(&sh->cl, &tc, &one_process));
  sh->cl_r = r;
  return MOE_OK;
}

/* ---- the weight source ---- */

/* Where a piece goes: weights from the owner's shard into a buffer, from the buffer into the tasks'
 * layer; gradients from the tasks' layer into a buffer, from the buffer added to the owner's shard. */
typedef enum { SHARD_TO_BUF, BUF_TO_TASKS, TASKS_TO_BUF, BUF_ADD_SHARD } piece_way;

/* Tensor p's block of task t (task ti of its rank) that rank q holds, moved `way` at buf (NULL:
 * counted only); its floats. */
static size_t piece(moe__shard *sh, const moe_layer_t *l, const moe_param_info *p, const moe__task *t, int ti, int q,
                    piece_way way, float *buf) {
  int64_t w[3];
  int lo, hi, ax = moe__shard_axis(l, p, q, w, &lo, &hi);
  int bias2 = !strcmp(p->name, "experts.fc2.bias");
  int t0 = bias2 ? 0 : t->h0, t1 = bias2 ? (t->j == 0 ? (int)w[1] : 0) : t->h1; /* fc2's bias: slice 0 */
  int a = lo > t0 ? lo : t0, b = hi < t1 ? hi : t1;
  if (a >= b) return 0;
  int64_t runs = ax == 1 ? b - a : w[1], len = ax == 1 ? w[2] : b - a;
  if (!buf) return (size_t)(runs * len);
  moe_layer_t *cl = &sh->cl;
  const moe_param_info *cp = twin(cl, p);
  int64_t As = ax == 1 ? hi - lo : w[1], Bs = ax == 2 ? hi - lo : w[2]; /* the shard's (E, As, Bs) */
  int64_t Ac = cp->ndim > 1 ? cp->shape[1] : 1, Bc = cp->ndim > 2 ? cp->shape[2] : 1; /* the tasks' */
  float *sd = (way == BUF_ADD_SHARD ? l->grads : l->params) + p->offset;
  float *tk = (way == TASKS_TO_BUF ? cl->grads : cl->params) + cp->offset;
  for (int64_t x = 0; x < runs; x++) {
    int64_t i = ax == 1 ? a + x : x;
    float *s = sd + (t->e * As + (ax == 1 ? i - lo : i)) * Bs + (ax == 2 ? a - lo : 0);
    float *c = tk + (ti * Ac + (ax == 1 ? i - t0 : i)) * Bc + (ax == 2 ? a - t0 : 0);
    float *bx = buf + x * len;
    if (way == SHARD_TO_BUF) memcpy(bx, s, (size_t)len * 4);
    else if (way == BUF_TO_TASKS) memcpy(c, bx, (size_t)len * 4);
    else if (way == TASKS_TO_BUF) memcpy(bx, c, (size_t)len * 4);
    else
      for (int64_t y = 0; y < len; y++) s[y] += bx[y];
  }
  return (size_t)(runs * len);
}

/* Every expert tensor's block of rank p's tasks that rank q holds (p or q is this rank), moved `way`
 * at buf (NULL: counted); its floats. */
static size_t pieces(moe__shard *sh, const moe_layer_t *l, int p, int q, piece_way way, float *buf,
                     moe__task *scratch) {
  const moe_layer_config *c = &l->cfg;
  int me = moe_dist_rank(c->dist), nt = sh->nt;
  const moe__task *t = sh->tasks;
  if (p != me) {
    nt = moe__shard_tasks(moe_dist_size(c->dist), c->E, c->H, sh->r_now, p, scratch);
    t = scratch;
  }
  size_t n = 0;
  for (int i = 0; i < l->nparams; i++) {
    int64_t w[3];
    int lo, hi;
    if (!moe__shard_axis(l, &l->info[i], q, w, &lo, &hi)) continue;
    for (int k = 0; k < nt; k++) n += piece(sh, l, &l->info[i], &t[k], k, q, way, buf ? buf + n : NULL);
  }
  return n;
}

/* grads 0: the tasks' weights from the shards (owner q sends rank p its part of p's tasks); 1: their
 * gradients added to the shards (the way back). */
static moe_status exchange_weights(moe__shard *sh, const moe__env *env, int grads) {
  const moe_layer_t *l = env->l;
  const moe_dist *d = l->cfg.dist;
  int W = moe_dist_size(d), me = moe_dist_rank(d);
  int c[4 * MOE__EP_MAX_RANKS]; /* to the owners' side: floats out, offsets out, floats in, offsets in */
  int *sc = c, *sd = c + W, *rc = c + 2 * W, *rd = c + 3 * W;
  moe__task *scratch = malloc(sizeof *scratch * (size_t)l->cfg.E);
  MOE_TRY(scratch, MOE_ERR_NOMEM, "sharded experts: out of memory");
  size_t out = 0, in = 0;
  for (int q = 0; q < W; q++) { /* grads 0: q is the task rank I send to; 1: the owner I send to */
    size_t ns = grads ? pieces(sh, l, me, q, TASKS_TO_BUF, NULL, scratch)
                      : pieces(sh, l, q, me, SHARD_TO_BUF, NULL, scratch);
    size_t nr = grads ? pieces(sh, l, q, me, BUF_ADD_SHARD, NULL, scratch)
                      : pieces(sh, l, me, q, BUF_TO_TASKS, NULL, scratch);
    sc[q] = (int)ns, sd[q] = (int)out, rc[q] = (int)nr, rd[q] = (int)in;
    out += ns, in += nr;
  }
  if (out + in + 1 > sh->wcap) { /* kept between steps: a fresh buffer each step costs its page faults */
    free(sh->wbuf);
    sh->wcap = out + in + 1;
    sh->wbuf = malloc(sh->wcap * 4);
  }
  float *sb = sh->wbuf, *rb = sb ? sb + out : NULL;
  moe_status st = sb && out + in < (size_t)INT32_MAX
                      ? MOE_OK
                      : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "sharded experts: cannot move %zu floats", out + in);
  if (!sb) sh->wcap = 0;
  for (int q = 0; q < W && !st; q++) {
    if (grads) pieces(sh, l, me, q, TASKS_TO_BUF, sb + sd[q], scratch);
    else pieces(sh, l, q, me, SHARD_TO_BUF, sb + sd[q], scratch);
  }
  double t0 = moe__now();
  if (!st) st = moe__dist_alltoallv_rows(d, sb, sc, sd, rb, rc, rd, 1);
  if (!st) moe__ep_book(env, t0, 4.0 * (double)(out - (size_t)sc[me]));
  for (int q = 0; q < W && !st; q++) {
    if (grads) pieces(sh, l, q, me, BUF_ADD_SHARD, rb + rd[q], scratch);
    else pieces(sh, l, me, q, BUF_TO_TASKS, rb + rd[q], scratch);
  }
  free(scratch);
  return st;
}

/* What the tasks' layer's FFN runs with: its own arena for the activations, the caller's threads. */
static moe__env cl_env(moe__shard *sh, const moe__env *env) {
  return (moe__env){&sh->cl, env->threads, env->route, &sh->work, env->comm, -1};
}

/* The state of the FFN source of the tasks' layer (its bf16 copies). */
static void *cl_ffn(const moe__shard *sh) { return moe__layer_source(&sh->cl, &moe__experts_own); }

static moe_status shard_init(const moe_layer_t *l, void *transport, void **self) {
  (void)l;
  *self = transport; /* the transport's state, which it frees */
  return MOE_OK;
}

static size_t shard_bytes(void *self, const moe__env *env, int ng, int rows) { /* the tasks' layer has its own arena */
  (void)self, (void)env, (void)ng, (void)rows;
  return 0;
}

static moe_status shard_alloc(void *self, const moe__env *env, int ng, int rows, moe__ffn *f) {
  moe__shard *sh = self;
  moe__env ce = cl_env(sh, env);
  MOE_CHECK(moe__arena_reserve(&sh->work, moe__ffn_bytes(cl_ffn(sh), &ce, ng, rows), "sharded expert"));
  return moe__ffn_alloc(cl_ffn(sh), &ce, ng, rows, f);
}

moe_status moe__shard_weights(moe__shard *sh, const moe__env *env, int grads) {
  MOE_CHECK(exchange_weights(sh, env, grads));
  if (!grads) moe_layer_params_changed(&sh->cl);
  return MOE_OK;
}

static moe_status shard_forward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                                const moe__ffn *f, const moe__side_work *side) {
  moe__shard *sh = self;
  moe__env ce = cl_env(sh, env);
  return moe__experts_own.forward(cl_ffn(sh), &ce, p, g, f, side);
}

/* Backward's first micro-batch zeroes the tasks' gradients; the transport sends them back after the last. */
static moe_status shard_backward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                                 const moe__ffn *f, const float *dy, float daux, float dz, float *dx) {
  moe__shard *sh = self;
  if (!sh->bwd_done) moe_layer_zero_grad(&sh->cl);
  moe__env ce = cl_env(sh, env);
  MOE_CHECK(moe__experts_own.backward(cl_ffn(sh), &ce, p, g, f, dy, daux, dz, dx));
  sh->bwd_done++;
  return MOE_OK;
}

const moe__expert_src moe__experts_shard = {"sharded",   0,           shard_init,    NULL, NULL, shard_bytes,
                                            shard_alloc, shard_forward, shard_backward, NULL};
