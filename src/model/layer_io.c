/* Layer options by name, and a layer to and from safetensors (DESIGN 4.2): shapes give D, H, E
 * and P, __metadata__ gives the options, every tensor is checked for dtype and exact shape, and a
 * tensor the configuration does not use is an error rather than silently ignored. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *act_names[] = {"relu", "gelu", "silu", "swiglu", "swiglu_oai"};
static const char *dispatch_names[] = {"dynamic", "static"};
static const char *priority_names[] = {"index", "score"};
static const char *router_names[] = {"linear", "cosine"};
static const char *reuse_names[] = {"none", "s4", "s2", "s3", "auto"}; /* moe_reuse order */
static const char *score_names[] = {"softmax", "sigmoid"};
static const char *group_score_names[] = {"max", "top2_sum"};
#define COUNT(a) (int)(sizeof(a) / sizeof(a[0]))

const char *moe_act_name(moe_act a) { return (unsigned)a < (unsigned)COUNT(act_names) ? act_names[a] : "?"; }
const char *moe_dispatch_name(moe_dispatch d) { return (unsigned)d < 2 ? dispatch_names[d] : "?"; }
const char *moe_priority_name(moe_priority p) { return (unsigned)p < 2 ? priority_names[p] : "?"; }
const char *moe_router_name(moe_router r) { return (unsigned)r < 2 ? router_names[r] : "?"; }
const char *moe_reuse_name(moe_reuse r) { return (unsigned)r <= MOE_REUSE_AUTO ? reuse_names[r] : "?"; }
const char *moe_score_name(moe_score x) { return (unsigned)x < 2 ? score_names[x] : "?"; }
const char *moe_group_score_name(moe_group_score g) { return (unsigned)g < 2 ? group_score_names[g] : "?"; }

#define PARSE_ENUM(fn, type, names)                                       \
  moe_status fn(const char *s, const char *field, type *out) {            \
    int v;                                                                \
    MOE_CHECK(moe__parse_name(s, field, names, COUNT(names), &v));             \
    *out = (type)v;                                                       \
    return MOE_OK;                                                        \
  }
PARSE_ENUM(moe_act_parse, moe_act, act_names)
PARSE_ENUM(moe_dispatch_parse, moe_dispatch, dispatch_names)
PARSE_ENUM(moe_priority_parse, moe_priority, priority_names)
PARSE_ENUM(moe_router_parse, moe_router, router_names)
PARSE_ENUM(moe_reuse_parse, moe_reuse, reuse_names)
PARSE_ENUM(moe_score_parse, moe_score, score_names)
PARSE_ENUM(moe_group_score_parse, moe_group_score, group_score_names)

void moe_layer_overrides_init(moe_layer_overrides *o) {
  o->top_k = -1;
  o->capacity_setting = NAN;
  o->normalize_topk = -2;
  o->act = o->dispatch = o->priority = o->router = o->dtype = -1;
  o->threads = -1;
  o->pipeline = -1;
  o->memory_reuse = -1;
  o->dist = NULL;
  o->expert_order = NULL;
}

moe_status moe__meta_int(const moe_st *f, const char *key, int *out) {
  const char *v = moe_st_meta(f, key);
  if (!v) return MOE_OK;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  MOE_TRY(*v && !*end && !errno && x >= -1000000000L && x <= 1000000000L, MOE_ERR_FORMAT,
          "%s: __metadata__ %s='%s' is not an integer", moe_st_path(f), key, v);
  *out = (int)x;
  return MOE_OK;
}

moe_status moe__meta_float(const moe_st *f, const char *key, float *out) {
  const char *v = moe_st_meta(f, key);
  if (!v) return MOE_OK;
  char *end;
  float x = strtof(v, &end);
  MOE_TRY(*v && !*end && isfinite(x), MOE_ERR_FORMAT, "%s: __metadata__ %s='%s' is not a finite number",
          moe_st_path(f), key, v);
  *out = x;
  return MOE_OK;
}

