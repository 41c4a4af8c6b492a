/* Landing a FlexMoE placement on a layer (DESIGN 3.4): every expert a rank newly holds is copied,
 * weights and optimizer state, from its old holder nearest in rank number, then each rank lays out its
 * rows anew. Expand, Shrink and Migrate are all such changes of the table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "flex/wire.h"

/* Block b's expert tensors: their rows in the parameters, the gradients and the optimizer's moments
 * (o may be NULL, or hold no second moment). */
void moe__flex_rows_of(const moe_model_t *m, const moe_optim_t *o, int b, moe__flex_rows *r) {
  char prefix[48];
  snprintf(prefix, sizeof prefix, "blocks.%d.moe.experts.", b);
  size_t off = 0, n = strlen(prefix);
  *r = (moe__flex_rows){0};
  for (int i = 0; i < m->nrefs; off += m->refs[i++].numel) {
    const moe_tensor_ref *ref = &m->refs[i];
    if (strncmp(ref->name, prefix, n) || r->nt == MOE__FLEX_NREF) continue;
    r->p[r->nt] = ref->data, r->g[r->nt] = ref->grad;
    r->m[r->nt] = o && o->m ? o->m + off : NULL;
    r->v[r->nt] = o && o->v ? o->v + off : NULL;
    r->n[r->nt++] = ref->numel / (size_t)ref->shape[0];
  }
}

/* Row j of the state (parameters, then the moments present) to or from a packed row. */
static size_t pack(const moe__flex_rows *r, int j, float *x, int out) {
  size_t k = 0;
  for (int i = 0; i < r->nt; i++) {
    float *a[3] = {r->p[i], r->m[i], r->v[i]};
    for (int q = 0; q < 3; q++) {
      if (!a[q]) continue;
      float *row = a[q] + (size_t)j * r->n[i];
      if (x) memcpy(out ? x + k : row, out ? row : x + k, r->n[i] * 4);
      k += r->n[i];
    }
  }
  return k;
}

/* The holder of e in t nearest to g in rank number (ties to the lower rank), as Expand's source. */
static int source_of(const moe__flex_table *t, int e, int g) {
  int src = -1;
  for (int h = 0; h < t->W; h++)
    if (moe__flex_count(t, e, h) && (src < 0 || abs(h - g) < abs(src - g))) src = h;
  return src;
}

/* Whether rank g holds e under nt and not under ot: a copy it needs. */
static int needs(const moe__flex_table *nt, const moe__flex_table *ot, int e, int g) {
  return moe__flex_count(nt, e, g) && !moe__flex_count(ot, e, g);
}

/* l takes the placement `slots` (W x E_v): the copies its ranks need (each from the old holder
 * nearest in rank number), exchanged in one all-to-all-v of rows of one expert's state (weights and
 * moments), then each rank's rows laid out anew: its old row where it held the expert already, the
 * received one otherwise, zeros past its experts (which AdamW leaves at zero). */
