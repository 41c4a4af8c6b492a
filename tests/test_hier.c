/* Hierarchical MoE runs its inner layers at once, one per thread (sources/inner.c): outputs, input gradients,
 * losses and every inner layer's gradients are those of the same layer run on one thread, with
 * experts of many, few and no rows. And with micro-batches (cut between outer experts, so that each
 * inner layer runs in exactly one), under every memory-reuse strategy, they are those of one. */
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "layer/plugins.h" /* the plan, for the inner layers' rows */
#include "test.h"

enum { HD = 8, HH = 16, HE = 4, HT = 41 };

typedef struct {
  int threads, top_k, inner_top_k, n;
  moe_reuse reuse;
  moe_dispatch dispatch;
} hier_cfg;

typedef struct {
  float y[HT * HD], dx[HT * HD];
  float *grads, *inner[HE]; /* the outer layer's (its router's), each inner layer's */
  size_t numel, inner_numel;
  float aux, z;
  int empty;     /* expert 0 got no rows */
  int pipeline;  /* micro-batches run */
  int own_rows;  /* every inner layer routed the rows its expert kept (none left to another's micro-batch) */
} hier_run;

static float frand(uint64_t *s) { /* in [0, 1) */
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) * 0x1.0p-24);
}

static int run_hier(const hier_cfg *h, const float *x, const float *dy, int T, hier_run *out) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = HD, c.H = HH, c.E = HE, c.top_k = h->top_k, c.inner_experts = 3, c.inner_top_k = h->inner_top_k;
  c.threads = h->threads, c.pipeline = h->n, c.memory_reuse = h->reuse, c.dispatch = h->dispatch;
  c.capacity_setting = 0.8f; /* static: padded slots, some dropped */
  moe_layer_t l;
  if (moe_layer_init(&l, &c) != MOE_OK) return fprintf(stderr, "  init: %s\n", moe_last_error()), 0;
  moe_layer_init_params(&l, 11);
  /* expert 0's gate row far below the others for positive inputs: it gets no rows */
  const moe_param_info *g = moe_layer_param_find(&l, "gate.weight");
  for (int i = 0; i < c.D; i++) l.params[g->offset + i] = -10.0f;
  moe_layer_stats st;
  int ok = moe_layer_forward(&l, x, T, out->y, NULL, &st) == MOE_OK;
  out->aux = st.aux_loss, out->z = st.z_loss;
  out->empty = st.expert_counts ? st.expert_counts[0] == 0 : -1;
  out->pipeline = st.pipeline;
  out->own_rows = 1;
  for (int e = 0; ok && e < c.E; e++) out->own_rows &= moe__layer_inspect(&l.inner[e]).plan->T == moe__layer_inspect(&l).plan->kept[e];
  ok = ok && moe_layer_backward(&l, dy, 0.5f, 0.25f, NULL, NULL, out->dx) == MOE_OK;
  if (!ok) fprintf(stderr, "  n=%d %s: %s\n", h->n, moe_reuse_name(h->reuse), moe_last_error());
  out->numel = l.numel, out->inner_numel = l.inner[0].numel;
  out->grads = malloc(l.numel * 4);
  memcpy(out->grads, l.grads, l.numel * 4);
  for (int e = 0; e < c.E; e++) {
    out->inner[e] = malloc(l.inner[e].numel * 4);
    memcpy(out->inner[e], l.inner[e].grads, l.inner[e].numel * 4);
  }
  moe_layer_free(&l);
  return ok;
}

static void hier_run_free(hier_run *r) {
  free(r->grads);
  for (int e = 0; e < HE; e++) free(r->inner[e]);
}

static void inputs(float *x, float *dy) {
  uint64_t s = 5;
  for (int i = 0; i < HT * HD; i++) x[i] = frand(&s), dy[i] = frand(&s) - 0.5f;
}

/* Whether every inner layer's gradients agree within rtol (0: the same values); says which does not. */
static int inner_close(const hier_run *o, const hier_run *ref, double rtol, const char *what) {
  for (int e = 0; e < HE; e++)
    if (!tensors_close("inner grads", o->inner[e], ref->inner[e], ref->inner_numel, rtol, rtol / 10)) {
      fprintf(stderr, "  %s: inner layer %d\n", what, e);
      return 0;
    }
  return 1;
}

