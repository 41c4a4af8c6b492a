/* Checkpoints: one safetensors file with every parameter under its model name, the optimizer state
 * as "optim.m.<name>" / "optim.v.<name>", and in __metadata__ the whole configuration (model,
 * layer options, optimizer) and the training position, so that a run resumes bit for bit.
 * Written atomically by the safetensors writer. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define META_I(w, key, val)                                  \
  do {                                                       \
    char b_[32];                                             \
    snprintf(b_, sizeof b_, "%lld", (long long)(val));       \
    MOE_CHECK(moe_st_writer_meta(w, key, b_));               \
  } while (0)
#define META_F(w, key, val)                                  \
  do {                                                       \
    char b_[32];                                             \
    snprintf(b_, sizeof b_, "%.9g", (double)(val));          \
    MOE_CHECK(moe_st_writer_meta(w, key, b_));               \
  } while (0)

/* experts.fc1/fc2/fc3.weight of a block (or of an inner layer). */
static int expert_matrix(const moe_tensor_ref *r) { return r->ndim == 3 && strstr(r->name, "experts.fc") != NULL; }

/* A bf16 model's expert matrices: stored as BF16 (what the experts compute with, and what PyTorch
 * loads as torch.bfloat16), with their fp32 masters as master.<name> in training checkpoints. */
static int bf16_ref(const moe_model_t *m, const moe_tensor_ref *r) {
  return m->cfg.moe.dtype == MOE_DT_BF16 && expert_matrix(r);
}

static moe_dtype stored_dtype(const moe_model_t *m, const moe_tensor_ref *r) {
  return bf16_ref(m, r) ? MOE_DT_BF16 : MOE_DT_F32;
}

static moe_status save_into(moe_st_writer *w, const moe_model_t *m, const moe_optim_t *o,
                            const moe_train_state *ts) {
  const moe_model_config *c = &m->cfg;
  MOE_CHECK(moe_st_writer_meta(w, "format", "libmoe-checkpoint-1"));
  META_I(w, "in_dim", c->in_dim);
  META_I(w, "classes", c->classes);
  META_I(w, "blocks", c->blocks);
  META_I(w, "D", c->moe.D);
  META_I(w, "H", c->moe.H);
  META_I(w, "E", c->moe.E);
  META_I(w, "proj_dim", c->moe.proj_dim);
  META_I(w, "gate_bias", c->moe.gate_bias);
  META_I(w, "expert_bias", c->moe.expert_bias);
  META_I(w, "inner_experts", c->moe.inner_experts);
  META_I(w, "inner_top_k", c->moe.inner_top_k);
  MOE_CHECK(moe__layer_meta_write(&c->moe, w));
  MOE_CHECK(moe_st_writer_meta(w, "loss", moe_loss_name(c->loss)));
  META_F(w, "aux_weight", c->aux_weight);
  META_F(w, "z_weight", c->z_weight);
  for (int i = 0; i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i];
    MOE_CHECK(moe_st_writer_add_f32(w, r->name, stored_dtype(m, r), r->ndim, r->shape, r->data));
  }
  for (int i = 0; i < c->blocks; i++) { /* DynaMoE's per-expert capacities, and the batch they are for */
    const moe_layer_t *l = &m->layers[i];
    if (!l->expert_capacity) continue;
    char name[64];
    int64_t E = c->moe.E;
    snprintf(name, sizeof name, "blocks.%d.moe.expert_capacity", i);
    MOE_CHECK(moe_st_writer_add(w, name, MOE_DT_I32, 1, &E, l->expert_capacity));
    snprintf(name, sizeof name, "blocks.%d.expert_capacity_tokens", i);
    META_I(w, name, l->expert_capacity_tokens);
  }
  if (ts) {
    META_I(w, "epoch", ts->epoch);
    META_I(w, "step", ts->step);
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, ts->seed);
    MOE_CHECK(moe_st_writer_meta(w, "seed", b));
    MOE_CHECK(moe_st_writer_meta(w, "train", ts->extra));
  }
  if (!o) return MOE_OK;
  MOE_CHECK(moe_st_writer_meta(w, "optimizer", moe_opt_name(o->cfg.kind)));
  META_F(w, "beta1", o->cfg.beta1);
  META_F(w, "beta2", o->cfg.beta2);
  META_F(w, "eps", o->cfg.eps);
  META_F(w, "momentum", o->cfg.momentum);
  META_F(w, "weight_decay", o->cfg.weight_decay);
  META_I(w, "optim_step", o->step);
  size_t off = 0;
  for (int i = 0; i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i];
    char name[96];
    if (bf16_ref(m, r)) {
      snprintf(name, sizeof name, "master.%s", r->name);
      MOE_CHECK(moe_st_writer_add(w, name, MOE_DT_F32, r->ndim, r->shape, r->data));
    }
    snprintf(name, sizeof name, "optim.m.%s", r->name);
    MOE_CHECK(moe_st_writer_add(w, name, MOE_DT_F32, r->ndim, r->shape, o->m + off));
    if (o->v) {
      snprintf(name, sizeof name, "optim.v.%s", r->name);
      MOE_CHECK(moe_st_writer_add(w, name, MOE_DT_F32, r->ndim, r->shape, o->v + off));
    }
    off += r->numel;
  }
  return MOE_OK;
}

