/* The training loop over a model interface: batch, forward, backward, the update at the schedule's
 * rate, and the evaluations, checkpoints and keep-best due after a step (see moe.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/trainer.h"

void moe_trainer_config_default(moe_trainer_config *c) {
  memset(c, 0, sizeof *c);
  c->lr = 1e-3f;
  c->steps = 1000;
  c->warmup = -1;
  c->eval_every = 100;
  moe_optim_config_default(&c->optim);
  c->optim.weight_decay = 0.1f;
  c->context = 64;
  c->batch = 8;
  c->eval_windows = 64;
  c->seed = 1;
  c->adjust.delta_launch = 2;
  c->adjust.headroom = 0.25f;
  c->adjust.cache = (moe_cache_switch){.on = 0.96f, .off = 0.90f, .min_epoch = 10};
}

/* Over the steps, or with a time budget over the seconds (in millionths of the budget, warm-up the
 * first 5%). */
float moe_trainer_lr(const moe_trainer_config *c, int64_t step, double train_s) {
  if (!c->time_budget) return moe_lr_schedule(c->lr, step, c->warmup < 0 ? c->steps / 20 : c->warmup, c->steps);
  return moe_lr_schedule(c->lr, (int64_t)(1e6 * train_s / c->time_budget), 50000, 1000000);
}

moe_status moe_trainer_new(moe_trainer **out, const moe_trainer_config *c, moe_train_model *model) {
  *out = NULL;
  moe_trainer *t = calloc(1, sizeof *t);
  moe_status st = MOE_OK;
  if (!t) {
    if (model->free) model->free(model->self);
    MOE_TRY(0, MOE_ERR_NOMEM, "trainer: out of memory");
  }
  t->model = *model;
  memset(model, 0, sizeof *model); /* the trainer's now */
  t->cfg = *c;
  if (t->cfg.warmup < 0) t->cfg.warmup = t->cfg.steps / 20;
  t->last = c->stop_after > 0 && c->stop_after < c->steps ? c->stop_after : c->steps;
  t->best = INFINITY;
  if (c->steps <= 0 || c->eval_every <= 0 || !(c->lr > 0) || !(c->time_budget >= 0) || c->stop_after < 0 ||
      !(c->bias_rate >= 0 && isfinite(c->bias_rate)))
    st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__,
                    "trainer: steps %d, eval_every %d, lr %g, time_budget %g, stop_after %d, bias_rate %g out of range",
                    c->steps, c->eval_every, (double)c->lr, (double)c->time_budget, c->stop_after,
                    (double)c->bias_rate);
  const moe_train_model *m = &t->model;
  if (st == MOE_OK && c->bias_rate > 0 && !m->balance_bias)
    st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "trainer: bias_rate %g is DeepSeek-V3's aux-loss-free balancing "
                    "of a selection bias (e_score_correction_bias), which this model's MoE layers do not have",
                    (double)c->bias_rate);
  if (st == MOE_OK && ((c->checkpoint && !m->checkpoint && (!m->save || !m->gather)) || (c->keep_best && !m->save)))
    st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "trainer: a checkpoint or keep_best directory needs the "
                    "model's save and gather (or its own checkpoint)");
  if (st == MOE_OK) st = moe_optim_init_n(&t->opt, &c->optim, t->model.numel);
  if (st == MOE_OK && c->on_nan == MOE_ON_NAN_SKIP &&
      !(t->copy = malloc(t->model.numel * (1 + (t->opt.m != NULL) + (t->opt.v != NULL)) * sizeof *t->copy)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "trainer: out of memory for the skip-step copy of %zu "
                    "parameters", t->model.numel);
  moe__train_blocks b = {m->moe_layers, m->n_moe_layers, m->layer, m->layer_stats, m->self};
  const moe_train_adjust *a = &c->adjust;
  if (st == MOE_OK && (a->dynamic_capacity || a->cache_assignments) && (!m->moe_layers || !m->layer_stats))
    st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "trainer: dynamic capacity and assignment caching need every "
                    "layer of the model to be MoE");
  if (st == MOE_OK && a->dynamic_capacity)
    st = moe__dyncap_start(&t->dc, &b, m->rows, a->delta_launch, a->headroom);
  if (st == MOE_OK && a->cache_assignments)
    st = moe__assign_cache_new(&t->ac, &b, (int)m->samples, m->steps_per_epoch, a->delta_launch, &a->cache);
  if (st != MOE_OK) {
    moe_trainer_free(t);
    return st;
  }
  *out = t;
  return MOE_OK;
}

void moe_trainer_free(moe_trainer *t) {
  if (!t) return;
  if (t->model.free) t->model.free(t->model.self);
  moe_optim_free(&t->opt);
  free(t->copy);
  moe__dyncap_free(t->dc);
  moe__assign_cache_free(t->ac);
  free(t);
}

