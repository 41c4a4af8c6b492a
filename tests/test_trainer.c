/* moe_trainer from the library (no CLI): the language model resumed from a checkpoint after N steps
 * equals the uninterrupted run bit for bit; and over a toy model whose losses and gradients the test
 * scripts, the NaN guard's skips (against the optimizer run by hand on the steps kept), the cadence of
 * evaluations, checkpoints and keep-best, the trainer state's options, and the schedule's values
 * (against the formulas computed here in double). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe.h"
#include "test.h"
#include "trainer_lm.h"

/* ---- a toy model: loss 1/2 |w - target|^2, with scripted faults and evaluations ---- */

#define TOY_N 4
static const float TARGET[TOY_N] = {1.0f, -2.0f, 3.0f, 0.5f};

typedef struct {
  float w[TOY_N], g[TOY_N];
  moe_tensor_ref ref;
  int64_t step;                         /* of the batch (0-based) */
  int64_t nan_loss_at, huge_grad_at, inf_grad_at; /* 1-based steps with a fault; 0: none */
  const double *eval_losses;            /* scripted validation losses, one per evaluation */
  int evals;
  int64_t eval_steps[16];
  char saves[16][16];                   /* "ck" or "kb" per save of the model's files */
  int nsaves;
  const char *ck;                       /* the checkpoint directory, to tell the saves apart */
} toy;

static moe_status toy_batch(void *self, int64_t step, const int32_t **samples, int *n) {
  toy *t = self;
  static const int32_t ids[1] = {0};
  t->step = step;
  *samples = ids;
  *n = 1;
  return MOE_OK;
}

static moe_status toy_forward(void *self, moe_train_batch_stats *st) {
  toy *t = self;
  memset(st, 0, sizeof *st);
  for (int i = 0; i < TOY_N; i++) st->loss += 0.5 * (t->w[i] - TARGET[i]) * (t->w[i] - TARGET[i]);
  if (t->step + 1 == t->nan_loss_at) st->loss = NAN;
  st->ce = st->loss;
  return MOE_OK;
}

static moe_status toy_backward(void *self, moe_train_batch_stats *st) {
  toy *t = self;
  (void)st;
  for (int i = 0; i < TOY_N; i++) t->g[i] = t->w[i] - TARGET[i];
  if (t->step + 1 == t->huge_grad_at) t->g[1] = 3e38f; /* finite, but its square overflows Adam's v */
  if (t->step + 1 == t->inf_grad_at) t->g[2] = INFINITY;
  return MOE_OK;
}

static void toy_params_changed(void *self) { (void)self; }

static moe_status toy_evaluate(void *self, double *loss, double *accuracy) {
  toy *t = self;
  (void)accuracy; /* none */
  t->eval_steps[t->evals] = t->step + 1;
  *loss = t->eval_losses ? t->eval_losses[t->evals] : 1.0;
  t->evals++;
  return MOE_OK;
}

static moe_status toy_save(void *self, const char *dir) {
  toy *t = self;
  snprintf(t->saves[t->nsaves++], sizeof t->saves[0], "%s", t->ck && !strcmp(dir, t->ck) ? "ck" : "kb");
  return MOE_OK;
}

static moe_status toy_copy(void *self, const float *a, float *b) {
  (void)self;
  memcpy(b, a, TOY_N * sizeof *b);
  return MOE_OK;
}

/* The interface over t, its w set to w0. */
static moe_train_model toy_model(toy *t) {
  for (int i = 0; i < TOY_N; i++) t->w[i] = 0.25f * (float)i;
  t->ref = (moe_tensor_ref){"toy.weight", 2, {2, 2, 0}, TOY_N, t->w, t->g};
  moe_train_model m = {.self = t, .refs = &t->ref, .nrefs = 1, .numel = TOY_N, .whole_numel = TOY_N, .samples = 1,
                       .steps_per_epoch = 1000, .batch = toy_batch, .forward = toy_forward,
                       .backward = toy_backward, .params_changed = toy_params_changed, .evaluate = toy_evaluate,
                       .save = toy_save, .gather = toy_copy, .scatter = toy_copy};
  return m;
}

