/* Micro-batch pipelining of the experts' stage (MPipeMoE): for n micro-batches and either memory
 * strategy (none, S4: one shared activation buffer, recomputed in backward), the outputs, losses,
 * input gradients, router gradients and expert bias gradients are the bits of n = 1; the expert weight
 * gradients, summed micro-batch by micro-batch, agree within 1e-6 relative. Over activations, k,
 * router kinds, dtypes, uneven splits, more micro-batches than rows, and an empty batch. And the
 * activation workspace that S4 keeps is one micro-batch's, as MPipeMoE's memory model says. */
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "adapt/pipe_model.h"
#include "layer/plugins.h" /* the plan's micro-batches, for the workspace check */
#include "run_cli.h"
#include "synth.h"
#include "test.h"

enum { D = 12, H = 20, E = 5, TMAX = 97 };

typedef struct {
  float y[TMAX * D], spec[TMAX * 3 * D], dx[TMAX * D];
  float *grads;
  float aux, z;
} run_out;

static void fill(float *a, int n, uint64_t s) {
  for (int i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    a[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
}

/* A layer made from c with the parameters every run here starts from. */
static int init_layer(moe_layer_t *l, const moe_layer_config *c) {
  if (moe_layer_init(l, c) != MOE_OK) return 0;
  moe_layer_init_params(l, 7);
  float *b = moe_layer_param(l, "experts.fc1.bias");
  for (int i = 0; b && i < E * H; i++) b[i] = 0.01f * (float)(i % 7); /* biases that matter */
  moe_layer_params_changed(l);
  return 1;
}

/* One forward (with spec) and backward of a layer made from c with n micro-batches and strategy r. */
static int run(const moe_layer_config *c, int n, moe_reuse r, const float *x, const float *dy, int T, run_out *o) {
  moe_layer_config cc = *c;
  cc.pipeline = n;
  cc.memory_reuse = r;
  moe_layer_t l;
  if (!init_layer(&l, &cc)) return 0;
  moe_layer_stats st;
  int ok = moe_layer_forward(&l, x, T, o->y, o->spec, &st) == MOE_OK;
  o->aux = st.aux_loss;
  o->z = st.z_loss;
  ok = ok && moe_layer_backward(&l, dy, 0.3f, 0.05f, o->spec, NULL, o->dx) == MOE_OK;
  if (!ok) fprintf(stderr, "  n=%d %s: %s\n", n, moe_reuse_name(r), moe_last_error());
  o->grads = malloc(l.numel * 4);
  memcpy(o->grads, l.grads, l.numel * 4);
  moe_layer_free(&l);
  return ok;
}

/* Whether o equals the reference ref as promised; prints the case and what differs otherwise. */
static int same_as(const moe_layer_t *shape, const run_out *o, const run_out *ref, int T, const char *what) {
  int ok = !memcmp(o->y, ref->y, (size_t)T * D * 4) && !memcmp(o->dx, ref->dx, (size_t)T * D * 4) &&
           !memcmp(o->spec, ref->spec, (size_t)T * shape->cfg.top_k * D * 4) && o->aux == ref->aux && o->z == ref->z;
  if (!ok) fprintf(stderr, "  %s: y, spec, dx or the losses differ from n = 1\n", what);
  for (int i = 0; ok && i < shape->nparams; i++) {
    const moe_param_info *p = &shape->info[i];
    const float *a = o->grads + p->offset, *b = ref->grads + p->offset;
    if (p->ndim == 3) ok = tensors_close(p->name, a, b, p->numel, 1e-6, 1e-9); /* summed per micro-batch */
    else if (memcmp(a, b, p->numel * 4)) ok = 0, fprintf(stderr, "  %s: grad %s differs\n", what, p->name);
  }
  return ok;
}

TEST(pipeline_bits_match_one_micro_batch) {
  static float x[TMAX * D], dy[TMAX * D];
  fill(x, TMAX * D, 3);
  fill(dy, TMAX * D, 11);
  const struct { moe_act act; int k; moe_router router; moe_dtype dt; int T; moe_dispatch disp; } cases[] = {
      {MOE_ACT_RELU, 1, MOE_ROUTER_LINEAR, MOE_DT_F32, 97, MOE_DISPATCH_DYNAMIC},
      {MOE_ACT_GELU, 2, MOE_ROUTER_LINEAR, MOE_DT_F32, 61, MOE_DISPATCH_DYNAMIC},
      {MOE_ACT_SWIGLU, 2, MOE_ROUTER_COSINE, MOE_DT_F32, 97, MOE_DISPATCH_DYNAMIC},
      {MOE_ACT_SWIGLU, 2, MOE_ROUTER_LINEAR, MOE_DT_BF16, 40, MOE_DISPATCH_DYNAMIC},
      {MOE_ACT_RELU, 2, MOE_ROUTER_LINEAR, MOE_DT_F32, 3, MOE_DISPATCH_DYNAMIC},
      {MOE_ACT_GELU, 1, MOE_ROUTER_LINEAR, MOE_DT_F32, 0, MOE_DISPATCH_DYNAMIC},
      {MOE_ACT_GELU, 2, MOE_ROUTER_LINEAR, MOE_DT_F32, 97, MOE_DISPATCH_STATIC}, /* padded slots, some dropped */
      {MOE_ACT_SWIGLU, 1, MOE_ROUTER_LINEAR, MOE_DT_F32, 61, MOE_DISPATCH_STATIC},
      {MOE_ACT_SWIGLU_OAI, 2, MOE_ROUTER_LINEAR, MOE_DT_F32, 97, MOE_DISPATCH_DYNAMIC}, /* gpt-oss's, fc3.bias */
      {MOE_ACT_SWIGLU_OAI, 2, MOE_ROUTER_LINEAR, MOE_DT_BF16, 61, MOE_DISPATCH_STATIC},
  };
  const int ns[] = {2, 3, 4, 8, 64};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    moe_layer_config cfg;
    moe_layer_config_default(&cfg);
    cfg.D = D, cfg.H = H, cfg.E = E, cfg.top_k = cases[c].k, cfg.act = cases[c].act;
    cfg.router = cases[c].router, cfg.proj_dim = 8, cfg.dtype = cases[c].dt, cfg.threads = 2;
    cfg.dispatch = cases[c].disp;
    cfg.swiglu_limit = 0.25f; /* swiglu_oai: values clamp */
    moe_layer_t shape;
    ASSERT_OK(moe_layer_init(&shape, &cfg));
    static run_out ref, o;
    int T = cases[c].T, ok = run(&cfg, 1, MOE_REUSE_NONE, x, dy, T, &ref);
    for (size_t i = 0; ok && i < sizeof ns / sizeof ns[0]; i++)
      for (int r = MOE_REUSE_NONE; ok && r <= MOE_REUSE_S3; r++) {
        char what[96];
        snprintf(what, sizeof what, "case %zu (T=%d, k=%d) n=%d %s", c, T, cfg.top_k, ns[i], moe_reuse_name(r));
        ok = run(&cfg, ns[i], (moe_reuse)r, x, dy, T, &o) && same_as(&shape, &o, &ref, T, what);
        free(o.grads);
      }
    free(ref.grads);
    moe_layer_free(&shape);
    ASSERT(ok);
  }
}

/* Micro-batches are cut between experts, near rows / n each; S4 keeps the activations of the largest
 * micro-batch, none keeps all. */
TEST(pipeline_s4_keeps_one_micro_batch) {
  static float x[TMAX * D], y[TMAX * D];
  fill(x, TMAX * D, 5);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E, cfg.top_k = 2, cfg.act = MOE_ACT_SWIGLU, cfg.threads = 1;
  size_t peak[2];
  int mb_rows = 0;
  for (int r = MOE_REUSE_NONE; r <= MOE_REUSE_S4; r++) {
    cfg.pipeline = 4;
    cfg.memory_reuse = (moe_reuse)r;
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &cfg));
    moe_layer_init_params(&l, 9);
    ASSERT_OK(moe_layer_forward(&l, x, TMAX, y, NULL, NULL));
    const moe__plan *p = moe__layer_inspect(&l).plan;
    ASSERT_EQ_INT(p->n, 4);
    ASSERT_EQ_INT(p->grows, TMAX * 2);
    int rows = 0, largest = 0;
    for (int i = 0; i < p->n; i++) {
      const moe__micro *m = &p->mb[i];
      ASSERT_EQ_INT(m->lo, rows);
      ASSERT_EQ_INT(m->goffs[E], m->rows);
      int at_boundary = 0; /* it starts where an expert starts */
      for (int e = 0; e <= E; e++) at_boundary |= p->goffs[e] == m->lo;
      ASSERT(at_boundary);
      for (int e = 0; e < E; e++) /* every expert with rows here has all of them here */
        ASSERT(m->goffs[e + 1] == m->goffs[e] || m->goffs[e + 1] - m->goffs[e] == p->goffs[e + 1] - p->goffs[e]);
      rows += m->rows;
      largest = m->rows > largest ? m->rows : largest;
    }
    ASSERT_EQ_INT(rows, p->grows);
    ASSERT_EQ_INT(p->mb_rows, largest);
    ASSERT(largest < p->grows); /* the 5 experts' loads allow a real cut */
    mb_rows = largest;
    /* a1, a3 and h are each T_M (B, H) of MPipeMoE's model: B rows kept without reuse, one buffer of the
     * largest micro-batch's rows under S4 (P4 1.4; T_DI and T_DO are the dispatch rows in process) */
    moe__pools pools;
    ASSERT_OK(moe__pipe_pools((size_t)p->grows, (size_t)p->mb_rows, D, H, p->n,
                              r == MOE_REUSE_S4 ? MOE__REUSE_S4 : MOE__REUSE_NONE, 4, &pools));
    ASSERT_EQ_INT((char *)moe__layer_inspect(&l).ffn->h - (char *)moe__layer_inspect(&l).ffn->a1, 2 * ((pools.m + 63) & ~(size_t)63));
    peak[r] = moe_layer_peak_bytes(&l);
    moe_layer_free(&l);
  }
  /* the workspace saving is T_M: three (rows, H) buffers less three of a micro-batch */
  size_t saved = 3 * (((size_t)TMAX * 2 * H * 4 + 63) & ~(size_t)63) - 3 * (((size_t)mb_rows * H * 4 + 63) & ~(size_t)63);
  ASSERT_EQ_INT(peak[0] - peak[1], saved);
}

