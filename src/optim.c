/* Optimizers over a parameter table (a model's or a language model's refs, in their order): AdamW
 * (decoupled weight decay on matrices) and SGD with momentum; and the learning-rate schedule (linear
 * warm-up, cosine decay). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *moe_opt_name(moe_opt_kind k) { return k == MOE_OPT_SGD ? "sgd" : "adam"; }

moe_status moe_opt_parse(const char *s, const char *field, moe_opt_kind *out) {
  static const char *const names[] = {"adam", "sgd"};
  int v;
  MOE_CHECK(moe__parse_name(s, field, names, 2, &v));
  *out = (moe_opt_kind)v;
  return MOE_OK;
}

void moe_optim_config_default(moe_optim_config *c) {
  memset(c, 0, sizeof *c);
  c->kind = MOE_OPT_ADAM;
  c->beta1 = 0.9f;
  c->beta2 = 0.999f;
  c->eps = 1e-8f;
  c->momentum = 0.9f;
}

moe_status moe_optim_init(moe_optim_t *o, const moe_optim_config *c, const moe_model_t *m) {
  return moe_optim_init_n(o, c, m->numel);
}

moe_status moe_optim_init_n(moe_optim_t *o, const moe_optim_config *c, size_t numel) {
  memset(o, 0, sizeof *o);
  MOE_TRY((unsigned)c->kind <= MOE_OPT_SGD, MOE_ERR_ARG, "optimizer: unknown kind %d", c->kind);
  MOE_TRY(c->weight_decay >= 0 && isfinite(c->weight_decay), MOE_ERR_ARG, "optimizer: weight_decay must be >= 0");
  o->cfg = *c;
  o->n = numel;
  o->m = calloc(o->n ? o->n : 1, 4);
  o->v = c->kind == MOE_OPT_ADAM ? calloc(o->n ? o->n : 1, 4) : NULL;
  if (!o->m || (c->kind == MOE_OPT_ADAM && !o->v)) {
    moe_optim_free(o);
    MOE_TRY(0, MOE_ERR_NOMEM, "optimizer: cannot allocate state for %zu parameters", numel);
  }
  return MOE_OK;
}

void moe_optim_free(moe_optim_t *o) {
  free(o->m);
  free(o->v);
  memset(o, 0, sizeof *o);
}

int moe_param_decays(const moe_tensor_ref *r) { return r->ndim >= 2 && !strstr(r->name, "bias"); }

void moe_optim_step(moe_optim_t *o, moe_model_t *m, float lr) {
  moe_optim_step_refs(o, m->refs, m->nrefs, lr);
  for (int i = 0; i < m->cfg.blocks; i++) moe_layer_params_changed(&m->layers[i]); /* bf16 copies */
}

void moe_optim_step_refs(moe_optim_t *o, moe_tensor_ref *refs, int nrefs, float lr) {
  const moe_optim_config *c = &o->cfg;
  o->step++;
  float bc1 = 1.0f - powf(c->beta1, (float)o->step), bc2 = 1.0f - powf(c->beta2, (float)o->step);
  size_t off = 0;
  for (int i = 0; i < nrefs; i++) {
    moe_tensor_ref *r = &refs[i];
    float wd = moe_param_decays(r) ? c->weight_decay : 0.0f;
    float *p = r->data, *g = r->grad, *mo = o->m + off, *v = o->v ? o->v + off : NULL;
    /* simd: the tensors do not overlap, which the compiler cannot know; each element is computed as the
     * scalar loop computes it */
    if (c->kind == MOE_OPT_ADAM) {
#pragma omp simd
      for (size_t j = 0; j < r->numel; j++) {
        mo[j] = c->beta1 * mo[j] + (1.0f - c->beta1) * g[j];
        v[j] = c->beta2 * v[j] + (1.0f - c->beta2) * g[j] * g[j];
        float mh = mo[j] / bc1, vh = v[j] / bc2;
        p[j] -= lr * (mh / (sqrtf(vh) + c->eps) + wd * p[j]);
      }
    } else {
#pragma omp simd
      for (size_t j = 0; j < r->numel; j++) {
        mo[j] = c->momentum * mo[j] + g[j] + wd * p[j];
        p[j] -= lr * mo[j];
      }
    }
    off += r->numel;
  }
}

float moe_lr_schedule(float base, int64_t s, int64_t warmup, int64_t total) {
  if (s < warmup) return base * (float)(s + 1) / (float)warmup;
  if (total <= warmup) return base;
  double p = (double)(s - warmup) / (double)(total - warmup);
  if (p > 1) p = 1;
  return (float)(base * 0.5 * (1.0 + cos(M_PI * p)));
}
