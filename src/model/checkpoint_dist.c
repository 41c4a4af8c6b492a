/* Checkpoints under expert parallelism: rank r holds experts [r E/W, (r+1) E/W) of every block, and
 * their optimizer state; the file is the one-process format whatever W saved it. Saving gathers every
 * rank's experts on rank 0 (rank order is expert order), which writes; loading reads the whole file
 * on every rank and keeps its own experts, so a run may resume with another number of ranks. With
 * FlexMoE's replicas (DESIGN 3.4) a rank's rows are the experts its slots hold: rank 0 takes each
 * expert from its lowest holder, so the file is the same as without replicas, and the placement goes
 * beside it in __metadata__ train (";replicas=" + moe_flex_layout_write, when there is a training
 * state). A load with replicas on as many ranks with as many slots takes that placement back; with
 * another number of ranks or slots it starts from expert parallelism's blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "internal.h"
#include "flex/wire.h"
#include "shard/shard.h"

/* The model of m's configuration on one process: its expert tensors whole, (E, ...). */
static moe_status whole_model(const moe_model_t *m, moe_model_t *whole) {
  moe_model_config c = m->cfg;
  c.moe.dist = NULL;
  return moe_model_init(whole, &c);
}

/* The tensors each rank holds a slice of (dimension 0, experts): the experts' of every block. */
static int split_ref(const moe_tensor_ref *r) {
  return !strncmp(r->name, "blocks.", 7) && strstr(r->name, ".moe.experts.") != NULL;
}

/* Tutel's sharded layout (parallel_r, shard.h): the layer and tensor behind ref r of m, or NULL. */
static const moe_param_info *sharded(const moe_model_t *m, const moe_tensor_ref *r, const moe_layer_t **l) {
  int b, at = 0;
  if (sscanf(r->name, "blocks.%d.moe.%n", &b, &at) != 1 || !at || b < 0 || b >= m->cfg.blocks) return NULL;
  *l = &m->layers[b];
  const moe_param_info *p = moe_layer_param_find(*l, r->name + at);
  int64_t w[3];
  int lo, hi;
  return p && moe__shard_axis(*l, p, 0, w, &lo, &hi) ? p : NULL;
}

/* Rank 0 gets n floats of every rank's src, in rank order, at dst; NULL dst on other ranks (sh: the
 * shards of sharded tensor sh of layer l instead). Copies when the tensor is replicated (every rank
 * holds the same values). */
static moe_status collect(const moe_dist *d, int split, const moe_layer_t *l, const moe_param_info *sh,
                          const float *src, size_t n, float *dst) {
  if (sh) return moe__shard_gather_tensor(l, sh, src, dst);
  if (split) return moe_dist_gather(d, src, (int)n, dst);
  if (dst) memcpy(dst, src, n * sizeof *src);
  return MOE_OK;
}

/* The placement of the block a tensor of the layers belongs to, or NULL without replicas. */
static const moe__flex_layer *flex_of(const moe_model_t *m, const moe_tensor_ref *r) {
  int b = -1;
  if (sscanf(r->name, "blocks.%d.", &b) != 1 || b < 0 || b >= m->cfg.blocks) return NULL;
  return moe__flex_of(&m->layers[b]);
}

/* collect for a tensor whose rows are the experts the ranks' slots hold (n floats on each rank): all
 * rows to rank 0, which keeps each expert's from its lowest holder, in expert order. */
static moe_status collect_held(const moe_dist *d, const moe__flex_layer *f, const float *src, size_t n, float *dst) {
  int W = f->W, E = f->t.E;
  float *all = dst ? malloc(sizeof *all * n * (size_t)W) : NULL;
  MOE_TRY(all || !dst, MOE_ERR_NOMEM, "checkpoint: %zu floats of every rank's experts", n);
  moe_status st = moe_dist_gather(d, src, (int)n, all);
  size_t per = n / (size_t)f->t.Ev;
  for (int e = 0; st == MOE_OK && dst && e < E; e++) {
    int g = 0;
    while (!moe__flex_count(&f->t, e, g)) g++;
    memcpy(dst + (size_t)e * per, all + (size_t)g * n + (size_t)moe__flex_row_on(&f->t, g, e) * per, per * 4);
  }
  free(all);
  return st;
}

/* Rank 0 gets tensor r's values of every rank (src: its data or a moment of it) in the one-process
 * layout. */
static moe_status collect_ref(const moe_model_t *m, const moe_tensor_ref *r, const float *src, float *dst) {
  const moe_dist *d = m->cfg.moe.dist;
  const moe__flex_layer *f = split_ref(r) ? flex_of(m, r) : NULL;
  const moe_layer_t *l = NULL;
  const moe_param_info *sh = sharded(m, r, &l);
  return f ? collect_held(d, f, src, r->numel, dst) : collect(d, split_ref(r), l, sh, src, r->numel, dst);
}

