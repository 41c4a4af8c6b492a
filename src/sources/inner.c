/* Hierarchical MoE (DynaMoE): the experts of a layer are themselves MoE layers, each with its own
 * router. The outer layer routes, dispatches and combines as usual; this expert source runs one inner
 * layer per expert on that expert's kept rows (the groups are the dispatch rows: hierarchical layers
 * are not expert-parallel). Micro-batches (micro.c) are cut between outer experts, so each inner layer
 * runs in exactly one of them, on the rows it gets with one: a call runs only its micro-batch's inner
 * layers, whose saved state (routing, activations) the other micro-batches leave alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer/plugins.h"

/* The inner layers run at once, one per thread, each on one thread: on the ~16 rows an inner layer
 * gets, its own GEMMs cannot keep the cores busy, and one after another they left them idle. Each
 * inner layer keeps its own state, so they share nothing; the first failure (in expert order) is
 * raised again on the caller's thread, whose error message is the one callers read. */
typedef struct {
  const moe_layer_t *l;
  int threads;
  const int32_t *kept; /* plan.kept: the groups are the experts (in process), and every micro-batch has
                        * static padding */
  const moe__groups *g;
  int backward;      /* not dout != NULL: an empty batch has no dout */
  const float *dout; /* backward's output gradients */
  float daux, dz;
  float *dxs;
  moe_layer_stats *st;
} inner_job;

static moe_status inner_one(const inner_job *j, int e) {
  moe_layer_t *in = &j->l->inner[e];
  int D = j->l->cfg.D, r0 = j->g->offs[e], n = j->kept[e], pad = j->g->offs[e + 1] - r0 - n;
  size_t at = (size_t)r0 * D;
  int threads = in->cfg.threads;
  in->cfg.threads = 1;
  moe_status s = j->backward ? moe_layer_backward(in, j->dout + at, j->daux, j->dz, NULL, NULL, j->dxs + at)
                         : moe_layer_forward(in, j->g->x + at, n, j->g->y + at, NULL, &j->st[e]);
  in->cfg.threads = threads;
  float *out = j->backward ? j->dxs : j->g->y;
  if (pad) memset(out + (size_t)(r0 + n) * D, 0, (size_t)pad * D * 4); /* static padding */
  return s;
}

/* The micro-batch's inner layers, [e0, e1) of its groups: an expert without rows runs in its own
 * micro-batch too, as with one. */
static moe_status run_inner(const inner_job *j) {
  int first = j->g->e1;
  moe_status bad = MOE_OK;
  char msg[1024] = "";
#pragma omp parallel for num_threads(j->threads) schedule(dynamic, 1)
  for (int e = j->g->e0; e < j->g->e1; e++) {
    moe_status s = inner_one(j, e);
    if (s != MOE_OK)
#pragma omp critical(moe_hier_error)
      if (e < first) {
        first = e;
        bad = s;
        snprintf(msg, sizeof msg, "%s", moe_last_error());
      }
  }
  MOE_TRY(bad == MOE_OK, bad, "%s", msg);
  return MOE_OK;
}

/* The source's state: each inner layer's last forward (they run at once), and their losses' sums. */
typedef struct {
  moe_layer_stats *stats; /* (E) */
  float aux, z;
} inner_self;

static moe_status inner_init(const moe_layer_t *l, void *transport, void **self) {
  (void)transport;
  inner_self *o = calloc(1, sizeof *o);
  MOE_TRY(o, MOE_ERR_NOMEM, "moe_layer_init: out of memory");
  *self = o;
  o->stats = calloc((size_t)l->cfg.E, sizeof *o->stats);
  MOE_TRY(o->stats, MOE_ERR_NOMEM, "moe_layer_init: out of memory for %d inner layers' stats", l->cfg.E);
  return MOE_OK;
}

static void inner_free(void *self) {
  inner_self *o = self;
  if (o) free(o->stats);
  free(o);
}

static moe_status inner_forward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                                const moe__ffn *f, const moe__side_work *side) {
  (void)f, (void)side; /* the inner layers keep their own activations and run their own routers */
  inner_self *o = self;
  moe_layer_stats *st = o->stats;
  MOE_CHECK(run_inner(&(inner_job){env->l, env->threads, p->kept, g, 0, NULL, 0, 0, NULL, st}));
  o->aux = o->z = 0;
  /* in expert order: the same sums as one after another; after the last micro-batch, every inner
   * layer's of this forward */
  for (int e = 0; e < g->n; e++) {
    o->aux += st[e].aux_loss;
    o->z += st[e].z_loss;
  }
  return MOE_OK;
}

static moe_status inner_backward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                                 const moe__ffn *f, const float *dout, float daux, float dz, float *dxs) {
  (void)self, (void)f;
  return run_inner(&(inner_job){env->l, env->threads, p->kept, g, 1, dout, daux, dz, dxs, NULL});
}

static void inner_losses(void *self, float *aux, float *z) {
  const inner_self *o = self;
  *aux += o->aux;
  *z += o->z;
}

/* The inner layers have workspaces of their own. */
static size_t inner_bytes(void *self, const moe__env *env, int ng, int rows) {
  (void)self, (void)env, (void)ng, (void)rows;
  return 0;
}

static moe_status inner_alloc(void *self, const moe__env *env, int ng, int rows, moe__ffn *f) {
  (void)self, (void)env, (void)ng, (void)rows;
  *f = (moe__ffn){0};
  return MOE_OK;
}

const moe__expert_src moe__experts_inner = {"inner",     0,           inner_init,    inner_free,     NULL, inner_bytes,
                                            inner_alloc, inner_forward, inner_backward, inner_losses};
