/* The trainer's bias_rate (DeepSeek-V3's aux-loss-free balancing): after every step each MoE layer's
 * e_score_correction_bias has moved by the rule computed here from that step's expert counts; a model
 * without a selection bias is refused; and under mpirun 2 ranks give one process's biases (SKIP without
 * it). Its resume bit for bit: tests/test_trainer.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_corpus.h"
#include "moe.h"
#include "run_cli.h"
#include "test.h"
#include "trainer_lm.h"

enum { STEPS = 10, NTRAIN = 1200, NVALID = 300, E = 8 };
#define RATE 0.01f

/* A tiny DeepSeek-V3: a dense first layer, then one MoE layer of 8 sigmoid-routed experts top-2 in 4
 * groups of which 2 are kept, with the selection bias (or Mixtral's, v3 0). */
static void cfg(moe_lm_config *c, int v3) {
  moe_lm_config_default(c);
  c->vocab = 40, c->n_layers = 2, c->n_heads = 2, c->n_kv_heads = 1, c->head_dim = 8, c->max_seq = 8;
  c->moe.D = 16, c->moe.H = 16, c->moe.E = E, c->moe.top_k = 2, c->moe.threads = 1;
  if (v3) moe_lm_config_set_family(c, MOE_LM_DEEPSEEK_V3);
}

static void train_cfg(moe_trainer_config *c) {
  moe_trainer_config_default(c);
  c->steps = STEPS, c->eval_every = 4, c->context = 8, c->batch = 4, c->eval_windows = 6, c->lr = 3e-3f, c->seed = 7;
  c->bias_rate = RATE;
}

typedef struct {
  moe_lm_t *m;
  float before[E];
  int steps, moved, bad;
  char why[256];
} rule_check;

static float *bias_of(moe_lm_t *m) { return moe_layer_param(&m->layers[1], "gate.select_bias"); }

static moe_status keep_bias(void *ctx, int64_t step, const int32_t *ids, int n) {
  rule_check *r = ctx;
  (void)step, (void)ids, (void)n;
  memcpy(r->before, bias_of(r->m), sizeof r->before);
  return MOE_OK;
}

/* After the step: each expert's bias is its bias before it, -RATE when its count is above the mean of
 * the step's counts, +RATE below, unchanged at it (the mean in double, from the layer's counts). */
static moe_status check_rule(void *ctx, const moe_train_step *s) {
  rule_check *r = ctx;
  const int32_t *cnt = moe_lm_layer_stats(r->m, 1)->expert_counts;
  double mean = 0;
  for (int e = 0; e < E; e++) mean += cnt[e] / (double)E;
  const float *now = bias_of(r->m);
  for (int e = 0; e < E; e++) {
    float want = r->before[e] + (cnt[e] > mean ? -RATE : cnt[e] < mean ? RATE : 0.0f);
    if (now[e] != want && !r->bad++)
      snprintf(r->why, sizeof r->why, "step %lld, expert %d: count %d (mean %g), bias %.9g -> %.9g, want %.9g",
               (long long)s->step, e, cnt[e], mean, (double)r->before[e], (double)now[e], (double)want);
    r->moved += now[e] != r->before[e];
  }
  r->steps++;
  return MOE_OK;
}

TEST(trainer_bias_rate_follows_the_rule) {
  int32_t tr[NTRAIN], va[NVALID];
  trainer_token_stream(tr, NTRAIN, 11, 40);
  trainer_token_stream(va, NVALID, 12, 40);
  moe_lm_config lc;
  cfg(&lc, 1);
  moe_lm_t m = {0};
  ASSERT_OK(moe_lm_init(&m, &lc));
  moe_lm_init_params(&m, 7);
  rule_check r = {.m = &m};
  moe_trainer_config c;
  train_cfg(&c);
  c.on_batch = keep_bias, c.on_step = check_rule, c.ctx = &r;
  moe_train_model model;
  moe_trainer *t;
  ASSERT_OK(moe_train_lm(&model, &m, NULL, tr, NTRAIN, va, NVALID, &c));
  ASSERT_OK(moe_trainer_new(&t, &c, &model));
  moe_status st = MOE_OK;
  while (st == MOE_OK && !moe_trainer_done(t)) st = moe_trainer_step(t, NULL);
  moe_trainer_free(t);
  ASSERT_OK(st);
  ASSERT_EQ_INT(r.steps, STEPS);
  if (r.bad) FAIL_("%d biases off the rule; first: %s", r.bad, r.why);
  if (r.moved < STEPS) FAIL_("the biases moved %d times in %d steps: the rule was hardly exercised", r.moved, STEPS);
  moe_lm_free(&m);
}