moe_status moe__meta_bool(const moe_st *f, const char *key, int *out) {
  const char *v = moe_st_meta(f, key);
  if (!v) return MOE_OK;
  MOE_TRY(!strcmp(v, "true") || !strcmp(v, "false"), MOE_ERR_FORMAT,
          "%s: __metadata__ %s='%s' (want true|false)", moe_st_path(f), key, v);
  *out = !strcmp(v, "true");
  return MOE_OK;
}

#define META_ENUM(f, key, parse, dst)                                      \
  do {                                                                     \
    const char *v_ = moe_st_meta(f, key);                                  \
    char field_[160];                                                      \
    snprintf(field_, sizeof field_, "%s: __metadata__ %s", moe_st_path(f), key); \
    if (v_) MOE_CHECK(parse(v_, field_, &(dst)));                          \
  } while (0)

static moe_status config_from_file(const moe_st *f, moe_layer_config *c) {
  moe_tensor_view v;
  const char *path = moe_st_path(f);
  MOE_CHECK(moe_st_get(f, "experts.fc1.weight", &v));
  MOE_TRY(v.ndim == 3, MOE_ERR_SHAPE, "%s: experts.fc1.weight must be (E, H, D), got %d dims", path, v.ndim);
  moe_layer_config_default(c);
  c->E = (int)v.shape[0];
  c->H = (int)v.shape[1];
  c->D = (int)v.shape[2];
  c->router = moe_st_has(f, "gate.proj.weight") ? MOE_ROUTER_COSINE : MOE_ROUTER_LINEAR; /* unless metadata says */
  MOE_CHECK(moe__layer_meta_read(f, c));
  if (c->router == MOE_ROUTER_COSINE) {
    MOE_CHECK(moe_st_get(f, "gate.weight", &v));
    MOE_TRY(v.ndim == 2, MOE_ERR_SHAPE, "%s: gate.weight must be (E, P), got %d dims", path, v.ndim);
    c->proj_dim = (int)v.shape[1];
  }
  c->gate_bias = moe_st_has(f, "gate.bias");
  c->select_bias = moe_st_has(f, "gate.select_bias");
  if (moe_st_has(f, "shared.fc1.weight")) {
    MOE_CHECK(moe_st_get(f, "shared.fc1.weight", &v));
    MOE_TRY(v.ndim == 2, MOE_ERR_SHAPE, "%s: shared.fc1.weight must be (shared_H, D), got %d dims", path, v.ndim);
    c->shared_H = (int)v.shape[0];
    c->shared_gate = moe_st_has(f, "shared.gate.weight");
  }
  c->expert_bias = moe_st_has(f, "experts.fc1.bias") || moe_st_has(f, "experts.fc2.bias") ||
                   moe_st_has(f, "experts.fc3.bias");
  return MOE_OK;
}

moe_status moe__layer_meta_read(const moe_st *f, moe_layer_config *c) {
  MOE_CHECK(moe__meta_int(f, "top_k", &c->top_k));
  MOE_CHECK(moe__meta_float(f, "capacity_setting", &c->capacity_setting));
  MOE_CHECK(moe__meta_bool(f, "normalize_topk", &c->normalize_topk));
  META_ENUM(f, "activation", moe_act_parse, c->act);
  META_ENUM(f, "dispatch", moe_dispatch_parse, c->dispatch);
  META_ENUM(f, "priority", moe_priority_parse, c->priority);
  META_ENUM(f, "router", moe_router_parse, c->router);
  META_ENUM(f, "dtype", moe_dtype_parse, c->dtype);
  META_ENUM(f, "score", moe_score_parse, c->score);
  MOE_CHECK(moe__meta_int(f, "n_group", &c->n_group));
  MOE_CHECK(moe__meta_int(f, "topk_group", &c->topk_group));
  META_ENUM(f, "group_score", moe_group_score_parse, c->group_score);
  MOE_CHECK(moe__meta_float(f, "routed_scale", &c->routed_scale));
  MOE_CHECK(moe__meta_float(f, "swiglu_alpha", &c->swiglu_alpha));
  return moe__meta_float(f, "swiglu_limit", &c->swiglu_limit);
}