int moe_trainer_done(const moe_trainer *t) {
  return t->step >= t->last || (t->cfg.time_budget && t->train_s >= t->cfg.time_budget);
}

moe_optim_t *moe_trainer_optim(moe_trainer *t) { return &t->opt; }

int moe_trainer_capacity_stats(const moe_trainer *t, moe_recompile_stats *out) {
  if (t->dc) moe__dyncap_stats(t->dc, out);
  return t->dc != NULL;
}

void moe_trainer_set_step(moe_trainer *t, int64_t step) { t->step = step; }

void moe_trainer_get_info(const moe_trainer *t, moe_trainer_info *out) {
  *out = (moe_trainer_info){t->step, t->last, t->skipped, t->train_s, t->best};
}

moe_status moe_trainer_evaluate(moe_trainer *t, double *loss) {
  double acc;
  return t->model.evaluate(t->model.self, loss, &acc);
}

/* Copies the parameters (ref by ref) and Adam's state to (save) or from the skip-step copy. */
static void transfer(moe_trainer *t, int save) {
  float *c = t->copy;
  const moe_train_model *m = &t->model;
  for (int i = 0; i < m->nrefs; c += m->refs[i++].numel) {
    const moe_tensor_ref *r = &m->refs[i];
    memcpy(save ? c : r->data, save ? r->data : c, r->numel * sizeof *c);
  }
  float *st[2] = {t->opt.m, t->opt.v};
  for (int k = 0; k < 2; k++)
    if (st[k]) {
      memcpy(save ? c : st[k], save ? st[k] : c, m->numel * sizeof *c);
      c += m->numel;
    }
}

static int all_finite(const float *p, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad |= !isfinite(p[i]);
  return !bad;
}

/* Whether every rank's flag is set (one process: this one's). */
static moe_status every_rank(const moe_dist *d, int *flag) {
  if (moe_dist_size(d) < 2) return MOE_OK;
  double v = !*flag;
  MOE_CHECK(moe_dist_allreduce(d, &v, 1));
  *flag = v == 0;
  return MOE_OK;
}

/* The model's update (its own, or the optimizer over the refs and params_changed). */
static moe_status model_update(moe_trainer *t, float lr) {
  moe_train_model *m = &t->model;
  if (m->update) return m->update(m->self, &t->opt, lr);
  moe_optim_step_refs(&t->opt, m->refs, m->nrefs, lr, m->layer ? m->layer->threads : 0);
  m->params_changed(m->self);
  return MOE_OK;
}

/* The update, checked under MOE_ON_NAN_SKIP: a non-finite gradient drops it, one that leaves a
 * non-finite parameter or moment is undone. *skipped says which happened. A model's own update
 * checks what it wrote itself (MOE_ERR_VALUE); the refs' update is checked here. */
static moe_status update(moe_trainer *t, float lr, int *skipped) {
  moe_train_model *m = &t->model;
  *skipped = 0;
  if (t->cfg.on_nan != MOE_ON_NAN_SKIP) return model_update(t, lr);
  int ok = 1, i = 0;
  for (; !m->update && i < m->nrefs && ok; i++) ok = all_finite(m->refs[i].grad, m->refs[i].numel);
  if (!ok) moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "step %lld: the gradient of %s is not finite",
                      (long long)t->step + 1, m->refs[i - 1].name);
  if (!m->update) MOE_CHECK(every_rank(m->dist, &ok));
  if (!ok) return *skipped = 1, MOE_OK;
  transfer(t, 1);
  moe_status st = model_update(t, lr);
  if (st != MOE_OK && st != MOE_ERR_VALUE) return st;
  ok = st == MOE_OK;
  for (int i = 0; !m->update && i < m->nrefs && ok; i++) ok = all_finite(m->refs[i].data, m->refs[i].numel);
  if (!m->update && ok && t->opt.m) ok = all_finite(t->opt.m, m->numel);
  if (!m->update && ok && t->opt.v) ok = all_finite(t->opt.v, m->numel);
  if (!m->update && !ok) moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "step %lld: the update left a parameter or "
                                    "Adam's state not finite (undone)", (long long)t->step + 1);
  if (!m->update) MOE_CHECK(every_rank(m->dist, &ok));
  if (!ok) {
    transfer(t, 0);
    t->opt.step--;
    *skipped = 1;
    m->params_changed(m->self); /* derived copies of the parameters restored */
  }
  return MOE_OK;
}

