/* A layer's one dictionary of setups (Tutel P2 1.7, auto_pipe.c): what it searches follows the layer's
 * configuration (parallel_r -1: r; pipeline 0: n, with r too; a2a_auto: Linear or 2DH), and it offers
 * only what the layer can run: 2DH needs a grid of more than one node of more than one rank (on one
 * node or one rank per node it is Linear with copies) and an all-to-all to run (static dispatch's
 * exchanges are a reduce-scatter and an all-gather).
 * The entry's note says what was held back. The layer asks for its setup after routing, when the
 * capacity (global counts: the same on every rank) is known. */
#include <stdio.h>
#include <stdlib.h>

#include <math.h>
#include <string.h>

#include "adapt/layer_setup.h"
#include "dist/dist.h"
#include "shard/shard.h"

/* The policy's state: the dictionary, when anything is adaptive, and the last forward's micro-batches;
 * memory_reuse AUTO's strategy (-1: not yet chosen) and what the steps so far measured: the experts'
 * multiply-adds and seconds in forward, the exchanges' elements and seconds. */
typedef struct {
  moe__auto_pipe *ap;
  int n;
  int reuse_pick;
  double reuse_meas[4];
} setup_self;

enum { SEARCH_R = 1, SEARCH_N = 2, SEARCH_A = 4 };

/* What the dictionary chooses now, and the fixed n its trials run (moe_layer_set_parallel_r and
 * moe_layer_set_pipeline may change them between steps); 0: nothing adaptive. */
static unsigned space_of(const moe_layer_t *l) {
  const moe__shard *sh = moe__shard_of(l);
  unsigned s = (sh && sh->r == MOE_PARALLEL_AUTO ? SEARCH_R : 0) | (!l->cfg.pipeline ? SEARCH_N : 0) |
               (l->cfg.a2a_auto ? SEARCH_A : 0);
  return s ? s | (unsigned)l->cfg.pipeline << 3 : 0;
}

static moe_status make(setup_self *o, const moe_layer_t *l, unsigned space) {
  const moe_dist *d = l->cfg.dist;
  int W = moe_dist_size(d), E = l->cfg.E, deg[MOE__SETUP_MAX_DEG], nd = 0, nodes, na = 1;
  moe_a2a now;
  int G = moe__dist_a2a_grid(d, &nodes, &now);
  moe__a2a algo[2] = {(moe__a2a)now, MOE__A2A_2DH};
  char a_why[128] = "";
  int cuts = moe__shard_of(l) ? E : E / W; /* micro-batches are cut between experts: local ones, or (sharded) all */
  if (!(space & SEARCH_N)) deg[nd++] = l->cfg.pipeline;
  else
    for (int n = 1; n <= MOE__AUTO_MAX_N && (n == 1 || n <= cuts); n *= 2) deg[nd++] = n;
  if (space & SEARCH_A) {
    algo[0] = MOE__A2A_LINEAR;
    int stat = l->cfg.dispatch == MOE_DISPATCH_STATIC; /* its exchanges are a reduce-scatter and an all-gather */
    if (G > 1 && nodes > 1 && !stat) na = 2;
    else
      snprintf(a_why, sizeof a_why, "2DH not offered: %s", !d ? "one process" : stat ? "static dispatch has no all-to-all"
               : !G ? "no grid of nodes (moe_dist_set_a2a 2DH)" : nodes == 1 ? "one node" : "one rank per node");
  }
  moe__auto_pipe *a = malloc(sizeof *a);
  MOE_TRY(a, MOE_ERR_NOMEM, "layer setup: out of memory for the dictionary");
  moe_status st = moe__auto_pipe_init(a, W, E, (space & SEARCH_R) != 0, deg, nd, algo, na);
  if (st) {
    free(a);
    return st;
  }
  a->space = space;
  snprintf(a->note, sizeof a->note, "%s", a_why);
  o->ap = a;
  return MOE_OK;
}

static void drop(setup_self *o) {
  if (!o->ap) return;
  moe__auto_pipe_free(o->ap);
  free(o->ap);
  o->ap = NULL;
}

static moe_status setup_init(const moe_layer_t *l, void **self) {
  (void)l;
  setup_self *o = calloc(1, sizeof *o);
  MOE_TRY(o, MOE_ERR_NOMEM, "moe_layer_init: out of memory");
  o->reuse_pick = -1;
  *self = o;
  return MOE_OK;
}

static void setup_reconfigured(void *self) {
  setup_self *o = self;
  o->reuse_pick = -1;
  memset(o->reuse_meas, 0, sizeof o->reuse_meas);
}

/* memory_reuse AUTO: S4 until a step has measured the experts' and the exchanges' rates; then, once,
 * the strategy Eq. 10 models fastest (ties to the one that saves less) among those whose workspace fits
 * the budget on every rank, else S4. Every rank decides from the same sums. */