moe_status moe__layer_meta_write(const moe_layer_config *c, moe_st_writer *w) {
  char buf[32];
  snprintf(buf, sizeof buf, "%d", c->top_k);
  MOE_CHECK(moe_st_writer_meta(w, "top_k", buf));
  snprintf(buf, sizeof buf, "%.9g", (double)c->capacity_setting);
  MOE_CHECK(moe_st_writer_meta(w, "capacity_setting", buf));
  int norm = c->normalize_topk < 0 ? c->top_k > 1 : c->normalize_topk;
  MOE_CHECK(moe_st_writer_meta(w, "normalize_topk", norm ? "true" : "false"));
  MOE_CHECK(moe_st_writer_meta(w, "activation", moe_act_name(c->act)));
  MOE_CHECK(moe_st_writer_meta(w, "dispatch", moe_dispatch_name(c->dispatch)));
  MOE_CHECK(moe_st_writer_meta(w, "priority", moe_priority_name(c->priority)));
  MOE_CHECK(moe_st_writer_meta(w, "router", moe_router_name(c->router)));
  if (c->dtype != MOE_DT_F32) MOE_CHECK(moe_st_writer_meta(w, "dtype", moe_compute_dtype_name(c->dtype)));
  if (c->score != MOE_SCORE_SOFTMAX) MOE_CHECK(moe_st_writer_meta(w, "score", moe_score_name(c->score)));
  if (c->n_group) { /* written only when used, so that files of other layers stay as they were */
    snprintf(buf, sizeof buf, "%d", c->n_group);
    MOE_CHECK(moe_st_writer_meta(w, "n_group", buf));
    snprintf(buf, sizeof buf, "%d", c->topk_group);
    MOE_CHECK(moe_st_writer_meta(w, "topk_group", buf));
    MOE_CHECK(moe_st_writer_meta(w, "group_score", moe_group_score_name(c->group_score)));
  }
  if (c->routed_scale != 1.0f) {
    snprintf(buf, sizeof buf, "%.9g", (double)c->routed_scale);
    MOE_CHECK(moe_st_writer_meta(w, "routed_scale", buf));
  }
  if (c->act == MOE_ACT_SWIGLU_OAI) {
    snprintf(buf, sizeof buf, "%.9g", (double)c->swiglu_alpha);
    MOE_CHECK(moe_st_writer_meta(w, "swiglu_alpha", buf));
    snprintf(buf, sizeof buf, "%.9g", (double)c->swiglu_limit);
    MOE_CHECK(moe_st_writer_meta(w, "swiglu_limit", buf));
  }
  return MOE_OK;
}

static void apply_overrides(moe_layer_config *c, const moe_layer_overrides *o) {
  if (!o) return;
  if (o->top_k != -1) c->top_k = o->top_k;
  if (!isnan(o->capacity_setting)) c->capacity_setting = o->capacity_setting;
  if (o->normalize_topk != -2) c->normalize_topk = o->normalize_topk;
  if (o->act != -1) c->act = (moe_act)o->act;
  if (o->dispatch != -1) c->dispatch = (moe_dispatch)o->dispatch;
  if (o->priority != -1) c->priority = (moe_priority)o->priority;
  if (o->router != -1) c->router = (moe_router)o->router;
  if (o->dtype != -1) c->dtype = (moe_dtype)o->dtype;
  if (o->threads != -1) c->threads = o->threads;
  if (o->pipeline != -1) c->pipeline = o->pipeline;
  if (o->memory_reuse != -1) c->memory_reuse = (moe_reuse)o->memory_reuse;
  if (o->dist) c->dist = o->dist;
}

/* Copies file tensor v into param p: expert tensors take this rank's slice of positions, and with an
 * expert order the rows of expert-indexed tensors (gate and experts) are taken in that order. */