typedef struct {
  int n;
  int64_t skipped_steps[16];
  int nskipped;
} step_log;

static moe_status log_step(void *ctx, const moe_train_step *s) {
  step_log *l = ctx;
  l->n++;
  if (s->skipped) l->skipped_steps[l->nskipped++] = s->step;
  return MOE_OK;
}

/* Skip-step: a NaN loss (step 3) and an Inf gradient (step 7) drop the update, one that overflows Adam's
 * second moment (step 5) is undone; w ends where Adam over the other steps, run here, takes it. */
TEST(trainer_nan_guard_skips_steps) {
  toy t = {0};
  t.nan_loss_at = 3, t.huge_grad_at = 5, t.inf_grad_at = 7;
  moe_train_model m = toy_model(&t);
  step_log log = {0};
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.steps = 10;
  c.eval_every = 100;
  c.lr = 0.1f;
  c.on_nan = MOE_ON_NAN_SKIP;
  c.on_step = log_step;
  c.ctx = &log;
  moe_trainer *tr;
  ASSERT_OK(moe_trainer_new(&tr, &c, &m));
  while (!moe_trainer_done(tr)) ASSERT_OK(moe_trainer_step(tr, NULL));
  moe_trainer_info info;
  moe_trainer_get_info(tr, &info);
  moe_trainer_free(tr);
  ASSERT_EQ_INT(info.step, 10);
  ASSERT_EQ_INT(info.skipped, 3);
  ASSERT_EQ_INT(log.n, 10);
  ASSERT_EQ_INT(log.nskipped, 3);
  ASSERT_EQ_INT(log.skipped_steps[0], 3);
  ASSERT_EQ_INT(log.skipped_steps[1], 5);
  ASSERT_EQ_INT(log.skipped_steps[2], 7);
  /* The reference: the optimizer over the seven steps kept, at their steps' rates. */
  float w[TOY_N], g[TOY_N];
  for (int i = 0; i < TOY_N; i++) w[i] = 0.25f * (float)i;
  moe_tensor_ref r = {"toy.weight", 2, {2, 2, 0}, TOY_N, w, g};
  moe_optim_t o;
  ASSERT_OK(moe_optim_init_n(&o, &c.optim, TOY_N));
  c.warmup = c.steps / 20;
  for (int s = 0; s < 10; s++) {
    if (s + 1 == 3 || s + 1 == 5 || s + 1 == 7) continue;
    for (int i = 0; i < TOY_N; i++) g[i] = w[i] - TARGET[i];
    moe_optim_step_refs(&o, &r, 1, moe_lr_schedule(c.lr, s, c.warmup, c.steps), 1);
  }
  moe_optim_free(&o);
  for (int i = 0; i < TOY_N; i++)
    if (memcmp(&w[i], &t.w[i], sizeof w[i])) FAIL_("w[%d] = %.9g, the optimizer over the kept steps %.9g", i, t.w[i], w[i]);
}

/* Stop (the default): the step with a NaN loss fails, naming it, and is not counted. */
TEST(trainer_nan_guard_stops) {
  toy t = {0};
  t.nan_loss_at = 3;
  moe_train_model m = toy_model(&t);
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.steps = 10;
  moe_trainer *tr;
  ASSERT_OK(moe_trainer_new(&tr, &c, &m));
  ASSERT_OK(moe_trainer_step(tr, NULL));
  ASSERT_OK(moe_trainer_step(tr, NULL));
  moe_status st = moe_trainer_step(tr, NULL);
  moe_trainer_info info;
  moe_trainer_get_info(tr, &info);
  moe_trainer_free(tr);
  if (st != MOE_ERR_VALUE || !strstr(moe_last_error(), "step 3: training diverged (loss nan)"))
    FAIL_("step 3 -> %s: %s; want MOE_ERR_VALUE naming the step and the loss", moe_status_name(st), moe_last_error());
  ASSERT_EQ_INT(info.step, 2);
}

/* Evaluations every eval_every steps and at the last (stop_after's, else steps'); a checkpoint after each,
 * the model in keep_best after each that improves on the lowest loss so far. */
