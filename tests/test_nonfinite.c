/* Non-finite values (issue 21): NaN/Inf weights in a layer file or a checkpoint (its parameters,
 * optimizer state, fp32 masters, and the experts that serving leaves in the file) are refused when
 * loaded, naming the file, the tensor and the first bad index, instead of spreading through every
 * output. */
#include <stdlib.h>

#include "run_cli.h"
#include "synth.h"
#include "test.h"

/* Copies src to dst with element `flat` of tensor `name` (F32 or BF16) set to v; 0 on failure. */
static int poke(const char *src, const char *dst, const char *name, size_t flat, float v) {
  moe_st *f;
  moe_tensor_view t;
  if (moe_st_open_lazy(&f, src) != MOE_OK) return 0;
  int ok = moe_st_get(f, name, &t) == MOE_OK;
  size_t es = ok && t.dtype == MOE_DT_BF16 ? 2 : 4, at = ok ? (size_t)t.file_offset + flat * es : 0;
  ok = ok && flat * es < t.nbytes;
  moe_st_close(f);
  size_t n = 0;
  unsigned char *b = (unsigned char *)test_read_file(src, &n);
  ok = ok && b && at + es <= n;
  if (ok) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint16_t h = (uint16_t)(u >> 16); /* NaN and Inf keep their class in the top half */
    memcpy(b + at, es == 2 ? (const void *)&h : (const void *)&u, es);
    ok = moe_write_file_atomic(dst, b, n) == MOE_OK;
  }
  free(b);
  return ok;
}

/* The status of loading layer file p (with an expert order, or NULL), the layer freed. */
static moe_status load_layer(const char *p, const int32_t *order) {
  moe_st *f;
  moe_status st = moe_st_open(&f, p);
  if (st != MOE_OK) return st;
  moe_layer_overrides o;
  moe_layer_overrides_init(&o);
  o.expert_order = order;
  moe_layer_t l;
  st = moe_layer_load(&l, f, &o);
  if (st == MOE_OK) moe_layer_free(&l);
  moe_st_close(f);
  return st;
}

/* st is MOE_ERR_VALUE and the message names all of want (NULL-terminated). */
#define ASSERT_NONFINITE(st, ...)                                                            \
  do {                                                                                      \
    moe_status s2_ = (st);                                                                  \
    const char *w_[] = {__VA_ARGS__, NULL};                                                 \
    if (s2_ != MOE_ERR_VALUE) FAIL_("%s: %s, want MOE_ERR_VALUE (%s)", #st, moe_status_name(s2_), moe_last_error()); \
    for (int i_ = 0; w_[i_]; i_++)                                                          \
      if (!strstr(moe_last_error(), w_[i_])) FAIL_("'%s' lacks '%s'", moe_last_error(), w_[i_]); \
  } while (0)

TEST(nonfinite_layer_weights_refused) {
  char w[512], bad[512];
  snprintf(w, sizeof w, "%s/relu_k2_cap1_index_static/w.safetensors", test_fixture_dir());
  test_tmp_path("nan_w.safetensors", bad, sizeof bad);
  ASSERT_OK(load_layer(w, NULL));
  /* experts.fc2.weight is (6, 12, 16): flat 4 * 192 + 5 * 16 + 7 is (4, 5, 7) */
  ASSERT(poke(w, bad, "experts.fc2.weight", 4 * 192 + 5 * 16 + 7, NAN));
  ASSERT_NONFINITE(load_layer(bad, NULL), bad, "'experts.fc2.weight'", "nan", "(4, 5, 7)");
  /* with the experts reordered the index is still the file's */
  const int32_t order[6] = {4, 0, 1, 2, 3, 5};
  ASSERT_NONFINITE(load_layer(bad, order), "(4, 5, 7)");
  ASSERT(poke(w, bad, "gate.bias", 5, -INFINITY));
  ASSERT_NONFINITE(load_layer(bad, NULL), "'gate.bias'", "-inf", "(5)");
  /* the command line: exit 1 with the message, no output */
  char x[512], out[512], args[2048], err[2048];
  snprintf(x, sizeof x, "%s/relu_k2_cap1_index_static/x.safetensors", test_fixture_dir());
  test_tmp_path("nan_out.safetensors", out, sizeof out);
  ASSERT(poke(w, bad, "gate.weight", 0, NAN));
  snprintf(args, sizeof args, "layer-run --weights '%s' --input '%s' --out '%s' --backward", bad, x, out);
  int rc = run_moe(NULL, args, NULL, err, sizeof err);
  if (rc != 1 || !strstr(err, "'gate.weight' has a non-finite value, nan, at index (0, 0)"))
    FAIL_("moe %s: exit %d, stderr '%s'", args, rc, err);
  ASSERT(test_read_file(out, NULL) == NULL);
}

/* The small model of these tests: 5 inputs, 3 classes, 2 blocks of 4 experts (D 6, H 4, k 2). */
static void tiny_config(moe_model_config *c, int threads) {
  moe_model_config_default(c);
  c->in_dim = 5, c->classes = 3, c->blocks = 2;
  c->moe.D = 6, c->moe.H = 4, c->moe.E = 4, c->moe.top_k = 2, c->moe.threads = threads;
}

/* A batch of 8 for it: x[i] = ((i * mul) % mod) / mod - 0.5, labels cycling over the 3 classes. */
static void tiny_batch(float x[8 * 5], uint8_t y[8], int mul, int mod) {
  for (int i = 0; i < 40; i++) x[i] = (float)((i * mul) % mod) / (float)mod - 0.5f;
  for (int i = 0; i < 8; i++) y[i] = (uint8_t)(i % 3);
}

/* A small bf16 model with Adam, one step taken, saved to path. */
static void save_model(int *failed_, const char *path) {
  moe_model_config c;
  tiny_config(&c, 1);
  c.moe.dtype = MOE_DT_BF16;
  moe_model_t m;
  moe_optim_t o;
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 5);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  moe_status st = moe_optim_init(&o, &oc, &m);
  float x[8 * 5];
  uint8_t y[8];
  tiny_batch(x, y, 7, 11);
  moe_model_zero_grad(&m);
  if (st == MOE_OK) st = moe_model_forward(&m, x, y, 8, NULL);
  if (st == MOE_OK) st = moe_model_backward(&m);
  if (st == MOE_OK) moe_optim_step(&o, &m, 1e-3f);
  if (st == MOE_OK) st = moe_checkpoint_save(path, &m, &o, NULL);
  moe_optim_free(&o);
  moe_model_free(&m);
  ASSERT_OK(st);
}

