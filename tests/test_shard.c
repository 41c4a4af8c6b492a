/* Tutel's adaptive parallelism r (src/shard/shard.c, src/shard/transport.c): under mpirun -np W (W = 2, 4;
 * the test runs itself as the ranks), a sharded layer gives, for every r from 0 to ceil(W/E) + 1
 * (clipped) and steps of the adaptive r (trials included), the outputs, losses, input gradients and
 * weight gradients of one process within 1e-5, for E below, at and above W (W > E included, E not
 * dividing W), with uneven token slices and a rank without tokens. One sharded layer runs every r in turn (moe_layer_set_parallel_r): switching moves
 * no weights. Skipped without mpirun. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare.h"
#include "run_cli.h"
#include "test.h"

enum { D = 12, H = 22, T = 37 };

/* Deterministic values in [-1, 1). */
static void fill(float *a, size_t n, uint64_t s) {
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    a[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
}

/* The one-process layer of a case, its parameters drawn from seed (a sharper router: uneven routing). */
static moe_status whole_layer(moe_layer_t *l, int E, moe_act act, const moe_dist *d, int r) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = D, c.H = H, c.E = E, c.top_k = E > 1 ? 2 : 1, c.act = act, c.threads = 1, c.capacity_setting = 0.9f;
  c.dist = d, c.parallel_r = d ? r : MOE_PARALLEL_OFF;
  moe_status st = moe_layer_init(l, &c);
  if (st != MOE_OK) return st;
  moe_layer_init_params(l, 17);
  float *g = moe_layer_param(l, "gate.weight");
  for (int i = 0; i < E * D; i++) g[i] *= 3.0f;
  return MOE_OK;
}

/* One case on this rank: the reference on all T tokens, then every r on this rank's tokens [t0, t1). */
static void one_case(const moe_dist *d, int E, moe_act act, const int *cut, int *failed_) {
  int W = moe_dist_size(d), q = moe_dist_rank(d), root = q == 0, t0 = cut[q], n = cut[q + 1] - cut[q];
  static float x[T * D], dy[T * D], y[T * D], dx[T * D], ys[T * D], dxs[T * D];
  fill(x, T * D, 5);
  fill(dy, T * D, 7);
  moe_layer_t ref, sh, got;
  ASSERT_OK(whole_layer(&ref, E, act, NULL, 0));
  moe_layer_stats rs, ss;
  ASSERT_OK(moe_layer_forward(&ref, x, T, y, NULL, &rs));
  ASSERT_OK(moe_layer_backward(&ref, dy, 0.3f, 0.05f, NULL, NULL, dx));
  ASSERT_OK(whole_layer(&sh, E, act, d, 0));
  ASSERT_OK(whole_layer(&got, E, act, NULL, 0)); /* the gathered parameters and gradients */
  ASSERT_OK(moe_layer_shard_gather(&sh, 0, &got)); /* the sharded init draws the same model */
  if (root) ASSERT(tensors_close("params", got.params, ref.params, ref.numel, 0, 0));
  int m = (W + E - 1) / E;
  for (int it = 0; it <= m + 1 + 8; it++) { /* every r, clipped past m, then steps of the adaptive r */
    int r = it <= m + 1 ? it : MOE_PARALLEL_AUTO;
    ASSERT_OK(moe_layer_set_parallel_r(&sh, r));
    moe_layer_zero_grad(&sh);
    ASSERT_OK(moe_layer_forward(&sh, x + (size_t)t0 * D, n, ys, NULL, &ss));
    int ran = moe_layer_parallel_r(&sh);
    if (r == MOE_PARALLEL_AUTO) ASSERT(ran >= 0 && ran <= m);
    else ASSERT_EQ_INT(ran, r > m ? m : r);
    ASSERT_OK(moe_layer_backward(&sh, dy + (size_t)t0 * D, 0.3f, 0.05f, NULL, NULL, dxs));
    ASSERT_OK(moe_layer_reduce_grads(&sh));
    ASSERT_OK(moe_layer_shard_gather(&sh, 1, &got));
    char what[96];
    snprintf(what, sizeof what, "W=%d E=%d act=%d r=%d (ran %d) rank %d tokens [%d, %d)", W, E, act, r, ran, q, t0,
             t0 + n);
    int ok = tensors_close("y", ys, y + (size_t)t0 * D, (size_t)n * D, 1e-5, 1e-7) &&
             tensors_close("dx", dxs, dx + (size_t)t0 * D, (size_t)n * D, 1e-5, 1e-7) &&
             fabsf(ss.aux_loss - rs.aux_loss) <= 1e-5f * fabsf(rs.aux_loss) &&
             fabsf(ss.z_loss - rs.z_loss) <= 1e-5f * fabsf(rs.z_loss) && ss.dropped == rs.dropped;
    for (int i = 0; ok && root && i < ref.nparams; i++)
      ok = tensors_close(ref.info[i].name, got.grads + got.info[i].offset, ref.grads + ref.info[i].offset,
                         ref.info[i].numel, 1e-5, 1e-7);
    if (!ok) FAIL_("%s: differs from one process (aux %g vs %g, dropped %d vs %d)", what, ss.aux_loss, rs.aux_loss,
                   ss.dropped, rs.dropped);
  }
  moe_layer_free(&got);
  moe_layer_free(&sh);
  moe_layer_free(&ref);
}