TEST(trainer_eval_checkpoint_keep_best_cadence) {
  char ck[512], kb[512];
  test_tmp_path("trainer_cadence_ck", ck, sizeof ck);
  test_tmp_path("trainer_cadence_kb", kb, sizeof kb);
  mkdir(ck, 0755);
  static const double losses[] = {3.0, 2.0, 2.5};
  toy t = {0};
  t.eval_losses = losses;
  t.ck = ck;
  moe_train_model m = toy_model(&t);
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.steps = 10;
  c.eval_every = 4;
  c.checkpoint = ck;
  c.keep_best = kb;
  moe_trainer *tr;
  ASSERT_OK(moe_trainer_new(&tr, &c, &m));
  int evaluated = 0, best = 0;
  while (!moe_trainer_done(tr)) {
    moe_train_step s;
    ASSERT_OK(moe_trainer_step(tr, &s));
    evaluated += s.evaluated;
    best += s.best;
    if (s.evaluated != (s.step == 4 || s.step == 8 || s.step == 10)) FAIL_("step %lld: evaluated %d", (long long)s.step, s.evaluated);
  }
  moe_trainer_info info;
  moe_trainer_get_info(tr, &info);
  moe_trainer_free(tr);
  ASSERT_EQ_INT(evaluated, 3);
  ASSERT_EQ_INT(best, 2);
  ASSERT_EQ_INT(t.evals, 3);
  ASSERT_EQ_INT(t.eval_steps[0], 4);
  ASSERT_EQ_INT(t.eval_steps[1], 8);
  ASSERT_EQ_INT(t.eval_steps[2], 10);
  ASSERT_NEAR(info.best_loss, 2.0, 0);
  char seq[128] = "";
  for (int i = 0; i < t.nsaves; i++) strcat(strcat(seq, t.saves[i]), " ");
  if (strcmp(seq, "ck kb ck kb ck ")) FAIL_("saves: %s; want ck kb ck kb ck", seq);

  /* stop_after 6 of 10: evaluations after 4 and 6, then done */
  toy u = {0};
  m = toy_model(&u);
  c.checkpoint = c.keep_best = NULL;
  c.stop_after = 6;
  ASSERT_OK(moe_trainer_new(&tr, &c, &m));
  while (!moe_trainer_done(tr)) ASSERT_OK(moe_trainer_step(tr, NULL));
  moe_trainer_free(tr);
  ASSERT_EQ_INT(u.evals, 2);
  ASSERT_EQ_INT(u.eval_steps[0], 4);
  ASSERT_EQ_INT(u.eval_steps[1], 6);
}