TEST(nonfinite_checkpoint_refused) {
  char ck[512], bad[512];
  test_tmp_path("nf_ck.safetensors", ck, sizeof ck);
  test_tmp_path("nf_bad.safetensors", bad, sizeof bad);
  save_model(failed_, ck);
  if (*failed_) return;
  moe_model_t m;
  moe_optim_t o;
  ASSERT_OK(moe_checkpoint_load(ck, &m, &o, NULL));
  moe_optim_free(&o);
  moe_model_free(&m);
  static const struct { const char *tensor; size_t flat; float v; const char *at; int serving; } cases[] = {
      {"head.weight", 3 * 6 - 1, NAN, "(2, 5)", 1},                          /* (classes, D) */
      {"optim.v.blocks.1.moe.gate.weight", 6, INFINITY, "(1, 0)", 0},       /* Adam's state, (E, D) */
      {"master.blocks.0.moe.experts.fc1.weight", 24 + 7, NAN, "(1, 1, 1)", 0}, /* fp32 master, (E, H, D) */
      {"blocks.1.moe.experts.fc2.weight", 3 * 24 + 2, NAN, "(3, 0, 2)", 1},  /* BF16, (E, D, H) */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ASSERT(poke(ck, bad, cases[i].tensor, cases[i].flat, cases[i].v));
    char name[128];
    snprintf(name, sizeof name, "'%s'", cases[i].tensor);
    ASSERT_NONFINITE(moe_checkpoint_load(bad, &m, &o, NULL), bad, name, cases[i].at);
    if (!cases[i].serving) continue;
    ASSERT_NONFINITE(moe_checkpoint_load(bad, &m, NULL, NULL), name, cases[i].at);
    for (int K = 0; K <= 2; K += 2) /* all resident, and the experts left in the file behind K slots */
      ASSERT_NONFINITE(moe_checkpoint_load_serving(bad, &m, K, MOE_CACHE_LRU, -1), name, cases[i].at);
  }
  /* eval, infer and resume: exit 1 with the message */
  ASSERT(poke(ck, bad, "head.weight", 0, NAN));
  const char *cmds[3] = {"eval --checkpoint '%s' --data '%s'", "infer --checkpoint '%s' --data '%s'",
                         "train --resume '%s' --data '%s'"};
  for (int c = 0; c < 3; c++) {
    char args[1024], err[2048];
    snprintf(args, sizeof args, cmds[c], bad, synth_data_dir());
    int rc = run_moe(NULL, args, NULL, err, sizeof err);
    if (rc != 1 || !strstr(err, "'head.weight' has a non-finite value, nan, at index (0, 0)"))
      FAIL_("moe %s: exit %d, stderr '%s'", args, rc, err);
  }
}

/* ---- divergence: the first non-finite activation, gradient or parameter, by block and tensor ---- */

static float *ref(moe_model_t *m, const char *name) { return (float *)moe_model_find(m, name)->data; }

