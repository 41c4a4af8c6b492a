/* The replicas' gradient sums in training (P3 1.7): the experts held by several ranks, merged into
 * sets by the ranks holding them (moe__flex_rank_sets), each set summed by one all-reduce over a
 * communicator of its ranks only (MPI_Comm_split), every rank issuing its sets in the order of their
 * lowest expert: two ranks that share several sets meet them in the same order. The communicators are
 * made for a placement and kept until the layer holds another: placements change on every rank at the
 * same step, so every rank makes them anew at the same call (the split is a collective over all). */
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "flex/wire.h"

struct moe__flex_comms {
  int *slots;             /* (W E_v) the placement they are for */
  int *set_of;            /* (E) each expert's set, -1 for none */
  uint64_t *masks;        /* (E) each set's ranks */
  int nsets;
  moe__dist_group **comm; /* (E) each set's communicator, NULL where this rank is outside it */
  float *buf;             /* room for the largest of this rank's sets */
};

void moe__flex_comms_free(moe__flex_comms *c) {
  if (!c) return;
  for (int k = 0; k < c->nsets; k++) moe__dist_group_free(c->comm[k]);
  free(c->slots), free(c->set_of), free(c->masks), free(c->comm), free(c->buf);
  free(c);
}

/* The communicators of t's sets and the buffer of this rank's largest (per: one expert's gradient floats). */
static moe_status make(const moe_layer_t *l, size_t per, moe__flex_comms **out) {
  const moe__flex_layer *f = moe__flex_of(l);
  const moe__flex_table *t = &f->t;
  size_t S = (size_t)t->W * t->Ev, E = (size_t)t->E;
  moe__flex_comms *c = calloc(1, sizeof *c);
  if (c) {
    c->slots = malloc(sizeof *c->slots * S), c->set_of = malloc(sizeof *c->set_of * E);
    c->masks = malloc(sizeof *c->masks * E), c->comm = calloc(E, sizeof *c->comm);
  }
  if (!c || !c->slots || !c->set_of || !c->masks || !c->comm) {
    moe__flex_comms_free(c);
    return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: the replica groups of %d experts", t->E);
  }
  memcpy(c->slots, t->slot, sizeof *c->slots * S);
  int n = moe__flex_rank_sets(t, c->set_of, c->masks), most = 0;
  moe_status st = MOE_OK;
  for (int k = 0; st == MOE_OK && k < n; k++, c->nsets++) {
    int in = (int)(c->masks[k] >> f->me & 1), size = 0;
    st = moe__dist_group_split(l->cfg.dist, in, &c->comm[k]);
    for (int e = 0; in && e < t->E; e++) size += c->set_of[e] == k;
    most = size > most ? size : most;
  }
  if (st == MOE_OK && most && !(c->buf = malloc(sizeof *c->buf * per * (size_t)most)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: %d experts' gradients", most);
  if (st != MOE_OK) {
    moe__flex_comms_free(c);
    return st;
  }
  *out = c;
  return MOE_OK;
}

/* The gradients of set k's experts on this rank to (out 1) or from (out 0) the buffer; floats packed. */
static size_t pack(const moe_layer_t *l, const moe__flex_rows *r, const moe__flex_comms *c, int k, int out) {
  size_t at = 0;
  for (int e = 0; e < l->cfg.E; e++) {
    if (c->set_of[e] != k) continue;
    int row = moe__flex_row(l, e);
    for (int i = 0; i < r->nt; i++) {
      float *g = r->g[i] + (size_t)row * r->n[i];
      memcpy(out ? c->buf + at : g, out ? g : c->buf + at, r->n[i] * 4);
      at += r->n[i];
    }
  }
  return at;
}

/* The gradients of the experts held by several ranks, summed over their holders so that every holder
 * applies the same update (training is the run without replicas). */
moe_status moe__flex_reduce_grads(moe_layer_t *l) {
  moe__flex_layer *f = moe__flex_of(l);
  moe__flex_rows r;
  moe__flex_rows_of_layer(l, &r);
  size_t per = 0;
  for (int i = 0; i < r.nt; i++) per += r.n[i];
  if (f->comms && memcmp(f->comms->slots, f->t.slot, sizeof(int) * (size_t)f->W * f->t.Ev)) {
    moe__flex_comms_free(f->comms); /* another placement */
    f->comms = NULL;
  }
  if (!f->comms) MOE_CHECK(make(l, per, &f->comms));
  const moe__flex_comms *c = f->comms;
  for (int k = 0; k < c->nsets; k++) {
    if (!c->comm[k]) continue;
    size_t n = pack(l, &r, c, k, 1);
    MOE_CHECK(moe__dist_group_allreduce_f32(c->comm[k], c->buf, (int)n));
    pack(l, &r, c, k, 0);
  }
  return MOE_OK;
}