/* Rank 0's training seconds on every rank: where the schedule is, when the budget ends. */
static moe_status agreed_seconds(const moe_dist *d, double *train_s) {
  if (moe_dist_size(d) < 2) return MOE_OK;
  double v = moe_dist_rank(d) == 0 ? *train_s : 0;
  MOE_CHECK(moe_dist_allreduce(d, &v, 1));
  *train_s = v;
  return MOE_OK;
}

/* A status every rank shares: a rank's failure (writing a file: rank 0's) stops them all. */
static moe_status settled(const moe_dist *d, moe_status st, const char *what, const char *dir) {
  int ok = st == MOE_OK;
  if (every_rank(d, &ok) != MOE_OK) return MOE_ERR_STATE;
  if (st == MOE_OK && !ok) st = moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s %s: another rank failed", what, dir);
  return st;
}

/* After a step: the evaluation, the checkpoint and keep-best. */
static moe_status evaluate_and_save(moe_trainer *t, moe_train_step *s) {
  const moe_trainer_config *c = &t->cfg;
  s->evaluated = 1;
  MOE_CHECK(t->model.evaluate(t->model.self, &s->valid_loss, &s->valid_accuracy));
  s->best = s->valid_loss < t->best;
  if (c->on_eval) MOE_CHECK(c->on_eval(c->ctx, s));
  if (c->checkpoint) MOE_CHECK(settled(t->model.dist, moe_trainer_save(t, c->checkpoint), "checkpoint", c->checkpoint));
  if (s->best) {
    t->best = s->valid_loss;
    if (c->keep_best)
      MOE_CHECK(settled(t->model.dist, t->model.save(t->model.self, c->keep_best), "keep-best", c->keep_best));
  }
  return MOE_OK;
}

moe_status moe_trainer_step(moe_trainer *t, moe_train_step *out) {
  moe_train_step s_, *s = out ? out : &s_;
  const moe_trainer_config *c = &t->cfg;
  moe_train_model *m = &t->model;
  memset(s, 0, sizeof *s);
  s->valid_loss = s->valid_accuracy = NAN;
  MOE_TRY(!moe_trainer_done(t), MOE_ERR_STATE, "trainer: training is over (step %lld of %lld)",
          (long long)t->step, (long long)t->last);
  int64_t step = t->step; /* 0-based */
  double t0 = moe__now();
  const int32_t *samples;
  int n;
  MOE_CHECK(m->batch(m->self, step, &samples, &n));
  if (t->dc) MOE_CHECK(moe__dyncap_begin(t->dc, step));
  if (c->on_batch) MOE_CHECK(c->on_batch(c->ctx, step, samples, n));
  if (t->ac) MOE_CHECK(moe__assign_cache_before(t->ac, step, samples, n));
  s->lr = moe_trainer_lr(c, step, t->train_s);
  /* non-finite: a loss, or MOE_ERR_VALUE from the model (an activation or gradient it names) */
  int skip = c->on_nan == MOE_ON_NAN_SKIP;
  moe_status st = m->forward(m->self, &s->batch);
  if (st == MOE_OK && !isfinite(s->batch.loss))
    st = moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "step %lld: training diverged (loss %g)", (long long)step + 1,
                    s->batch.loss);
  if (st == MOE_OK) st = m->backward(m->self, &s->batch);
  if (st == MOE_OK) st = update(t, s->lr, &s->skipped);
  if (st == MOE_ERR_VALUE && skip) st = MOE_OK, s->skipped = 1;
  if (st == MOE_OK && c->bias_rate > 0 && !s->skipped) st = m->balance_bias(m->self, c->bias_rate);
  if (st != MOE_OK) return st;
  if (s->skipped) t->skipped++;
  t->step = step + 1; /* a skipped step is a step of the schedule too (opt.step counts updates) */
  s->seconds = moe__now() - t0;
  t->train_s += s->seconds;
  if (c->time_budget) MOE_CHECK(agreed_seconds(m->dist, &t->train_s));
  s->step = step + 1;
  s->train_seconds = t->train_s;
  if (t->ac && !s->skipped) MOE_CHECK(moe__assign_cache_after(t->ac, step, samples, n));
  if (t->dc && !s->skipped) MOE_CHECK(moe__dyncap_push(t->dc, step, s->batch.ce));
  s->frac_same = -1;
  s->caching_from = -1;
  s->epoch_end = t->ac && (step + 1) % m->steps_per_epoch == 0;
  if (s->epoch_end) MOE_CHECK(moe__assign_cache_epoch(t->ac, &s->frac_same, &s->caching, &s->caching_from));
  if (c->on_step) MOE_CHECK(c->on_step(c->ctx, s));
  int out_of_time = c->time_budget && t->train_s >= c->time_budget;
  if ((step + 1) % c->eval_every && step + 1 != t->last && !out_of_time) return MOE_OK;
  return evaluate_and_save(t, s);
}