TEST(pipeline_config_checked) {
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E;
  moe_layer_t l;
  cfg.pipeline = -1;
  ASSERT_STATUS(moe_layer_init(&l, &cfg), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "pipeline"));
  moe_reuse r;
  ASSERT_OK(moe_reuse_parse("s4", "--memory-reuse", &r));
  ASSERT_EQ_INT(r, MOE_REUSE_S4);
  ASSERT_STATUS(moe_reuse_parse("s9", "--memory-reuse", &r), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "none|s4"));
}

/* moe layer-run with micro-batches writes the file that layer-run writes without them: in one process,
 * and expert-parallel under mpirun -np 2 and 3, Linear and 2DH (each micro-batch its own exchange,
 * whose rows sit apart from the other micro-batches'), where the bits of every n are those of n = 1 on
 * the same ranks and all-to-all; static dispatch too, in one process and on 3 ranks. Ranks given
 * different n are refused before any exchange. */
TEST(pipeline_layer_run_same_file) {
  char w[512], x[512], a[512], b[512], args[4096], err[4096];
  snprintf(w, sizeof w, "%s/gelu_k2_cap1_index_dynamic/w.safetensors", test_fixture_dir()); /* E = 6 */
  snprintf(x, sizeof x, "%s/gelu_k2_cap1_index_dynamic/x.safetensors", test_fixture_dir());
  test_tmp_path("pipe_1.safetensors", a, sizeof a);
  test_tmp_path("pipe_n.safetensors", b, sizeof b);
  int mpi = test_have_mpirun(); /* without: the one-process runs only */
  const char *launch[5] = {NULL, TEST_MPIRUN "-np 2", TEST_MPIRUN "-np 3", TEST_MPIRUN "-np 2", TEST_MPIRUN "-np 3"};
  const char *ep[5] = {"", "--expert-parallel", "--expert-parallel", "--expert-parallel --a2a 2dh --ranks-per-node 2",
                       "--expert-parallel --a2a 2dh --ranks-per-node 3"};
  const char *extra[5] = {"--pipeline 3 --memory-reuse s4", "--pipeline 2 --memory-reuse s2",
                          "--pipeline 6 --memory-reuse s4", "--pipeline 3 --memory-reuse s3",
                          "--pipeline 2 --memory-reuse s4"};
  for (int w_ = 0; w_ < (mpi ? 5 : 1); w_++)
    for (int i = 0; i < 2; i++) {
      snprintf(args, sizeof args, "layer-run --weights %s --input %s --out %s --backward --spec --threads 1 %s %s", w, x,
               i ? b : a, ep[w_], i ? extra[w_] : "");
      int rc = run_moe(launch[w_], args, NULL, err, sizeof err); /* the ranks' stderr is kept for the message */
      if (rc) FAIL_("%s %s: exit %d: %s", launch[w_] ? launch[w_] : "", args, rc, err);
      if (i) ASSERT(test_same_file(a, b));
    }
  for (int i = 0; i < 2; i++) { /* static dispatch in one process: the same file too */
    snprintf(args, sizeof args, "layer-run --weights %s --input %s --out %s --backward --dispatch static %s", w, x,
             i ? b : a, i ? "--pipeline 3 --memory-reuse s3" : "");
    int rc = run_moe(NULL, args, NULL, err, sizeof err);
    if (rc) FAIL_("%s: exit %d: %s", args, rc, err);
  }
  ASSERT(test_same_file(a, b));
  if (!mpi) return;
  for (int i = 0; i < 2; i++) { /* static dispatch expert-parallel: each micro-batch its own exchanges */
    snprintf(args, sizeof args, "layer-run --weights %s --input %s --out %s --backward --dispatch static "
             "--expert-parallel --threads 1 %s", w, x, i ? b : a, i ? "--pipeline 4 --memory-reuse s4" : "");
    int rc = run_moe(TEST_MPIRUN "-np 3", args, NULL, err, sizeof err);
    if (rc) FAIL_("mpirun -np 3 moe %s: exit %d: %s", args, rc, err);
  }
  ASSERT(test_same_file(a, b));
  char first[4608]; /* mpirun's first program (MPMD): the second, given to run_moe, adds --pipeline 2 */
  snprintf(args, sizeof args, "layer-run --expert-parallel --backward --threads 1 --weights %s --input %s --out %s", w,
           x, b);
  snprintf(first, sizeof first, TEST_MPIRUN "-np 1 '%s' %s : -np 1", MOE_CLI, args);
  strncat(args, " --pipeline 2", sizeof args - strlen(args) - 1);
  int rc = run_moe(first, args, NULL, err, sizeof err);
  if (rc != 1 || !strstr(err, "--pipeline")) FAIL_("ranks with different --pipeline: exit %d, want 1 naming it: %s", rc, err);
}

