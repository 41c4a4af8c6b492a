/* Micro-batch pipelining under expert parallelism (MPipeMoE), both dispatches and the sharded layout
 * (Tutel's r): on 1 rank (a moe_dist of size 1, no mpirun needed), and under mpirun -np 2 and 4 (the
 * test runs itself as the ranks), every n in {1, 2, 3, 4, 8} and every memory strategy gives, on each
 * rank, the outputs, losses, input gradients and non-expert weight gradients of n = 1 without reuse on
 * the same ranks (and r) bit for bit, and the expert weight gradients within 1e-6 relative; k = 1 and 2,
 * uneven token slices and a rank without tokens; sharded, E below and above W and every r.
 * Skipped without mpirun (the one-rank case still runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare.h"
#include "run_cli.h"
#include "test.h"

enum { D = 12, H = 20, T = 37 };

typedef struct {
  float y[T * D], dx[T * D];
  float *grads;
  float aux, z;
  int dropped;
} run_out;

static void fill(float *a, size_t n, uint64_t s) {
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    a[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
}

/* One forward and backward of this rank's tokens [t0, t0 + n) with `pipe` micro-batches under r. */
static int run(moe_layer_config c, int pipe, moe_reuse r, const float *x, const float *dy, int t0, int n,
               run_out *o) {
  c.pipeline = pipe, c.memory_reuse = r;
  moe_layer_t l;
  if (moe_layer_init(&l, &c) != MOE_OK) {
    fprintf(stderr, "  init: %s\n", moe_last_error());
    return 0;
  }
  moe_layer_init_params(&l, 17);
  float *g = moe_layer_param(&l, "gate.weight");
  for (int i = 0; i < c.E * D; i++) g[i] *= 3.0f; /* uneven routing */
  moe_layer_params_changed(&l);
  moe_layer_stats st;
  int ok = moe_layer_forward(&l, x + (size_t)t0 * D, n, o->y, NULL, &st) == MOE_OK &&
           moe_layer_backward(&l, dy + (size_t)t0 * D, 0.3f, 0.05f, NULL, NULL, o->dx) == MOE_OK &&
           moe_layer_reduce_grads(&l) == MOE_OK;
  if (!ok) fprintf(stderr, "  n=%d %s: %s\n", pipe, moe_reuse_name(r), moe_last_error());
  o->aux = st.aux_loss, o->z = st.z_loss, o->dropped = st.dropped;
  o->grads = malloc(l.numel * 4);
  memcpy(o->grads, l.grads, l.numel * 4);
  moe_layer_free(&l);
  return ok;
}

/* Whether o is ref as promised (n rows of y and dx); prints what differs. */
static int same_as(const moe_layer_config *c, const run_out *o, const run_out *ref, int n, const char *what) {
  moe_layer_t shape;
  if (moe_layer_init(&shape, c) != MOE_OK) return 0;
  int ok = !memcmp(o->y, ref->y, (size_t)n * D * 4) && !memcmp(o->dx, ref->dx, (size_t)n * D * 4) &&
           o->aux == ref->aux && o->z == ref->z && o->dropped == ref->dropped;
  if (!ok) fprintf(stderr, "  %s: y, dx, the losses or the drops differ from n = 1\n", what);
  for (int i = 0; ok && i < shape.nparams; i++) {
    const moe_param_info *p = &shape.info[i];
    const float *a = o->grads + p->offset, *b = ref->grads + p->offset;
    if (!strncmp(p->name, "experts.", 8) && p->ndim == 3) ok = tensors_close(p->name, a, b, p->numel, 1e-6, 1e-9);
    else if (memcmp(a, b, p->numel * 4)) ok = 0, fprintf(stderr, "  %s: grad %s differs\n", what, p->name);
  }
  moe_layer_free(&shape);
  return ok;
}