static moe_status with_layout(const moe_model_t *m, const moe_train_state *ts, moe_train_state *out);

moe_status moe__checkpoint_save_ranks(const char *path, const moe_model_t *m, const moe_optim_t *o,
                                      const moe_train_state *ts) {
  const moe_dist *d = m->cfg.moe.dist;
  int root = moe_dist_rank(d) == 0;
  moe_model_t w = {0};
  moe_optim_t wo = {0};
  moe_status st = MOE_OK;
  if (root) {
    st = whole_model(m, &w);
    if (st == MOE_OK && o) st = moe_optim_init(&wo, &o->cfg, &w);
  }
  double failed = st != MOE_OK; /* every rank learns whether rank 0 can take the gathers */
  moe_status sd = moe_dist_allreduce(d, &failed, 1);
  if (st == MOE_OK && sd != MOE_OK) st = sd;
  if (st == MOE_OK && failed)
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: rank 0 cannot hold the whole model to save it", path);
  size_t off = 0, woff = 0;
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i];
    st = collect_ref(m, r, r->data, root ? w.refs[i].data : NULL);
    if (st == MOE_OK && o) st = collect_ref(m, r, o->m + off, root ? wo.m + woff : NULL);
    if (st == MOE_OK && o && o->v) st = collect_ref(m, r, o->v + off, root ? wo.v + woff : NULL);
    off += r->numel;
    woff += root ? w.refs[i].numel : 0;
  }
  for (int b = 0; st == MOE_OK && root && b < m->cfg.blocks; b++) /* every rank holds all E capacities */
    if (m->layers[b].expert_capacity)
      st = moe_layer_set_expert_capacity(&w.layers[b], m->layers[b].expert_capacity,
                                         m->layers[b].expert_capacity_tokens);
  moe_train_state kept;
  if (st == MOE_OK && ts && moe__flex_of(&m->layers[0])) st = with_layout(m, ts, &kept); /* the same on every rank */
  if (st == MOE_OK && root) {
    wo.step = o ? o->step : 0;
    st = moe_checkpoint_save(path, &w, o ? &wo : NULL, ts && moe__flex_of(&m->layers[0]) ? &kept : ts);
  }
  moe_optim_free(&wo);
  moe_model_free(&w);
  return st;
}

/* Copies n floats of this rank's part of src (its slice when split; its shard of tensor sh of l) to dst. */
static void take(const moe_dist *d, int split, const moe_layer_t *l, const moe_param_info *sh, const float *src,
                 size_t n, float *dst) {
  if (sh) moe__shard_take_tensor(l, sh, src, dst);
  else memcpy(dst, src + (split ? (size_t)moe_dist_rank(d) * n : 0), n * sizeof *src);
}

/* take for tensor r: its rows of the experts this rank holds when m has replicas, its shard when m is
 * sharded (parallel_r). */
static void take_ref(const moe_model_t *m, const moe_tensor_ref *r, const float *src, float *dst) {
  const moe__flex_layer *f = split_ref(r) ? flex_of(m, r) : NULL;
  if (!f) {
    const moe_layer_t *l = NULL;
    const moe_param_info *sh = sharded(m, r, &l);
    take(m->cfg.moe.dist, split_ref(r), l, sh, src, r->numel, dst);
    return;
  }
  size_t per = r->numel / (size_t)f->t.Ev;
  for (int j = 0; j < f->nh; j++) memcpy(dst + (size_t)j * per, src + (size_t)f->held[j] * per, per * 4);
}

/* m (and o) of w's configuration on d, each rank keeping its part of w (and wo); layout: the placement
 * the file keeps (NULL: none), taken when it is for these ranks and slots. */
static moe_status keep_own(const moe_dist *d, int parallel_r, int slots, const char *layout, const char *path,
                           const moe_model_t *w, const moe_optim_t *wo, moe_model_t *m, moe_optim_t *o) {
  moe_model_config c = w->cfg;
  c.moe.dist = d;
  c.moe.parallel_r = parallel_r;
  c.moe.replica_slots = slots;
  MOE_CHECK(moe_model_init(m, &c));
  if (slots && layout) MOE_CHECK(moe__flex_layout_read(m, layout, path));
  if (o && wo->m) {
    MOE_CHECK(moe_optim_init(o, &wo->cfg, m));
    o->step = wo->step;
  }
  size_t off = 0, woff = 0;
  for (int i = 0; i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i], *wr = &w->refs[i];
    const moe_layer_t *l = NULL;
    const moe_param_info *sh = sharded(m, r, &l);
    int split = split_ref(r);
    MOE_TRY(sh || slots || wr->numel == r->numel * (split ? (size_t)moe_dist_size(d) : 1), MOE_ERR_STATE,
            "internal: tensor %s has %zu floats on a rank, %zu whole", r->name, r->numel, wr->numel);
    take_ref(m, r, wr->data, r->data);
    if (o && o->m) take_ref(m, r, wo->m + woff, o->m + off);
    if (o && o->v) take_ref(m, r, wo->v + woff, o->v + off);
    off += r->numel;
    woff += wr->numel;
  }
  for (int b = 0; b < c.blocks; b++) {
    if (w->layers[b].expert_capacity)
      MOE_CHECK(moe_layer_set_expert_capacity(&m->layers[b], w->layers[b].expert_capacity,
                                              w->layers[b].expert_capacity_tokens));
    moe_layer_params_changed(&m->layers[b]); /* bf16 copies of the experts */
  }
  return MOE_OK;
}