/* The micro-batches and memory strategy may change between a forward and its backward: backward keeps
 * to what the forward did (its shared activation buffer is one micro-batch's). */
TEST(pipeline_set_between_forward_and_backward) {
  static float x[TMAX * D], dy[TMAX * D];
  fill(x, TMAX * D, 3);
  fill(dy, TMAX * D, 11);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E, cfg.act = MOE_ACT_SWIGLU, cfg.threads = 2;
  static run_out ref, o;
  ASSERT(run(&cfg, 1, MOE_REUSE_NONE, x, dy, TMAX, &ref));
  free(ref.grads);
  cfg.pipeline = 4;
  cfg.memory_reuse = MOE_REUSE_S4;
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &cfg));
  moe_layer_init_params(&l, 7);
  float *b = moe_layer_param(&l, "experts.fc1.bias");
  for (int i = 0; i < E * H; i++) b[i] = 0.01f * (float)(i % 7);
  moe_layer_params_changed(&l);
  ASSERT_OK(moe_layer_forward(&l, x, TMAX, o.y, o.spec, NULL));
  ASSERT_OK(moe_layer_set_pipeline(&l, 1, MOE_REUSE_NONE));
  ASSERT_OK(moe_layer_backward(&l, dy, 0.3f, 0.05f, o.spec, NULL, o.dx)); /* as run() does */
  int same = !memcmp(o.y, ref.y, sizeof o.y) && !memcmp(o.dx, ref.dx, sizeof o.dx);
  moe_layer_free(&l);
  ASSERT(same);
}