static moe_status copy_rows(moe_layer_t *l, const moe_st *f, const moe_param_info *p, const moe_tensor_view *v,
                            const int32_t *order, int sliced, int64_t e0) {
  int by_expert = sliced || !strcmp(p->name, "gate.weight") || !strcmp(p->name, "gate.bias") ||
                  !strcmp(p->name, "gate.select_bias");
  int64_t rows = p->shape[0];
  size_t per = p->numel / (size_t)rows;
  for (int64_t r = 0; r < rows; r++) {
    int64_t src = by_expert && order ? order[e0 + r] : e0 + r;
    float *dst = l->params + p->offset + (size_t)r * per;
    MOE_CHECK(moe_st_view_f32(f, v, (size_t)src * per, per, dst));
    MOE_CHECK(moe__st_expect_finite(f, v, (size_t)src * per, dst, per));
  }
  return MOE_OK;
}

static moe_status copy_params(moe_layer_t *l, const moe_st *f, const int32_t *order) {
  const char *path = moe_st_path(f);
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *p = &l->info[i];
    moe_tensor_view v;
    MOE_CHECK(moe_st_get(f, p->name, &v));
    MOE_TRY(v.dtype == MOE_DT_F32 || v.dtype == MOE_DT_BF16, MOE_ERR_DTYPE,
            "%s: tensor '%s' has dtype %s, want F32 or BF16", path, p->name, moe_dtype_name(v.dtype));
    /* expert-parallel, this rank's experts are a slice of the file's (E, ...) tensors */
    int sliced = !strncmp(p->name, "experts.", 8) && l->cfg.dist;
    int64_t El = p->shape[0], e0 = sliced ? (int64_t)moe_dist_rank(l->cfg.dist) * El : 0;
    int64_t want[3] = {sliced ? l->cfg.E : p->shape[0], p->shape[1], p->shape[2]}; /* the file holds all E */
    MOE_CHECK(moe__st_expect_shape(f, &v, p->name, p->ndim, want));
    MOE_CHECK(copy_rows(l, f, p, &v, order, sliced, e0));
  }
  for (int i = 0; i < moe_st_count(f); i++) {
    moe_tensor_view v;
    MOE_CHECK(moe_st_at(f, i, &v));
    MOE_TRY(moe_layer_param_find(l, v.name), MOE_ERR_FORMAT,
            "%s: tensor '%s' is not used by this layer (router %s, activation %s)", path, v.name,
            moe_router_name(l->cfg.router), moe_act_name(l->cfg.act));
  }
  return MOE_OK;
}

moe_status moe_layer_load(moe_layer_t *l, const moe_st *f, const moe_layer_overrides *o) {
  moe_layer_config c;
  MOE_CHECK(config_from_file(f, &c));
  apply_overrides(&c, o);
  moe_status st = moe_layer_init(l, &c);
  MOE_TRY(st == MOE_OK, st, "%s: %s", moe_st_path(f), moe_last_error());
  if (o && o->expert_order) { /* a permutation of the experts */
    char *seen = calloc((size_t)c.E, 1);
    int ok = seen != NULL;
    for (int e = 0; ok && e < c.E; e++) {
      int32_t v = o->expert_order[e];
      ok = v >= 0 && v < c.E && !seen[v];
      if (ok) seen[v] = 1;
    }
    free(seen);
    if (!ok) {
      moe_layer_free(l);
      return moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "expert order: not a permutation of the %d experts", c.E);
    }
  }
  st = copy_params(l, f, o ? o->expert_order : NULL);
  if (st != MOE_OK) moe_layer_free(l);
  return st;
}

moe_status moe_layer_save_params(const moe_layer_t *l, moe_st_writer *w) {
  MOE_CHECK(moe_layer_save_grads(l, w, NULL));
  return moe__layer_meta_write(&l->cfg, w);
}

/* With prefix NULL: the parameters under their own names, the expert matrices (ndim 3) in the
 * layer's dtype; else the gradients, F32, as prefix + name. */
moe_status moe_layer_save_grads(const moe_layer_t *l, moe_st_writer *w, const char *prefix) {
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *p = &l->info[i];
    char name[128];
    snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", p->name);
    const float *src = (prefix ? l->grads : l->params) + p->offset;
    moe_dtype dt = !prefix && p->ndim == 3 ? l->cfg.dtype : MOE_DT_F32;
    MOE_CHECK(moe_st_writer_add_f32(w, name, dt, p->ndim, p->shape, src));
  }
  return MOE_OK;
}
