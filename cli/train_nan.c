/* A training step that watches for divergence (moe train --on-nan). The model reports the first
 * non-finite activation of the forward and gradient of the backward, and the checked update
 * (moe_optim_step_checked) the parameters and optimizer state it wrote; every rank gets the same
 * answer. With skip-step a non-finite forward or backward drops the update, and an update that made
 * something non-finite is undone from a copy taken before it (the only way back: the optimizer has
 * already written it). */
#include <stdlib.h>
#include <string.h>

#include "train_nan.h"

static size_t state_floats(const moe_model_t *m, const moe_optim_t *o) {
  return m->numel * (1 + (o->m != NULL) + (o->v != NULL));
}

int nan_guard_init(nan_guard *g, int skip, const moe_model_t *m, const moe_optim_t *o) {
  memset(g, 0, sizeof *g);
  g->skip = skip;
  if (skip && !(g->copy = malloc(state_floats(m, o) * sizeof *g->copy))) return 1;
  return 0;
}

void nan_guard_free(nan_guard *g) {
  free(g->copy);
  memset(g, 0, sizeof *g);
}

/* Copies the parameters (ref by ref) and optimizer state to (save) or from the copy. */
static void transfer(nan_guard *g, moe_model_t *m, moe_optim_t *o, int save) {
  float *c = g->copy;
  for (int i = 0; i < m->nrefs; c += m->refs[i++].numel) {
    const moe_tensor_ref *r = &m->refs[i];
    memcpy(save ? c : r->data, save ? r->data : c, r->numel * sizeof *c);
  }
  float *st[2] = {o->m, o->v};
  for (int k = 0; k < 2; k++)
    if (st[k]) {
      memcpy(save ? c : st[k], save ? st[k] : c, m->numel * sizeof *c);
      c += m->numel;
    }
}

moe_status nan_guard_step(nan_guard *g, moe_model_t *m, moe_optim_t *o, const float *x, const uint8_t *y, int B,
                          float lr, moe_model_stats *st) {
  if (!g->grads_zero) moe_model_zero_grad(m);
  g->grads_zero = 0;
  moe_status s = moe_model_forward(m, x, y, B, st);
  if (s == MOE_OK) s = moe_model_backward(m);
  if (s == MOE_OK) {
    if (g->skip) transfer(g, m, o, 1);
    s = moe_optim_step_checked(o, m, lr);
    g->grads_zero = 1;
    if (s == MOE_ERR_VALUE && g->skip) {
      transfer(g, m, o, 0);
      o->step--;
      for (int i = 0; i < m->cfg.blocks; i++) moe_layer_params_changed(&m->layers[i]); /* bf16 copies */
    }
  }
  if (s == MOE_ERR_VALUE && g->skip) g->skipped++;
  return s;
}