moe_status moe_checkpoint_load_ranks(const char *path, const moe_dist *d, moe_model_t *m, moe_optim_t *o,
                                     moe_train_state *ts) {
  return moe_checkpoint_load_sharded(path, d, MOE_PARALLEL_OFF, m, o, ts);
}

/* The file on every rank, each keeping its part (parallel_r: its shards; slots: the blocks of replicas). */
static moe_status load_kept(const char *path, const moe_dist *d, int parallel_r, int slots, moe_model_t *m,
                            moe_optim_t *o, moe_train_state *ts);

moe_status moe_checkpoint_load_sharded(const char *path, const moe_dist *d, int parallel_r, moe_model_t *m,
                                       moe_optim_t *o, moe_train_state *ts) {
  return load_kept(path, d, parallel_r, 0, m, o, ts);
}

moe_status moe_checkpoint_load_replicas(const char *path, const moe_dist *d, int slots, moe_model_t *m,
                                        moe_optim_t *o, moe_train_state *ts) {
  return load_kept(path, d, MOE_PARALLEL_OFF, slots, m, o, ts);
}

static const char *take_layout(moe_train_state *ts, char *layout);

static moe_status load_kept(const char *path, const moe_dist *d, int parallel_r, int slots, moe_model_t *m,
                            moe_optim_t *o, moe_train_state *ts) {
  moe_train_state own;
  if (!ts) ts = &own;
  char layout[sizeof ts->extra];
  if (moe_dist_size(d) <= 1) {
    MOE_CHECK(moe_checkpoint_load(path, m, o, ts));
    take_layout(ts, layout);
    return MOE_OK;
  }
  MOE_TRY(path && m, MOE_ERR_ARG, "moe_checkpoint_load_ranks: NULL argument");
  memset(m, 0, sizeof *m);
  if (o) memset(o, 0, sizeof *o);
  moe_model_t w;
  moe_optim_t wo = {0};
  MOE_CHECK(moe_checkpoint_load(path, &w, o ? &wo : NULL, ts));
  moe_status st = keep_own(d, parallel_r, slots, take_layout(ts, layout), path, &w, &wo, m, o);
  if (st != MOE_OK) {
    if (o) moe_optim_free(o);
    moe_model_free(m);
    char why[512];
    snprintf(why, sizeof why, "%s", moe_last_error());
    st = moe__error(st, __FILE__, __LINE__, "%s on %d ranks: %s", path, moe_dist_size(d), why);
  }
  moe_optim_free(&wo);
  moe_model_free(&w);
  return st;
}

#define LAYOUT_KEY ";replicas="

/* ts with the placement of m's blocks after its options: LAYOUT_KEY + moe_flex_layout_write. */
static moe_status with_layout(const moe_model_t *m, const moe_train_state *ts, moe_train_state *out) {
  *out = *ts;
  size_t at = strlen(out->extra), key = strlen(LAYOUT_KEY);
  MOE_TRY(at + key < sizeof out->extra, MOE_ERR_ARG, "checkpoint: no room for the replica placement after the "
          "training options (%zu characters)", at);
  memcpy(out->extra + at, LAYOUT_KEY, key + 1);
  return moe_flex_layout_write(m, out->extra + at + key, sizeof out->extra - at - key);
}

/* The placement a checkpoint keeps, cut from ts's options into layout (room for them); NULL when none. */
static const char *take_layout(moe_train_state *ts, char *layout) {
  char *p = strstr(ts->extra, LAYOUT_KEY);
  if (!p) return NULL;
  snprintf(layout, sizeof ts->extra, "%s", p + strlen(LAYOUT_KEY));
  *p = 0;
  return layout;
}

int moe_checkpoint_replica_slots(const char *path, int W) {
  moe_st *f;
  if (moe_st_open_lazy(&f, path) != MOE_OK) return 0;
  const char *e = moe_st_meta(f, "E"), *train = moe_st_meta(f, "train");
  const char *p = train ? strstr(train, LAYOUT_KEY) : NULL;
  int E = e ? atoi(e) : 0, w = 0, Ev = 0;
  int slots = p && sscanf(p + strlen(LAYOUT_KEY), "%dx%d:", &w, &Ev) == 2 && w == W && Ev > 0 ? Ev
              : E > 0 && W > 0 ? E / W + 1 : 0;
  moe_st_close(f);
  return slots;
}