/* bias_rate on Mixtral (no selection bias): MOE_ERR_ARG naming it; a negative rate: MOE_ERR_ARG. */
TEST(trainer_bias_rate_needs_a_selection_bias) {
  int32_t tr[NTRAIN], va[NVALID];
  trainer_token_stream(tr, NTRAIN, 11, 40);
  trainer_token_stream(va, NVALID, 12, 40);
  for (int v3 = 0; v3 < 2; v3++) {
    moe_lm_config lc;
    cfg(&lc, v3);
    moe_lm_t m = {0};
    ASSERT_OK(moe_lm_init(&m, &lc));
    moe_trainer_config c;
    train_cfg(&c);
    if (v3) c.bias_rate = -0.5f;
    moe_train_model model;
    moe_trainer *t = NULL;
    ASSERT_OK(moe_train_lm(&model, &m, NULL, tr, NTRAIN, va, NVALID, &c));
    ASSERT_STATUS(moe_trainer_new(&t, &c, &model), MOE_ERR_ARG);
    ASSERT(t == NULL);
    const char *want = v3 ? "bias_rate -0.5" : "selection bias";
    if (!strstr(moe_last_error(), want)) FAIL_("error '%s' does not say '%s'", moe_last_error(), want);
    moe_lm_free(&m);
  }
}

/* The e_score_correction_bias of layer 1 of checkpoint dir into b. */
static moe_status read_bias(const char *dir, float *b) {
  char path[1024];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  moe_st *f;
  moe_status st = moe_st_open(&f, path);
  if (st != MOE_OK) return st;
  st = moe_st_get_f32(f, "model.layers.1.mlp.gate.e_score_correction_bias", b, E);
  moe_st_close(f);
  return st;
}

/* moe train --task lm --family deepseek_v3 --bias-rate with 2 ranks (4 of the 8 experts each, half of
 * each batch): the checkpoint's biases are one process's, every step's expert counts summed over the
 * ranks before the rule. */
TEST(trainer_bias_rate_expert_parallel_follows_one_process) {
  if (!test_have_mpirun()) return;
  char one[512], two[512], args[2048], out[512], err[4096];
  test_tmp_path("bias_ep1", one, sizeof one);
  test_tmp_path("bias_ep2", two, sizeof two);
  test_tmp_path("bias_ep.jsonl", out, sizeof out);
  const char *dirs[2] = {one, two};
  float b[2][E];
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --layers 2 --experts 8 --family deepseek_v3 --steps 12 "
             "--eval-every 12 --bias-rate 0.01 --checkpoint '%s' --json", lm_corpus(), dirs[i]);
    if (run_moe(i ? TEST_MPIRUN "-np 2" : NULL, args, out, err, sizeof err))
      FAIL_("%smoe %s: %s", i ? "mpirun -np 2 " : "", args, err);
    ASSERT_OK(read_bias(dirs[i], b[i]));
  }
  int moved = 0;
  for (int e = 0; e < E; e++) {
    if (b[0][e] != b[1][e]) FAIL_("expert %d: bias %.9g with 2 ranks, %.9g in one process", e, b[1][e], b[0][e]);
    moved += b[0][e] != 0;
  }
  if (!moved) FAIL_("no bias moved in 12 steps");
}