/* The options a checkpoint keeps come back from its trainer state into a default config. */
TEST(trainer_state_keeps_the_options) {
  char ck[512];
  test_tmp_path("trainer_state_opts", ck, sizeof ck);
  mkdir(ck, 0755);
  toy t = {0};
  moe_train_model m = toy_model(&t);
  moe_layer_config l;
  moe_layer_config_default(&l);
  l.capacity_setting = 1.5f;
  l.dispatch = MOE_DISPATCH_STATIC;
  m.layer = &l;
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.steps = 7, c.warmup = 2, c.lr = 0.125f, c.optim.weight_decay = 0.25f, c.eval_every = 3, c.context = 5;
  c.batch = 3, c.eval_windows = 9, c.seed = 1234567890123ull, c.adjust.headroom = 0.75f, c.adjust.cache.on = 0.5f;
  moe_trainer *tr;
  c.adjust.cache_assignments = 1; /* a model without MoE layers has nothing to adjust */
  ASSERT_STATUS(moe_trainer_new(&tr, &c, &m), MOE_ERR_ARG);
  c.adjust.cache_assignments = 0;
  m = toy_model(&t);
  m.save = NULL; /* a checkpoint needs the model's files */
  c.checkpoint = ck;
  ASSERT_STATUS(moe_trainer_new(&tr, &c, &m), MOE_ERR_ARG);
  c.checkpoint = NULL;
  m = toy_model(&t);
  m.layer = &l;
  ASSERT_OK(moe_trainer_new(&tr, &c, &m));
  for (int i = 0; i < 3; i++) ASSERT_OK(moe_trainer_step(tr, NULL));
  ASSERT_OK(moe_trainer_save(tr, ck));
  moe_trainer_free(tr);
  moe_trainer_config r;
  moe_trainer_config_default(&r);
  moe_layer_config rl;
  moe_layer_config_default(&rl);
  double secs = -1;
  ASSERT_OK(moe_trainer_state_read(ck, &r, &rl, &secs));
  ASSERT_EQ_INT(r.steps, 7);
  ASSERT_EQ_INT(r.warmup, 2);
  ASSERT_NEAR(r.lr, 0.125, 0);
  ASSERT_NEAR(r.optim.weight_decay, 0.25, 0);
  ASSERT_EQ_INT(r.eval_every, 3);
  ASSERT_EQ_INT(r.context, 5);
  ASSERT_EQ_INT(r.batch, 3);
  ASSERT_EQ_INT(r.eval_windows, 9);
  ASSERT(r.seed == 1234567890123ull);
  ASSERT_NEAR(r.adjust.headroom, 0.75, 0);
  ASSERT_NEAR(r.adjust.cache.on, 0.5, 0);
  ASSERT_NEAR(rl.capacity_setting, 1.5, 0);
  ASSERT_EQ_INT(rl.dispatch, MOE_DISPATCH_STATIC);
  ASSERT(secs >= 0);
  /* a state past the schedule is refused on resume */
  toy u = {0};
  m = toy_model(&u);
  c.steps = 2;
  ASSERT_OK(moe_trainer_new(&tr, &c, &m));
  moe_status st = moe_trainer_resume(tr, ck);
  moe_trainer_free(tr);
  if (st != MOE_ERR_STATE || !strstr(moe_last_error(), "already at step 3 of 2"))
    FAIL_("resume past the end -> %s: %s", moe_status_name(st), moe_last_error());
}

/* Warm-up then cosine over the steps, and over the seconds with a time budget (warm-up 5% of it). */
TEST(trainer_schedule_values) {
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.lr = 0.01f, c.steps = 100, c.warmup = 10;
  ASSERT_NEAR(moe_trainer_lr(&c, 0, 0), 0.001, 1e-9);
  ASSERT_NEAR(moe_trainer_lr(&c, 4, 0), 0.005, 1e-9);
  ASSERT_NEAR(moe_trainer_lr(&c, 9, 0), 0.01, 1e-9);
  ASSERT_NEAR(moe_trainer_lr(&c, 10, 0), 0.01, 1e-9);
  ASSERT_NEAR(moe_trainer_lr(&c, 55, 0), 0.005, 1e-9);                                /* half way: cos(pi/2) */
  ASSERT_NEAR(moe_trainer_lr(&c, 40, 0), 0.01 * 0.5 * (1 + cos(M_PI * 30 / 90)), 1e-9);
  ASSERT_NEAR(moe_trainer_lr(&c, 100, 0), 0, 1e-9);
  c.warmup = -1; /* 5% of the steps */
  ASSERT_NEAR(moe_trainer_lr(&c, 0, 0), 0.002, 1e-9);
  c.time_budget = 200;
  ASSERT_NEAR(moe_trainer_lr(&c, 77, 5), 0.01 * 25001 / 50000, 1e-9); /* 2.5%: millionth 25000 of the warm-up's 50000 */
  ASSERT_NEAR(moe_trainer_lr(&c, 3, 100), 0.01 * 0.5 * (1 + cos(M_PI * 450000 / 950000)), 1e-8);
  ASSERT_NEAR(moe_trainer_lr(&c, 3, 250), 0, 1e-9);
}

/* ---- the language model ---- */

enum { LM_STEPS = 12, LM_STOP = 5, LM_TRAIN = 1200, LM_VALID = 300 };

static void lm_cfg(moe_lm_config *c) {
  moe_lm_config_default(c);
  c->vocab = 40, c->n_layers = 1, c->n_heads = 2, c->n_kv_heads = 1, c->head_dim = 8, c->max_seq = 8;
  c->moe.D = 16, c->moe.H = 16, c->moe.E = 4, c->moe.top_k = 2, c->moe.threads = 1;
}