TEST(hier_inner_layers_at_once_match_one_thread) {
  static float x[HT * HD], dy[HT * HD];
  inputs(x, dy);
  static hier_run one, many;
  ASSERT(run_hier(&(hier_cfg){1, 1, 2, 1, MOE_REUSE_NONE, MOE_DISPATCH_DYNAMIC}, x, dy, HT, &one));
  ASSERT(run_hier(&(hier_cfg){3, 1, 2, 1, MOE_REUSE_NONE, MOE_DISPATCH_DYNAMIC}, x, dy, HT, &many));
  ASSERT(one.empty == 1 && many.empty == 1);
  ASSERT(tensors_close("y", many.y, one.y, HT * HD, 1e-6, 1e-7));
  ASSERT(tensors_close("dx", many.dx, one.dx, HT * HD, 1e-6, 1e-7));
  ASSERT_NEAR(many.aux, one.aux, 1e-6);
  ASSERT(inner_close(&many, &one, 1e-6, "3 threads"));
  hier_run_free(&one), hier_run_free(&many);
}

/* n micro-batches of a hierarchical layer, for each strategy: y, the losses, dx, the outer router's
 * gradients and every inner layer's gradients are those of n = 1 (each inner layer runs once, on its
 * expert's rows, in its own micro-batch; S3 and S4 run its forward again before its backward), with an outer expert of no rows,
 * dynamic and static dispatch (padding, drops), inner top-1 and top-2, and an empty batch. */
TEST(hier_pipeline_matches_one_micro_batch) {
  static float x[HT * HD], dy[HT * HD];
  inputs(x, dy);
  const struct { int top_k, inner_top_k, T; moe_dispatch dispatch; } cases[] = {
      {1, 2, HT, MOE_DISPATCH_DYNAMIC}, {2, 1, HT, MOE_DISPATCH_DYNAMIC}, {2, 2, HT, MOE_DISPATCH_STATIC},
      {1, 1, 29, MOE_DISPATCH_STATIC},  {2, 1, 0, MOE_DISPATCH_DYNAMIC},
  };
  const int ns[] = {2, 3, 4, 8};
  const moe_reuse reuses[] = {MOE_REUSE_NONE, MOE_REUSE_S2, MOE_REUSE_S3, MOE_REUSE_S4};
  int ok = 1;
  for (size_t c = 0; ok && c < sizeof cases / sizeof cases[0]; c++) {
    static hier_run ref, o;
    hier_cfg h = {2, cases[c].top_k, cases[c].inner_top_k, 1, MOE_REUSE_NONE, cases[c].dispatch};
    int T = cases[c].T;
    ok = run_hier(&h, x, dy, T, &ref) && ref.own_rows;
    for (size_t i = 0; ok && i < sizeof ns / sizeof ns[0]; i++)
      for (size_t r = 0; ok && r < sizeof reuses / sizeof reuses[0]; r++) {
        char what[96];
        h.n = ns[i], h.reuse = reuses[r];
        snprintf(what, sizeof what, "case %zu (T=%d, k=%d, inner k=%d) n=%d %s", c, T, h.top_k, h.inner_top_k, h.n,
                 moe_reuse_name(h.reuse));
        ok = run_hier(&h, x, dy, T, &o);
        if (ok && (o.pipeline != h.n || !o.own_rows))
          ok = 0, fprintf(stderr, "  %s: ran %d micro-batches, inner rows %s\n", what, o.pipeline,
                          o.own_rows ? "right" : "wrong");
        if (ok && (memcmp(o.y, ref.y, sizeof o.y) || memcmp(o.dx, ref.dx, sizeof o.dx) || o.aux != ref.aux ||
                   o.z != ref.z || memcmp(o.grads, ref.grads, ref.numel * 4)))
          ok = 0, fprintf(stderr, "  %s: y, dx, the losses (%.9g, %.9g vs %.9g, %.9g) or the router's gradients "
                                  "differ from n = 1\n", what, o.aux, o.z, ref.aux, ref.z);
        ok = ok && inner_close(&o, &ref, 0, what);
        hier_run_free(&o);
      }
    ASSERT(T == 0 || ref.empty == 1);
    hier_run_free(&ref);
  }
  ASSERT(ok);
}