static moe_status setup_reuse(void *self, const moe_layer_t *l, const moe__plan *p, const size_t bytes[4],
                              moe_reuse *out) {
  setup_self *o = self;
  *out = o->reuse_pick >= 0 ? (moe_reuse)o->reuse_pick : MOE_REUSE_S4;
  /* undecided ranks all come here at each forward, so the all-reduce pairs up */
  if (o->reuse_pick >= 0 || (!l->cfg.dist && o->reuse_meas[1] <= 0)) return MOE_OK;
  static const moe_reuse order[4] = {MOE_REUSE_NONE, MOE_REUSE_S2, MOE_REUSE_S3, MOE_REUSE_S4};
  double m[8];
  memcpy(m, o->reuse_meas, sizeof o->reuse_meas);
  for (int i = 0; i < 4; i++) m[4 + i] = bytes[i] <= l->cfg.memory_budget;
  if (l->cfg.dist) MOE_CHECK(moe_dist_allreduce(l->cfg.dist, m, 8));
  if (m[0] <= 0 || m[1] <= 0) return MOE_OK; /* no rank has computed a row yet */
  double cost[4], b = p->mb_rows > 0 ? (double)p->mb_rows : 1;
  MOE_CHECK(moe__reuse_costs_cpu(b, l->cfg.D, l->cfg.H, m[0] / m[1], m[3] > 0 ? m[2] / m[3] : INFINITY, cost));
  double best = INFINITY;
  o->reuse_pick = MOE_REUSE_S4;
  for (int i = 0; i < 4; i++)
    if (m[4 + i] == moe_dist_size(l->cfg.dist) && cost[order[i]] < best) best = cost[order[i]], o->reuse_pick = order[i];
  *out = (moe_reuse)o->reuse_pick;
  return MOE_OK;
}

/* memory_reuse AUTO, undecided: this forward's experts (multiply-adds of their rows and the seconds of
 * their GEMMs) and exchanges (elements moved and the seconds waited for them). */
static void setup_measure(void *self, const moe_layer_t *l, double madds, double secs, double elems,
                          double comm_secs) {
  (void)l;
  setup_self *o = self;
  if (o->reuse_pick >= 0) return;
  o->reuse_meas[0] += madds;
  o->reuse_meas[1] += secs;
  o->reuse_meas[2] += elems;
  o->reuse_meas[3] += comm_secs;
}

static void setup_free(void *self) {
  if (self) drop(self);
  free(self);
}

static moe_status setup_begin(void *self, const moe_layer_t *l) {
  setup_self *o = self;
  unsigned space = space_of(l);
  if (o->ap && o->ap->space != space) drop(o); /* another search: another dictionary */
  if (!space) return MOE_OK;
  if (!o->ap) return make(o, l, space);
  if (!o->ap->trial) return MOE_OK;
  double t = o->ap->acc; /* the trial step's seconds, summed over the ranks: every dictionary alike */
  if (l->cfg.dist) MOE_CHECK(moe_dist_allreduce(l->cfg.dist, &t, 1));
  return moe__auto_pipe_record(o->ap, t / moe_dist_size(l->cfg.dist));
}

static moe_status setup_a2a(void *self, const moe_layer_t *l) {
  const moe__auto_pipe *a = ((setup_self *)self)->ap;
  return a && a->space & SEARCH_A ? moe__dist_a2a_use(l->cfg.dist, (moe_a2a)a->now.a) : MOE_OK;
}

static moe_status setup_pick(void *self, const moe_layer_t *l, const moe__plan *p, int *n, int *r) {
  setup_self *o = self;
  moe__auto_pipe *a = o->ap;
  *r = -1;
  if (!a) return MOE_OK;
  moe__setup s;
  MOE_CHECK(moe__auto_pipe_pick(a, (size_t)p->C, &s));
  if (!l->cfg.pipeline) *n = s.d;
  *r = a->now.r;
  o->n = *n;
  return setup_a2a(self, l);
}

static void setup_time(void *self, double t0) {
  moe__auto_pipe *a = ((setup_self *)self)->ap;
  if (a && a->trial) a->acc += moe__now() - t0;
}

static int setup_trial(const void *self) {
  const moe__auto_pipe *a = ((const setup_self *)self)->ap;
  return a && a->trial;
}

const moe__policy moe__policy_setup = {setup_init,    setup_free,         setup_begin, setup_pick,
                                       setup_reuse,   setup_measure,      setup_reconfigured,
                                       setup_a2a,     setup_time,         setup_trial, MOE__AUTO_MAX_N};

int moe__layer_setup_trial(const moe_layer_t *l) {
  const setup_self *o = moe__layer_policy(l);
  return o && setup_trial(o);
}

int moe_layer_setup(const moe_layer_t *l, moe_layer_setup_info *out) {
  *out = (moe_layer_setup_info){.note = ""};
  const setup_self *o = l ? moe__layer_policy(l) : NULL;
  const moe__auto_pipe *a = o ? o->ap : NULL;
  if (!a) return 0;
  int nodes;
  moe_a2a now;
  moe__dist_a2a_grid(l->cfg.dist, &nodes, &now);
  *out = (moe_layer_setup_info){.capacity = (int)a->capacity, .key = (int)a->key, .window = (int)a->dict.window,
                                .r = moe_layer_parallel_r(l), .n = o->n, .a2a = now, .trial = a->trial,
                                .searched = (int)(a->space & 7), .trials = a->measured, .entries = (int)a->dict.map.len,
                                .bound = moe__setup_dict_bound(&a->dict), .note = a->note};
  return 1;
}

void moe_layer_setup_format(const moe_layer_setup_info *i, char *buf, size_t size) {
  char r[16] = "off";
  if (i->r >= 0) snprintf(r, sizeof r, "%d", i->r);
  snprintf(buf, size, "%s at capacity %d (key %d = floor(C / %d)): r %s%s, n %d%s, %s%s; %lld trials, %d entries "
           "(bound %.1f a key)%s%s", i->trial ? "trial" : "entry", i->capacity, i->key, i->window, r,
           i->searched & SEARCH_R ? "" : " (fixed)", i->n, i->searched & SEARCH_N ? "" : " (fixed)",
           i->a2a == MOE_A2A_2DH ? "2DH" : "Linear", i->searched & SEARCH_A ? "" : " (fixed)", i->trials, i->entries,
           i->bound, *i->note ? "; " : "", i->note);
}