/* Expert-parallel, S2 and S4 keep two micro-batches of the exchange's buffers (received rows, expert
 * outputs and their gradients) instead of the whole batch, receiving T_DI again in backward; S3 and S4
 * keep one micro-batch's T_M. The layer workspace of rank 0, as moe bench reports it, shrinks so. */
TEST(pipeline_ep_reuse_shrinks_workspace) {
  if (!test_have_mpirun()) return;
  const char *strategy[4] = {"none", "s2", "s3", "s4"};
  double peak[4];
  for (int r = 0; r < 4; r++) {
    char args[512], path[512], err[4096];
    snprintf(args, sizeof args, "bench --expert-parallel --json --shape 512,32,64,8,2 --dispatch dynamic --routing "
             "uniform --reps 1 --threads 1 --pipeline 4 --memory-reuse %s", strategy[r]);
    int rc = run_moe(TEST_MPIRUN "-np 2", args, test_tmp_path("pipe_bench.json", path, sizeof path), err, sizeof err);
    char *out = test_read_file(path, NULL);
    const char *at = out ? strstr(out, "\"peak_bytes\": ") : NULL;
    if (rc || !at) FAIL_("mpirun -np 2 moe %s: exit %d: %s%s", args, rc, out ? out : "", err);
    peak[r] = atof(at + 14);
    free(out);
  }
  if (!(peak[1] < peak[0] && peak[2] < peak[0] && peak[3] < peak[1] && peak[3] < peak[2]))
    FAIL_("peak bytes none %.0f, s2 %.0f, s3 %.0f, s4 %.0f: want s2, s3 < none and s4 below both", peak[0],
          peak[1], peak[2], peak[3]);
}