/* Every n and strategy against n = 1 without reuse, for layer c on this rank's tokens [t0, t0 + n). */
static void against_one(const moe_layer_config *c, const char *name, const float *x, const float *dy, int t0, int n,
                        int *failed_) {
  static run_out ref, o;
  const int ns[] = {1, 2, 3, 4, 8};
  ASSERT(run(*c, 1, MOE_REUSE_NONE, x, dy, t0, n, &ref));
  int ok = 1;
  for (size_t i = 0; ok && i < sizeof ns / sizeof ns[0]; i++)
    for (int r = MOE_REUSE_NONE; ok && r <= MOE_REUSE_S4; r++) {
      char what[192];
      snprintf(what, sizeof what, "W=%d rank %d tokens [%d, %d) %s k=%d n=%d %s", moe_dist_size(c->dist),
               moe_dist_rank(c->dist), t0, t0 + n, name, c->top_k, ns[i], moe_reuse_name((moe_reuse)r));
      ok = run(*c, ns[i], (moe_reuse)r, x, dy, t0, n, &o) && same_as(c, &o, &ref, n, what);
      free(o.grads);
    }
  free(ref.grads);
  ASSERT(ok);
}

/* Every case on this rank over the token cuts cut (W + 1 entries). */
static void cases(moe_dist *d, const int *cut, int *failed_) {
  static float x[T * D], dy[T * D];
  fill(x, T * D, 5);
  fill(dy, T * D, 7);
  int q = moe_dist_rank(d), t0 = cut[q], n = cut[q + 1] - cut[q];
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = D, c.H = H, c.threads = 1, c.capacity_setting = 1.0f, c.dist = d;
  for (int disp = 0; disp < 2 && !*failed_; disp++)
    for (int k = 1; k <= 2 && !*failed_; k++) {
      c.E = 8, c.top_k = k, c.act = k == 1 ? MOE_ACT_GELU : MOE_ACT_SWIGLU;
      c.dispatch = disp ? MOE_DISPATCH_STATIC : MOE_DISPATCH_DYNAMIC;
      against_one(&c, disp ? "static" : "dynamic", x, dy, t0, n, failed_);
    }
  c.dispatch = MOE_DISPATCH_DYNAMIC;
  for (int E = 3; E <= 5 && !*failed_; E += 2) /* E below W = 4 (not dividing it), above both */
    for (int r = 0; r <= (moe_dist_size(d) + E - 1) / E && !*failed_; r++) {
      char name[48];
      snprintf(name, sizeof name, "sharded E=%d r=%d", E, r);
      c.E = E, c.top_k = 2, c.act = r % 2 ? MOE_ACT_GELU : MOE_ACT_SWIGLU, c.parallel_r = r;
      against_one(&c, name, x, dy, t0, n, failed_);
    }
}

/* On each rank: uneven token slices, then slices with a rank (or two) without tokens. */
static void child(int *failed_) {
  moe_dist *d = NULL;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  int W = moe_dist_size(d);
  int cut[2][5] = {{0, 5, 37}, {0, 0, 37}};
  if (W == 4) memcpy(cut, (int[2][5]){{0, 3, 10, 30, 37}, {0, 0, 11, 11, 37}}, sizeof cut);
  if (W == 1) memcpy(cut, (int[2][5]){{0, 37}, {0, 0}}, sizeof cut);
  for (int c = 0; c < 2 && !*failed_; c++) cases(d, cut[c], failed_);
  moe_dist_finalize(d);
}

TEST(pipeline_ep_bits_match_one_micro_batch) {
  if (getenv("OMPI_COMM_WORLD_SIZE")) { /* a rank */
    child(failed_);
    return;
  }
  child(failed_); /* one rank, no mpirun */
  if (*failed_ || !test_have_mpirun()) return;
  for (int W = 2; W <= 4; W += 2) {
    char cmd[1024], out[16384];
    int rc = test_mpirun_self(W, "pipeline_ep_bits_match_one_micro_batch", 300, cmd, sizeof cmd, out, sizeof out);
    if (rc) FAIL_("W=%d: %s: status %d, output:\n%s", W, cmd, rc, out);
  }
}