moe_status moe__flex_land(moe_layer_t *l, const moe__flex_rows *rows, const int *slots, double *bytes) {
  moe__flex_layer *f = moe__flex_of(l);
  moe__flex_table nt = {0}, *ot = &f->t;
  MOE_CHECK(moe__flex_table_clone(&nt, ot));
  moe__flex_table_set_slots(&nt, slots);
  moe_status st = moe__flex_table_check(&nt);
  const moe__flex_rows r = *rows;
  int width = (int)pack(&r, 0, NULL, 0), W = f->W, me = f->me, ns = 0, nr = 0, moved = 0, E = ot->E, Ev = ot->Ev;
  int c[4 * MOE__FLEX_MAX_RANKS] = {0}, *sc = c, *sd = c + W, *rc = c + 2 * W, *rd = c + 3 * W;
  for (int g = 0; g < W; g++)
    for (int e = 0; e < E; e++)
      if (needs(&nt, ot, e, g)) {
        int src = source_of(ot, e, g);
        sc[g] += src == me;
        rc[src] += g == me;
        moved++;
      }
  for (int q = 0; q < W; q++) sd[q] = ns, ns += sc[q], rd[q] = nr, nr += rc[q];
  float *sbuf = malloc(4 * (size_t)width * (ns + 1)), *rbuf = malloc(4 * (size_t)width * (nr + 1));
  float *old = malloc(4 * (size_t)width * Ev);
  if (st == MOE_OK && (!sbuf || !rbuf || !old))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: %d expert states to move", ns + nr);
  float *at = sbuf;
  for (int g = 0; st == MOE_OK && g < W; g++) /* in the order the receivers read: experts ascending */
    for (int e = 0; e < E; e++)
      if (needs(&nt, ot, e, g) && source_of(ot, e, g) == me) at += pack(&r, moe__flex_row_on(ot, me, e), at, 1);
  if (st == MOE_OK) st = moe__dist_alltoallv_rows(l->cfg.dist, sbuf, sc, sd, rbuf, rc, rd, width);
  if (st == MOE_OK) {
    for (int j = 0; j < f->nh; j++) pack(&r, j, old + (size_t)width * j, 1);
    for (int j = 0, h = 0; h < E; h++) { /* the new rows, experts ascending */
      if (!moe__flex_count(&nt, h, me)) continue;
      const float *from = moe__flex_count(ot, h, me) ? old + (size_t)width * moe__flex_row_on(ot, me, h)
                                                     : rbuf + (size_t)width * rd[source_of(ot, h, me)]++;
      pack(&r, j++, (float *)from, 0);
    }
    moe__flex_table_assign(ot, &nt);
    moe__flex_layer_sync_held(f);
    for (int i = 0; i < r.nt; i++) {
      size_t lo = (size_t)f->nh * r.n[i], n = (size_t)Ev * r.n[i] - lo;
      memset(r.p[i] + lo, 0, n * 4);
      memset(r.g[i] + lo, 0, n * 4);
      if (r.m[i]) memset(r.m[i] + lo, 0, n * 4);
      if (r.v[i]) memset(r.v[i] + lo, 0, n * 4);
    }
    *bytes += 4.0 * width * moved;
    moe_layer_params_changed(l);
  }
  free(sbuf), free(rbuf), free(old);
  moe__flex_table_free(&nt);
  return st;
}


void moe__flex_rows_of_layer(moe_layer_t *l, moe__flex_rows *r) {
  *r = (moe__flex_rows){0};
  for (int i = 0; i < l->nparams && r->nt < MOE__FLEX_NREF; i++) {
    const moe_param_info *p = &l->info[i];
    if (strncmp(p->name, "experts.", 8)) continue;
    r->p[r->nt] = l->params + p->offset, r->g[r->nt] = l->grads + p->offset;
    r->n[r->nt++] = p->numel / (size_t)p->shape[0];
  }
}

moe_status moe_layer_flex_rebalance(moe_layer_t *l, const moe_flex_env *env, double threshold, int horizon,
                                    moe_flex_step *out) {
  MOE_TRY(l && env && out, MOE_ERR_ARG, "moe_layer_flex_rebalance: NULL argument");
  MOE_TRY(moe__flex_of(l), MOE_ERR_ARG, "moe_layer_flex_rebalance: the layer has no replica slots");
  MOE_CHECK(moe__flex_check_env(env));
  moe__flex_layer *f = moe__flex_of(l);
  moe__flex_env e = moe__flex_env_of(env);
  moe__flex_policy pol = moe__flex_policy_default();
  pol.threshold = threshold;
  if (horizon > 0) pol.horizon = horizon;
  moe__flex_table t = {0};
  moe__flex_plan plan = {0};
  MOE_CHECK(moe__flex_table_clone(&t, &f->t));
  moe_status st = moe__flex_schedule(&t, f->Isrc, &e, &pol, &plan);
  if (st == MOE_OK) *out = moe__flex_step_of(&plan, &e);
  if (st == MOE_OK && plan.nops) {
    moe__flex_rows r;
    double bytes = 0;
    moe__flex_rows_of_layer(l, &r);
    st = moe__flex_land(l, &r, t.slot, &bytes);
  }
  moe__flex_plan_free(&plan);
  moe__flex_table_free(&t);
  return st;
}