/* memory_reuse auto: the first step runs S4 and measures; from the second on, the strategy Eq. 10 models
 * fastest among those whose workspace fits the budget: none when everything fits, S3 (one micro-
 * batch's T_M, recomputed) when only it does (in one process S2 saves nothing and S4 saves what S3
 * does at more cost), S4 when nothing fits. Outputs keep the bits of n = 1 at every step. */
TEST(pipeline_reuse_auto_fits_budget) {
  static float x[TMAX * D], dy[TMAX * D];
  fill(x, TMAX * D, 21);
  fill(dy, TMAX * D, 22);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E, cfg.top_k = 2, cfg.threads = 1;
  run_out ref, o;
  ASSERT(run(&cfg, 1, MOE_REUSE_NONE, x, dy, TMAX, &ref));
  free(ref.grads);
  size_t peak[2]; /* the workspace reserved by none, S3 at n = 4 */
  for (int i = 0; i < 2; i++) {
    cfg.pipeline = 4, cfg.memory_reuse = i ? MOE_REUSE_S3 : MOE_REUSE_NONE;
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &cfg));
    ASSERT_OK(moe_layer_forward(&l, x, TMAX, o.y, NULL, NULL));
    peak[i] = moe__layer_inspect(&l).route_cap + moe__layer_inspect(&l).work_cap;
    moe_layer_free(&l);
  }
  ASSERT(peak[1] < peak[0]);
  const struct { size_t budget; moe_reuse want; } cases[] = {
      {peak[0] + 4096, MOE_REUSE_NONE}, {(peak[0] + peak[1]) / 2, MOE_REUSE_S3}, {peak[1] / 2, MOE_REUSE_S4}};
  for (int c = 0; c < 3; c++) {
    cfg.pipeline = 4, cfg.memory_reuse = MOE_REUSE_AUTO, cfg.memory_budget = cases[c].budget;
    moe_layer_t l;
    ASSERT(init_layer(&l, &cfg));
    for (int step = 0; step < 3; step++) {
      moe_layer_stats st;
      ASSERT_OK(moe_layer_forward(&l, x, TMAX, o.y, o.spec, &st));
      ASSERT_OK(moe_layer_backward(&l, dy, 0.3f, 0.05f, o.spec, NULL, o.dx));
      moe_reuse want = step == 0 ? MOE_REUSE_S4 : cases[c].want;
      if (st.memory_reuse != want)
        FAIL_("budget %zu (none %zu, s3 %zu), step %d: ran %s, want %s", cases[c].budget, peak[0], peak[1], step,
              moe_reuse_name(st.memory_reuse), moe_reuse_name(want));
      if (memcmp(o.y, ref.y, sizeof o.y) || memcmp(o.dx, ref.dx, sizeof o.dx))
        FAIL_("budget %zu, step %d (%s): the outputs differ from n = 1", cases[c].budget, step,
              moe_reuse_name(st.memory_reuse));
    }
    ASSERT(moe__layer_inspect(&l).route_cap + moe__layer_inspect(&l).work_cap <= (cases[c].want == MOE_REUSE_S4 ? peak[1] : cases[c].budget));
    moe_layer_free(&l);
  }
  cfg.memory_budget = 0;
  moe_layer_t l;
  ASSERT_STATUS(moe_layer_init(&l, &cfg), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "memory_budget"));
}