static moe_status lm_run(moe_lm_t *m, const moe_trainer_config *c, const int32_t *tr, const int32_t *va,
                         const char *resume, trainer_loss_log *log) {
  return trainer_lm_run(m, c, tr, LM_TRAIN, va, LM_VALID, resume, log);
}

/* Stopped after 5 steps with a checkpoint, then built from it (the options read back from its trainer
 * state) and resumed: the steps' losses and the final parameters equal the uninterrupted run's bit for
 * bit. */
static void resume_case(int *failed_, const moe_lm_config *model, float bias_rate) {
  int32_t tr[LM_TRAIN], va[LM_VALID];
  trainer_token_stream(tr, LM_TRAIN, 11, 40);
  trainer_token_stream(va, LM_VALID, 12, 40);
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.steps = LM_STEPS, c.eval_every = 4, c.context = 8, c.batch = 4, c.eval_windows = 6, c.lr = 3e-3f, c.seed = 7;
  c.bias_rate = bias_rate;
  moe_lm_config lc = *model;
  moe_lm_t full = {0}, half = {0}, resumed = {0};
  trainer_loss_log a = {0}, b = {0};
  ASSERT_OK(moe_lm_init(&full, &lc));
  moe_lm_init_params(&full, c.seed);
  ASSERT_OK(lm_run(&full, &c, tr, va, NULL, &a));
  ASSERT_EQ_INT(a.n, LM_STEPS);

  char ck[512];
  test_tmp_path("trainer_lm_ck", ck, sizeof ck);
  moe_trainer_config h = c;
  h.stop_after = LM_STOP;
  h.checkpoint = ck;
  ASSERT_OK(moe_lm_init(&half, &lc));
  moe_lm_init_params(&half, c.seed);
  ASSERT_OK(lm_run(&half, &h, tr, va, NULL, &b));
  moe_lm_free(&half);
  ASSERT_EQ_INT(b.n, LM_STOP);

  moe_trainer_config r;
  moe_trainer_config_default(&r);
  moe_lm_config rc;
  ASSERT_OK(moe_lm_read_config(ck, &rc));
  ASSERT_OK(moe_trainer_state_read(ck, &r, &rc.moe, NULL));
  if (r.bias_rate != bias_rate) FAIL_("the trainer state's bias_rate %.9g, want %.9g", r.bias_rate, bias_rate);
  rc.moe.threads = 1;
  ASSERT_OK(moe_lm_load(&resumed, ck, &rc));
  ASSERT_OK(lm_run(&resumed, &r, tr, va, ck, &b));
  ASSERT_EQ_INT(b.n, LM_STEPS);
  for (int s = 1; s <= LM_STEPS; s++)
    if (memcmp(&a.loss[s], &b.loss[s], sizeof(double)))
      FAIL_("step %d: loss %.17g resumed, %.17g uninterrupted", s, b.loss[s], a.loss[s]);
  ASSERT_EQ_INT(resumed.nrefs, full.nrefs);
  for (int i = 0; i < full.nrefs; i++)
    if (memcmp(full.refs[i].data, resumed.refs[i].data, full.refs[i].numel * sizeof(float)))
      FAIL_("%s differs after the resumed run", full.refs[i].name);
  moe_lm_free(&full);
  moe_lm_free(&resumed);
}

TEST(trainer_lm_resume_matches_uninterrupted) {
  moe_lm_config lc;
  lm_cfg(&lc);
  resume_case(failed_, &lc, 0);
}

/* DeepSeek-V3 (a dense first layer, 8 experts in 4 groups) with the aux-loss-free balancing on: the
 * biases, moved after each step, resume bit for bit too (tests/test_trainer_bias.c has the rule). */