moe_status moe_checkpoint_save(const char *path, const moe_model_t *m, const moe_optim_t *o,
                               const moe_train_state *ts) {
  if (moe_dist_size(m->cfg.moe.dist) > 1) return moe__checkpoint_save_ranks(path, m, o, ts); /* checkpoint_dist.c */
  moe_st_writer *w;
  MOE_CHECK(moe_st_writer_new(&w));
  moe_status st = save_into(w, m, o, ts);
  if (st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  return st;
}

/* Copies tensor `name` of f (dtype want, F32 or BF16; the ref's exact shape) into dst as float32. */
static moe_status copy_tensor(const moe_st *f, moe_dtype want, const char *name, const moe_tensor_ref *r,
                              float *dst) {
  moe_tensor_view v;
  MOE_CHECK(moe_st_get(f, name, &v));
  MOE_TRY(v.dtype == want, MOE_ERR_DTYPE, "%s: tensor '%s' has dtype %s, want %s", moe_st_path(f), name,
          moe_dtype_name(v.dtype), moe_dtype_name(want));
  MOE_CHECK(moe__st_expect_shape(f, &v, name, r->ndim, r->shape));
  MOE_CHECK(moe_st_view_f32(f, &v, 0, r->numel, dst)); /* from memory, or the file when lazy */
  return moe__st_expect_finite(f, &v, 0, dst, r->numel);
}

/* A non-negative 64-bit __metadata__ value (absent: *out unchanged). */
static moe_status meta_u64(const moe_st *f, const char *key, uint64_t *out) {
  const char *v = moe_st_meta(f, key);
  if (!v) return MOE_OK;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  MOE_TRY(*v >= '0' && *v <= '9' && !*end && !errno, MOE_ERR_FORMAT, "%s: __metadata__ %s='%s' is not a count",
          moe_st_path(f), key, v);
  *out = x;
  return MOE_OK;
}

static moe_status need_int(const moe_st *f, const char *key, int *out) {
  MOE_TRY(moe_st_meta(f, key), MOE_ERR_MISSING, "%s: __metadata__ has no '%s': not a libmoe checkpoint?",
          moe_st_path(f), key);
  return moe__meta_int(f, key, out);
}

/* Before a model is allocated from the metadata: the file must hold at least as many values as the
 * configuration's input projection, head and expert matrices (and cosine projections), so that a small
 * file cannot make the loader allocate and initialize gigabytes before its tensors are compared. */
static moe_status check_holds(const moe_st *f, const moe_model_config *c) {
  const moe_layer_config *l = &c->moe;
  if (c->in_dim <= 0 || c->classes <= 0 || c->blocks <= 0 || l->D <= 0 || l->H <= 0 || l->E <= 0 ||
      l->inner_experts < 0 || l->proj_dim < 0)
    return MOE_OK; /* moe_model_init names what is wrong */
  double have = 0;
  for (int i = 0; i < moe_st_count(f); i++) {
    moe_tensor_view v;
    MOE_CHECK(moe_st_at(f, i, &v));
    have += (double)(v.nbytes / moe_dtype_size(v.dtype));
  }
  double experts = (double)l->E * (l->inner_experts > 0 ? l->inner_experts : 1);
  double need = (double)l->D * c->in_dim + (double)c->classes * l->D +
                c->blocks * (2 * experts * l->H * l->D + (l->router == MOE_ROUTER_COSINE ? (double)l->proj_dim * l->D : 0));
  MOE_TRY(need <= have, MOE_ERR_FORMAT,
          "%s: __metadata__ describes a model (in_dim %d, classes %d, blocks %d, D %d, H %d, E %d, inner_experts %d) "
          "of at least %.0f values, but the file holds %.0f: not a checkpoint of that model",
          moe_st_path(f), c->in_dim, c->classes, c->blocks, l->D, l->H, l->E, l->inner_experts, need, have);
  return MOE_OK;
}

static moe_status model_config(const moe_st *f, moe_model_config *c) {
  moe_model_config_default(c);
  MOE_CHECK(need_int(f, "in_dim", &c->in_dim));
  MOE_CHECK(need_int(f, "classes", &c->classes));
  MOE_CHECK(need_int(f, "blocks", &c->blocks));
  MOE_CHECK(need_int(f, "D", &c->moe.D));
  MOE_CHECK(need_int(f, "H", &c->moe.H));
  MOE_CHECK(need_int(f, "E", &c->moe.E));
  MOE_CHECK(need_int(f, "proj_dim", &c->moe.proj_dim));
  MOE_CHECK(need_int(f, "gate_bias", &c->moe.gate_bias));
  MOE_CHECK(need_int(f, "expert_bias", &c->moe.expert_bias));
  MOE_CHECK(moe__meta_int(f, "inner_experts", &c->moe.inner_experts));
  MOE_CHECK(moe__meta_int(f, "inner_top_k", &c->moe.inner_top_k));
  MOE_CHECK(moe__layer_meta_read(f, &c->moe));
  char field[300];
  snprintf(field, sizeof field, "%s: __metadata__ loss", moe_st_path(f));
  if (moe_st_meta(f, "loss")) MOE_CHECK(moe_loss_parse(moe_st_meta(f, "loss"), field, &c->loss));
  MOE_CHECK(moe__meta_float(f, "aux_weight", &c->aux_weight));
  MOE_CHECK(moe__meta_float(f, "z_weight", &c->z_weight));
  return check_holds(f, c);
}

/* Block i's per-expert capacities, when the checkpoint has them (*present = 1). */
static moe_status load_capacities(const moe_st *f, moe_layer_t *l, int i, int *present) {
  char name[64], key[64];
  snprintf(name, sizeof name, "blocks.%d.moe.expert_capacity", i);
  snprintf(key, sizeof key, "blocks.%d.expert_capacity_tokens", i);
  *present = moe_st_has(f, name);
  if (!*present) return MOE_OK;
  moe_tensor_view v;
  MOE_CHECK(moe_st_get(f, name, &v));
  MOE_TRY(v.dtype == MOE_DT_I32 && v.ndim == 1 && v.shape[0] == l->cfg.E, MOE_ERR_FORMAT,
          "%s: tensor '%s' must be I32 (%d)", moe_st_path(f), name, l->cfg.E);
  int tokens = -1;
  MOE_CHECK(moe__meta_int(f, key, &tokens));
  MOE_TRY(tokens >= 0, MOE_ERR_FORMAT, "%s: __metadata__ %s missing or negative", moe_st_path(f), key);
  int32_t *cap = malloc(sizeof(int32_t) * (size_t)l->cfg.E);
  MOE_TRY(cap, MOE_ERR_NOMEM, "out of memory");
  moe_status st = moe_st_read(f, &v, 0, v.nbytes, cap); /* loaded or lazy */
  if (st == MOE_OK) st = moe_layer_set_expert_capacity(l, cap, tokens);
  free(cap);
  MOE_TRY(st == MOE_OK, st, "%s: %s", moe_st_path(f), moe_last_error());
  return MOE_OK;
}

static moe_status load_from(const moe_st *f, moe_model_t *m, moe_optim_t *o, moe_train_state *ts) {
  moe_model_config c;
  MOE_CHECK(model_config(f, &c));
  moe_status st = moe_model_init(m, &c);
  MOE_TRY(st == MOE_OK, st, "%s: %s", moe_st_path(f), moe_last_error());
  for (int i = 0; i < m->nrefs; i++) MOE_CHECK(copy_tensor(f, stored_dtype(m, &m->refs[i]), m->refs[i].name, &m->refs[i], m->refs[i].data));
  int expected = m->nrefs;
  for (int i = 0; i < c.blocks; i++) {
    int present;
    MOE_CHECK(load_capacities(f, &m->layers[i], i, &present));
    expected += present;
  }
  if (ts) {
    memset(ts, 0, sizeof *ts);
    MOE_CHECK(moe__meta_int(f, "epoch", &ts->epoch));
    uint64_t step = 0;
    MOE_CHECK(meta_u64(f, "step", &step));
    MOE_CHECK(meta_u64(f, "seed", &ts->seed));
    MOE_TRY(ts->epoch >= 0 && step <= INT64_MAX, MOE_ERR_FORMAT, "%s: __metadata__ epoch or step out of range",
            moe_st_path(f));
    ts->step = (int64_t)step;
    const char *v = moe_st_meta(f, "train");
    if (v) snprintf(ts->extra, sizeof ts->extra, "%s", v);
  }
  const char *kind = moe_st_meta(f, "optimizer");
  if (kind) expected += m->nrefs * (strcmp(kind, "adam") ? 1 : 2);
  for (int i = 0; kind && i < m->nrefs; i++) expected += bf16_ref(m, &m->refs[i]); /* the masters */
  if (o && kind) {
    moe_optim_config oc;
    moe_optim_config_default(&oc);
    char field[300];
    snprintf(field, sizeof field, "%s: __metadata__ optimizer", moe_st_path(f));
    MOE_CHECK(moe_opt_parse(kind, field, &oc.kind));
    MOE_CHECK(moe__meta_float(f, "beta1", &oc.beta1));
    MOE_CHECK(moe__meta_float(f, "beta2", &oc.beta2));
    MOE_CHECK(moe__meta_float(f, "eps", &oc.eps));
    MOE_CHECK(moe__meta_float(f, "momentum", &oc.momentum));
    MOE_CHECK(moe__meta_float(f, "weight_decay", &oc.weight_decay));
    MOE_CHECK(moe_optim_init(o, &oc, m));
    uint64_t ostep = 0;
    MOE_CHECK(meta_u64(f, "optim_step", &ostep));
    MOE_TRY(ostep <= INT64_MAX, MOE_ERR_FORMAT, "%s: __metadata__ optim_step out of range", moe_st_path(f));
    o->step = (int64_t)ostep;
    size_t off = 0;
    for (int i = 0; i < m->nrefs; i++) {
      char name[96];
      if (bf16_ref(m, &m->refs[i])) { /* training goes on from the fp32 masters */
        snprintf(name, sizeof name, "master.%s", m->refs[i].name);
        MOE_CHECK(copy_tensor(f, MOE_DT_F32, name, &m->refs[i], m->refs[i].data));
      }
      snprintf(name, sizeof name, "optim.m.%s", m->refs[i].name);
      MOE_CHECK(copy_tensor(f, MOE_DT_F32, name, &m->refs[i], o->m + off));
      if (o->v) {
        snprintf(name, sizeof name, "optim.v.%s", m->refs[i].name);
        MOE_CHECK(copy_tensor(f, MOE_DT_F32, name, &m->refs[i], o->v + off));
      }
      off += m->refs[i].numel;
    }
  } else if (o) {
    memset(o, 0, sizeof *o);
  }
  MOE_TRY(moe_st_count(f) == expected, MOE_ERR_FORMAT,
          "%s: %d tensors, but the configuration accounts for %d: not a checkpoint of this model", moe_st_path(f),
          moe_st_count(f), expected);
  return MOE_OK;
}

/* Serving: a tensor of the model as the file stores it. The expert matrices (the ones a bf16 model
 * stores as BF16) may be F32 or BF16 whatever dtype the model computes in: serving widens; the
 * layers round again (RNE) for bf16, which leaves BF16 values as they are. */
static moe_status serving_tensor(const moe_st *f, const moe_tensor_ref *r) {
  moe_tensor_view v;
  MOE_CHECK(moe_st_get(f, r->name, &v));
  return copy_tensor(f, expert_matrix(r) && v.dtype == MOE_DT_BF16 ? MOE_DT_BF16 : MOE_DT_F32, r->name, r, r->data);
}

/* Serving: the model, in the compute dtype asked for (-1: the file's). K > 0: without its experts'
 * weights, which stay in the file behind one expert cache per block; the file stays open (lazily,
 * header only) as long as the model. K = 0: every tensor read into the model. */
static moe_status load_serving(moe_st *f, moe_model_t *m, int K, moe_cache_policy p, int dtype) {
  moe_model_config c;
  MOE_CHECK(model_config(f, &c));
  if (dtype >= 0) c.moe.dtype = (moe_dtype)dtype;
  c.moe.external_experts = K > 0; /* the layer's config check says what buffering cannot serve */
  moe_status st = moe_model_init(m, &c);
  MOE_TRY(st == MOE_OK, st, "%s: %s", moe_st_path(f), moe_last_error());
  if (K) m->file = f;
  for (int i = 0; i < m->nrefs; i++) MOE_CHECK(serving_tensor(f, &m->refs[i]));
  for (int i = 0; !K && i < c.blocks; i++) { /* all resident: static dispatch keeps its capacities */
    int present;
    MOE_CHECK(load_capacities(f, &m->layers[i], i, &present));
  }
  if (!K) return MOE_OK;
  for (int i = 0; i < moe_st_count(f); i++) { /* the experts stay in the file: checked once, here */
    moe_tensor_view v;
    MOE_CHECK(moe_st_at(f, i, &v));
    if (!strncmp(v.name, "blocks.", 7) && strstr(v.name, ".moe.experts.")) MOE_CHECK(moe__st_scan_finite(f, &v));
  }
  m->caches = calloc((size_t)c.blocks, sizeof *m->caches);
  MOE_TRY(m->caches, MOE_ERR_NOMEM, "out of memory");
  for (int i = 0; i < c.blocks; i++) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "blocks.%d.moe.experts.", i);
    MOE_CHECK(moe_expert_cache_open(&m->caches[i], f, prefix, &m->layers[i].cfg, K, p));
    MOE_CHECK(moe_layer_set_expert_cache(&m->layers[i], m->caches[i]));
  }
  return MOE_OK;
}