/* moe train with hierarchical experts: the per-step losses and the checkpoint of --pipeline 2 and 3
 * (S4: the inner layers' forward again before their backward) are those of --pipeline 1. */
TEST(pipeline_train_hier_same_losses) {
  char args[1200], out[512], ck[512], ck1[512], err[2048];
  double ref[64], loss[64];
  int nref = 0;
  test_tmp_path("hier_pipe.txt", out, sizeof out);
  test_tmp_path("hier_pipe1.safetensors", ck1, sizeof ck1);
  test_tmp_path("hier_pipe.safetensors", ck, sizeof ck);
  const char *runs[] = {"--pipeline 1", "--pipeline 2", "--pipeline 3 --memory-reuse s4"};
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "train --data '%s' --experts 4 --hier-experts 3 --hier-top-k 1 --top-k 1 --hidden 16 "
             "--model 16 --batch 50 --threads 2 --seed 3 --epochs 1 --log-steps --checkpoint '%s' %s",
             synth_data_dir(), i ? ck : ck1, runs[i]);
    if (run_moe(NULL, args, out, err, sizeof err) != 0) FAIL_("moe %s: %s", args, err);
    int n = test_read_losses(out, i ? loss : ref, 64);
    if (!i) nref = n;
    ASSERT(nref >= 10);
    ASSERT_EQ_INT(n, nref);
    for (int s = 0; i && s < n; s++)
      if (loss[s] != ref[s]) FAIL_("%s: step %d's loss %.9g, %.9g with --pipeline 1", runs[i], s, loss[s], ref[s]);
    ASSERT(!i || test_same_file(ck, ck1));
  }
}