/* On each rank: E below, at and above W; uneven token slices, then rank 0 without tokens. */
static void child(int *failed_) {
  moe_dist *d = NULL;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  int W = moe_dist_size(d);
  int cut[2][5] = {{0, 5, 37}, {0, 0, 37}};
  if (W == 4) memcpy(cut, (int[2][5]){{0, 3, 10, 30, 37}, {0, 0, 11, 12, 37}}, sizeof cut);
  const int Es[] = {1, 2, 3, 8};
  for (int i = 0; i < 4; i++)
    for (int c = 0; c < 2; c++) one_case(d, Es[i], c ? MOE_ACT_SWIGLU : MOE_ACT_GELU, cut[c], failed_);
  moe_dist_finalize(d);
}

TEST(shard_every_r_matches_one_process) {
  if (getenv("OMPI_COMM_WORLD_SIZE")) { /* a rank */
    child(failed_);
    return;
  }
  if (!test_have_mpirun()) return;
  for (int W = 2; W <= 4; W += 2) {
    char cmd[1024], out[16384];
    int rc = test_mpirun_self(W, "shard_every_r_matches_one_process", 120, cmd, sizeof cmd, out, sizeof out);
    if (rc) FAIL_("W=%d: %s: status %d, output:\n%s", W, cmd, rc, out);
  }
}

/* One rank (no mpirun needed): a sharded layer over a moe_dist of size 1 is the plain layer, every r;
 * what the sharded layout does not support is refused at init with a message. */
TEST(shard_one_rank_and_refusals) {
  moe_dist *d;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  if (moe_dist_size(d) == 1) {
    int cut[2] = {0, T};
    one_case(d, 3, MOE_ACT_SILU, cut, failed_);
  }
  moe_layer_config c;
  moe_layer_config_default(&c);
  ASSERT_EQ_INT(c.parallel_r, MOE_PARALLEL_OFF);
  c.D = 4, c.H = 4, c.E = 3, c.dist = d, c.parallel_r = 1;
  moe_layer_t l;
  c.dispatch = MOE_DISPATCH_STATIC;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "dynamic dispatch"));
  c.dispatch = MOE_DISPATCH_DYNAMIC, c.parallel_r = -3;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "parallel_r"));
  c.parallel_r = MOE_PARALLEL_OFF, c.E = 4;
  ASSERT_OK(moe_layer_init(&l, &c));
  ASSERT_STATUS(moe_layer_set_parallel_r(&l, 0), MOE_ERR_ARG); /* whole experts: not sharded */
  ASSERT(strstr(moe_last_error(), "not sharded"));
  moe_layer_free(&l);
  moe_dist_finalize(d);
  char err[512];
  ASSERT(run_moe(NULL, "layer-run --weights w --input x --out o --parallel-r two", NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "--parallel-r: 'two'"));
}

/* `moe layer-run --expert-parallel --parallel-r` on 3 ranks (E = 4: neither divides the other) writes the
 * PyTorch reference of a fixture: the whole tensors go to the shards and the gradients come back whole. */
TEST(shard_layer_run_matches_reference) {
  if (!test_have_mpirun()) return;
  char f[512], out[512], args[2048], err[1024];
  snprintf(f, sizeof f, "%s/gelu_k2_cap1_index_dynamic", test_fixture_dir());
  test_tmp_path("shard_lr.safetensors", out, sizeof out);
  snprintf(args, sizeof args, "layer-run --weights '%s/w.safetensors' --input '%s/x.safetensors' --out '%s' "
           "--backward --spec --expert-parallel --parallel-r 2 --threads 1", f, f, out);
  if (run_moe(TEST_MPIRUN "-np 3", args, NULL, err, sizeof err)) FAIL_("mpirun -np 3 moe %s: %s", args, err);
  snprintf(args, sizeof args, "compare '%s' '%s/ref.safetensors'", out, f);
  if (run_moe(NULL, args, NULL, err, sizeof err)) FAIL_("3 ranks, r = 2: differs from the reference: %s", err);
}