/* A non-finite gradient in any one tensor fails the backward naming it, whichever of the 2 threads
 * checks it and whatever that thread checks after it. */
TEST(nonfinite_backward_names_any_gradient) {
  moe_model_config c;
  tiny_config(&c, 2);
  moe_model_t m;
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 5);
  float x[8 * 5];
  uint8_t y[8];
  tiny_batch(x, y, 5, 9);
  char msg[512] = "";
  for (int i = 0; i < m.nrefs && !msg[0]; i++) {
    moe_model_zero_grad(&m);
    moe_status st = moe_model_forward(&m, x, y, 8, NULL);
    if (st != MOE_OK) {
      snprintf(msg, sizeof msg, "forward: %s", moe_last_error());
      break;
    }
    m.refs[i].grad[m.refs[i].numel - 1] = NAN; /* the backward adds to it: it stays NaN */
    char want[200];
    snprintf(want, sizeof want, "went non-finite first at 'grad.%s' [", m.refs[i].name);
    st = moe_model_backward(&m);
    if (st != MOE_ERR_VALUE || !strstr(moe_last_error(), want))
      snprintf(msg, sizeof msg, "NaN in %s's gradient: %s '%s', want '%s'", m.refs[i].name, moe_status_name(st),
               moe_last_error(), want);
  }
  moe_model_free(&m);
  if (msg[0]) FAIL_("%s", msg);
}

TEST(nonfinite_forward_names_block_and_tensor) {
  moe_model_config c;
  tiny_config(&c, 1);
  moe_model_t m;
  moe_optim_t o;
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 3);
  moe_status st = moe_optim_init(&o, &oc, &m);
  if (st != MOE_OK) moe_model_free(&m);
  ASSERT_OK(st);
  float x[8 * 5];
  uint8_t y[8];
  tiny_batch(x, y, 7, 11);
  static const struct { const char *tensor; size_t at; float v; const char *want, *param; } cases[] = {
      {"in.bias", 2, INFINITY, "the forward went non-finite first at the input projection's output (in) [0, 2] = inf",
       "the parameters went non-finite first at 'in.bias' [2] = inf"},
      {"blocks.1.norm.weight", 3, NAN, "at block 1, the norm's output (blocks.1.norm) [0, 3] = nan",
       "'blocks.1.norm.weight' [3] = nan"},
      {"head.bias", 1, -INFINITY, "the head's output, the logits (head) [0, 1] = -inf", "'head.bias' [1] = -inf"},
  };
  char msg[512] = "";
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !msg[0]; i++) {
    float *p = ref(&m, cases[i].tensor), keep = p[cases[i].at];
    p[cases[i].at] = cases[i].v;
    st = moe_model_forward(&m, x, y, 8, NULL);
    if (st != MOE_ERR_VALUE || !strstr(moe_last_error(), cases[i].want))
      snprintf(msg, sizeof msg, "case %zu forward: %s '%s', want '%s'", i, moe_status_name(st), moe_last_error(),
               cases[i].want);
    else if (moe_model_backward(&m) != MOE_ERR_STATE) /* nothing to differentiate */
      snprintf(msg, sizeof msg, "case %zu: backward ran after a failed forward", i);
    else if (moe_model_check_finite(&m, NULL) != MOE_ERR_VALUE || !strstr(moe_last_error(), cases[i].param))
      snprintf(msg, sizeof msg, "case %zu check: '%s', want '%s'", i, moe_last_error(), cases[i].param);
    p[cases[i].at] = keep;
  }
  /* a non-finite input is named as such, not as the projection's output */
  x[2 * 5 + 4] = NAN;
  st = moe_model_forward(&m, x, y, 8, NULL);
  if (!msg[0] && (st != MOE_ERR_VALUE || !strstr(moe_last_error(), "went non-finite first at the input (x) [2, 4] = nan")))
    snprintf(msg, sizeof msg, "input: %s '%s'", moe_status_name(st), moe_last_error());
  x[2 * 5 + 4] = 0.25f;
  /* finite weights whose product overflows: block 0's experts */
  float *w2 = ref(&m, "blocks.0.moe.experts.fc2.weight"), save[4 * 6 * 4];
  memcpy(save, w2, sizeof save);
  for (int i = 0; !msg[0] && i < 4 * 6 * 4; i++) w2[i] = 3e38f;
  st = moe_model_forward(&m, x, y, 8, NULL);
  if (!msg[0] && (st != MOE_ERR_VALUE || !strstr(moe_last_error(), "at block 0, the MoE layer's output (blocks.0.moe) [")))
    snprintf(msg, sizeof msg, "overflow: %s '%s'", moe_status_name(st), moe_last_error());
  memcpy(w2, save, sizeof save);
  /* healthy again; then the optimizer's state is checked too */
  moe_model_zero_grad(&m);
  if (!msg[0] && (moe_model_forward(&m, x, y, 8, NULL) != MOE_OK || moe_model_backward(&m) != MOE_OK))
    snprintf(msg, sizeof msg, "healthy step: '%s'", moe_last_error());
  moe_optim_step(&o, &m, 1e-3f);
  if (!msg[0] && moe_model_check_finite(&m, &o) != MOE_OK) snprintf(msg, sizeof msg, "after a step: '%s'", moe_last_error());
  o.v[moe_model_find(&m, "in.bias")->data - m.dense + 4] = INFINITY; /* in.weight (6, 5) is first */
  st = moe_model_check_finite(&m, &o);
  if (!msg[0] && (st != MOE_ERR_VALUE || !strstr(moe_last_error(), "'optim.v.in.bias' [4] = inf")))
    snprintf(msg, sizeof msg, "optimizer state: %s '%s'", moe_status_name(st), moe_last_error());
  moe_optim_free(&o);
  moe_model_free(&m);
  if (msg[0]) FAIL_("%s", msg);
}