moe_status moe_checkpoint_load_serving(const char *path, moe_model_t *m, int K, moe_cache_policy p, int dtype) {
  MOE_TRY(path && m, MOE_ERR_ARG, "moe_checkpoint_load_serving: NULL argument");
  MOE_TRY(K >= 0, MOE_ERR_ARG, "moe_checkpoint_load_serving: K must be >= 0 (0: all experts resident), got %d", K);
  MOE_TRY(dtype == -1 || dtype == MOE_DT_F32 || dtype == MOE_DT_BF16, MOE_ERR_ARG,
          "moe_checkpoint_load_serving: dtype must be -1 (the checkpoint's), MOE_DT_F32 or MOE_DT_BF16, got %d",
          dtype);
  memset(m, 0, sizeof *m);
  moe_st *f;
  MOE_CHECK(moe_st_open_lazy(&f, path));
  moe_status st = load_serving(f, m, K, p, dtype);
  if (st != MOE_OK) {
    if (!m->file) moe_st_close(f);
    moe_model_free(m); /* closes m->file */
  } else if (!K) {
    moe_st_close(f); /* everything is in memory */
  }
  return st;
}

moe_status moe_checkpoint_load(const char *path, moe_model_t *m, moe_optim_t *o, moe_train_state *ts) {
  moe_st *f;
  MOE_TRY(path && m, MOE_ERR_ARG, "moe_checkpoint_load: NULL argument");
  memset(m, 0, sizeof *m);
  if (o) memset(o, 0, sizeof *o);
  MOE_CHECK(moe_st_open(&f, path));
  moe_status st = load_from(f, m, o, ts);
  moe_st_close(f);
  if (st != MOE_OK) {
    if (o) moe_optim_free(o);
    moe_model_free(m);
  }
  return st;
}