TEST(trainer_bias_rate_resumes_bit_for_bit) {
  moe_lm_config lc;
  lm_cfg(&lc);
  lc.n_layers = 2, lc.moe.E = 8;
  moe_lm_config_set_family(&lc, MOE_LM_DEEPSEEK_V3);
  resume_case(failed_, &lc, 0.01f);
  if (*failed_) return;
  moe_lm_t m = {0}; /* the biases did move: the checkpoint's are not all 0 */
  char ck[512];
  moe_lm_config rc;
  ASSERT_OK(moe_lm_read_config(test_tmp_path("trainer_lm_ck", ck, sizeof ck), &rc));
  ASSERT_OK(moe_lm_load(&m, ck, &rc));
  const moe_tensor_ref *b = moe_lm_find(&m, "model.layers.1.mlp.gate.e_score_correction_bias");
  int moved = 0;
  for (size_t e = 0; b && e < b->numel; e++) moved += b->data[e] != 0;
  moe_lm_free(&m);
  if (!moved) FAIL_("no selection bias moved in %d steps", LM_STOP);
}

typedef struct {
  int64_t ends[8];
  double frac[8];
  int n, caching;
  int64_t caching_from;
} epoch_log;

static moe_status log_epochs(void *ctx, const moe_train_step *s) {
  epoch_log *l = ctx;
  if (!s->epoch_end) return MOE_OK;
  l->ends[l->n] = s->step;
  l->frac[l->n++] = s->frac_same;
  l->caching = s->caching;
  l->caching_from = s->caching_from;
  return MOE_OK;
}

/* DynaMoE's adjustments run by the trainer itself: caching's epochs end every steps_per_epoch steps,
 * frac_same unknown after the first and a fraction after the others, the switch on (thresholds 0, from
 * epoch 1) delta_launch + 1 steps after the metrics of the step after the first epoch judged; dynamic
 * capacity's trigger sees every step. */
TEST(trainer_lm_runs_dynamoe_adjustments) {
  int32_t tr[LM_TRAIN], va[LM_VALID];
  trainer_token_stream(tr, LM_TRAIN, 11, 40);
  trainer_token_stream(va, LM_VALID, 12, 40);
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.context = 8, c.batch = 16, c.eval_windows = 2, c.eval_every = 1000;
  c.adjust.cache_assignments = 1, c.adjust.cache.on = 0, c.adjust.cache.min_epoch = 1, c.adjust.delta_launch = 0;
  c.adjust.dynamic_capacity = 1;
  epoch_log log = {0};
  c.on_step = log_epochs;
  c.ctx = &log;
  moe_lm_config lc;
  lm_cfg(&lc);
  lc.moe.dispatch = MOE_DISPATCH_STATIC; /* per-expert capacities are static dispatch's */
  moe_lm_t m = {0};
  ASSERT_OK(moe_lm_init(&m, &lc));
  moe_lm_init_params(&m, 3);
  moe_train_model model;
  moe_trainer *t;
  ASSERT_OK(moe_train_lm(&model, &m, NULL, tr, LM_TRAIN, va, LM_VALID, &c));
  int per = model.steps_per_epoch; /* 149 windows of 8 + 1, 16 a step */
  ASSERT_EQ_INT(per, 9);
  c.steps = 3 * per;
  ASSERT_OK(moe_trainer_new(&t, &c, &model));
  while (!moe_trainer_done(t)) ASSERT_OK(moe_trainer_step(t, NULL));
  moe_recompile_stats rs;
  int has = moe_trainer_capacity_stats(t, &rs);
  moe_trainer_free(t);
  moe_lm_free(&m);
  ASSERT_EQ_INT(has, 1);
  if (rs.triggers < 1 || rs.triggers > c.steps) FAIL_("%lld trigger calls for %d steps", (long long)rs.triggers, c.steps);
  ASSERT_EQ_INT(log.n, 3);
  for (int e = 0; e < 3; e++) ASSERT_EQ_INT(log.ends[e], (e + 1) * per);
  ASSERT_NEAR(log.frac[0], -1, 0);
  for (int e = 1; e < 3; e++)
    if (!(log.frac[e] >= 0 && log.frac[e] <= 1)) FAIL_("epoch %d: frac_same %g", e + 1, log.frac[e]);
  /* epoch 2's frac_same goes to the trigger with step 2 per + 1's metrics (0-based 2 per), on at the next */
  ASSERT_EQ_INT(log.caching, 1);
  ASSERT_EQ_INT(log.caching_from, 2 * per + 1);
}