/* moe train --lr 1e6 diverges within a few steps: --on-nan stop (the default) exits 1 naming the epoch,
 * batch, step and the first non-finite tensor; skip-step drops those updates, counts them and
 * finishes with a checkpoint that holds no NaN or Inf (the loader would refuse it). */
TEST(train_on_nan) {
  const char *data = synth_data_dir();
  char args[2048], err[4096], out[512], ck[512];
  test_tmp_path("on_nan_out.txt", out, sizeof out);
  test_tmp_path("on_nan.safetensors", ck, sizeof ck);
#define NAN_RUN "train --data '%s' --experts 4 --top-k 2 --hidden 32 --model 32 --batch 50 --threads 1 --lr 1e6"
  snprintf(args, sizeof args, NAN_RUN " --epochs 1", data);
  int rc = run_moe(NULL, args, out, err, sizeof err);
  if (rc != 1 || !strstr(err, "moe train: epoch 1, batch ") || !strstr(err, "training diverged: the ") ||
      !strstr(err, " went non-finite first at ") || !strstr(err, "--on-nan skip-step"))
    FAIL_("moe %s: exit %d, stderr '%s'", args, rc, err);
  snprintf(args, sizeof args, NAN_RUN " --epochs 2 --on-nan skip-step --checkpoint '%s'", data, ck);
  rc = run_moe(NULL, args, out, err, sizeof err);
  char *text = test_read_file(out, NULL);
  const char *key = "steps skipped (non-finite, --on-nan skip-step): ", *n1 = text ? strstr(text, key) : NULL;
  long skipped = n1 ? atol(n1 + strlen(key)) : 0;
  int done = text && strstr(text, "test_accuracy=") != NULL;
  free(text);
  if (rc != 0 || skipped < 1 || skipped > 12 || !done || !strstr(err, "update skipped: the "))
    FAIL_("moe %s: exit %d, %ld skipped in epoch 1, stderr '%s'", args, rc, skipped, err);
  moe_model_t m;
  moe_optim_t o;
  ASSERT_OK(moe_checkpoint_load(ck, &m, &o, NULL));
  moe_optim_free(&o);
  moe_model_free(&m);
  snprintf(args, sizeof args, NAN_RUN " --epochs 1 --on-nan skip-step --json", data);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  text = test_read_file(out, NULL);
  n1 = text ? strstr(text, "{\"epoch\": 1, \"skipped_steps\": ") : NULL;
  skipped = n1 ? atol(n1 + 30) : 0;
  free(text);
  ASSERT(skipped >= 1);
  snprintf(args, sizeof args, NAN_RUN " --epochs 1 --on-nan skip", data);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "--on-nan: bad value 'skip'"));
#undef NAN_RUN
}

/* The layer refuses a non-finite input naming its first one (row, column and value), on any number
 * of threads: two bad values, the later one first in the second thread's half. */
TEST(nonfinite_layer_input_names_the_first) {
  enum { T = 64, D = 16 };
  for (int threads = 1; threads <= 2; threads++) {
    moe_layer_config c;
    moe_layer_config_default(&c);
    c.D = D, c.H = 8, c.E = 4, c.threads = threads;
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &c));
    moe_layer_init_params(&l, 3);
    float *x = calloc(T * D, sizeof *x), *y = calloc(T * D, sizeof *y);
    ASSERT(x && y);
    x[5 * D + 3] = INFINITY;
    x[50 * D + 9] = NAN;
    ASSERT_NONFINITE(moe_layer_forward(&l, x, T, y, NULL, NULL), "x[5, 3] is inf");
    free(x);
    free(y);
    moe_layer_free(&l);
  }
}
