/* The experts' two schedules (src/sources/ffn.c): experts whose GEMMs run as one tile each run whole, one
 * work item an expert; the others pass by pass. The tests lower moe__fixed_tile_flops so that some or
 * all experts of a small layer take the pass-by-pass schedule, and check a step against the layer's
 * output in double precision (forward) and against the all-whole step (outputs, input gradients and
 * every parameter gradient). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "kernels/gemm.h"
#include "layer_ref.h"
#include "test.h"

enum { SD = 32, SH = 128, SE = 4, ST = 96 };

static void fill(float *a, size_t n, uint64_t s) {
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    a[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
}

typedef struct {
  float y[ST * SD], dx[ST * SD];
  float *grads;
  int counts[SE];
} step_out;

/* One step (top-1, two threads) of a layer with nonzero biases and a router skewed towards expert 0,
 * with the tile limit `flops`; the layer is left initialized for the caller (freed by it). */
static int run_step(moe_layer_t *l, moe_act act, double flops, step_out *o) {
  static float x[ST * SD], dy[ST * SD];
  fill(x, ST * SD, 3);
  fill(dy, ST * SD, 4);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = SD, cfg.H = SH, cfg.E = SE, cfg.top_k = 1, cfg.act = act, cfg.threads = 2;
  if (moe_layer_init(l, &cfg) != MOE_OK) return 0;
  moe_layer_init_params(l, 7);
  const char *biases[] = {"experts.fc1.bias", "experts.fc2.bias"};
  for (int i = 0; i < 2; i++) {
    float *b = moe_layer_param(l, biases[i]);
    fill(b, (size_t)SE * (i ? SD : SH), 11 + i);
  }
  float *gb = moe_layer_param(l, "gate.bias");
  for (int e = 0; e < SE; e++) gb[e] = -0.2f * e; /* experts of different sizes */
  moe_layer_params_changed(l);
  double keep = moe__fixed_tile_flops;
  moe__fixed_tile_flops = flops;
  moe_layer_stats st;
  int ok = moe_layer_forward(l, x, ST, o->y, NULL, &st) == MOE_OK &&
           moe_layer_backward(l, dy, 0.0f, 0.0f, NULL, NULL, o->dx) == MOE_OK;
  moe__fixed_tile_flops = keep;
  memset(o->counts, 0, sizeof o->counts);
  for (int t = 0; t < ST; t++) o->counts[st.experts[t]]++;
  o->grads = l->grads;
  if (!ok) return 0;
  for (int t = 0; t < ST; t++) { /* y against the double-precision FFN of each token's expert */
    double out[SD];
    if (act == MOE_ACT_SWIGLU) break; /* not in the reference */
    ref_expert(l, st.experts[t], x + t * SD, out);
    float ref[SD];
    for (int d = 0; d < SD; d++) ref[d] = (float)(st.weights[t] * out[d]);
    if (!tensors_close("y", o->y + t * SD, ref, SD, 1e-5, 1e-6)) return 0;
  }
  return 1;
}

/* The step with every expert whole, then with the limits that cut the GEMMs of the larger experts
 * (fc1's 128 columns in two; mixed) and of all of them: the same outputs and gradients. */
static int schedules_agree(moe_act act) {
  static step_out whole, cut;
  moe_layer_t a, b;
  int ok = run_step(&a, act, 1073741824.0, &whole);
  if (ok && !(whole.counts[0] >= 40 && whole.counts[SE - 1] >= 1 && whole.counts[SE - 1] <= 12)) {
    fprintf(stderr, "  expert sizes %d %d %d %d: not the mixed case the limits are for\n", whole.counts[0],
            whole.counts[1], whole.counts[2], whole.counts[3]);
    ok = 0;
  }
  /* fc1 (m, 128, 32): m 33 (128 + 1) flops; cut past two limits, i.e. m >= 24 for 50 000 */
  const double limits[] = {50000.0, 1.0};
  for (int i = 0; ok && i < 2; i++) {
    ok = run_step(&b, act, limits[i], &cut);
    fprintf(stderr, "%s", ok ? "" : "  the cut step failed or its y is off the reference\n");
    ok = ok && tensors_close("y", cut.y, whole.y, ST * SD, 1e-5, 1e-6) &&
         tensors_close("dx", cut.dx, whole.dx, ST * SD, 1e-5, 1e-6) &&
         tensors_close("grads", cut.grads, whole.grads, a.numel, 1e-5, 1e-6);
    moe_layer_free(&b);
  }
  moe_layer_free(&a);
  return ok;
}

TEST(experts_whole_and_pass_schedules_agree_relu) { ASSERT(schedules_agree(MOE_ACT_RELU)); }

TEST(experts_whole_and_pass_schedules_agree_swiglu) { ASSERT(schedules_agree(MOE_ACT_SWIGLU)); }

/* Which GEMMs run whole: one tile up to the limit (and below two tiles of 64 along the longer side). */
TEST(gemm_fixed_whole_follows_the_limit) {
  moe__gemm g = {false, true, 64, 3072, 768, 1.0f, 0.0f, NULL, 768, NULL, 768, NULL, 3072, false};
  ASSERT(moe__gemm_fixed_whole(&g)); /* case L's fc1: 0.15 Gflop */
  g.M = 512, g.N = 4096, g.K = 1024; /* case M's: 2.1 Gflop */
  ASSERT(!moe__gemm_fixed_whole(&g));
  g.M = 64, g.N = 127, g.K = 1 << 20; /* any work: 127 columns make one tile of 64 */
  ASSERT(moe__gemm_fixed_whole(&g));
}
