/* trainer_state.safetensors (DESIGN 4.10): Adam's moments in the one-process order and the schedule,
 * the MoE layers' options and the adjustments as __metadata__, so that a resumed run goes on bit for
 * bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/trainer.h"

void moe__trainer_state_path(char *buf, size_t n, const char *dir) {
  snprintf(buf, n, "%s/trainer_state.safetensors", dir);
}

/* The options a resumed run keeps, "key=value;..." in __metadata__["train"]: the schedule, the MoE
 * layers' options (config.json has no place for them) and the adjustments. */
static void options_string(const moe_trainer_config *o, const moe_layer_config *l, char *buf, size_t n) {
  const moe_train_adjust *a = &o->adjust;
  snprintf(buf, n,
           "context=%d;batch=%d;steps=%d;warmup=%d;lr=%.9g;weight_decay=%.9g;eval_every=%d;eval_windows=%d;"
           "time_budget=%.9g;capacity=%.9g;dispatch=%d;dtype=%d;dynamic_capacity=%d;delta_launch=%d;headroom=%.9g;"
           "cache_assignments=%d;cache_on=%.9g;cache_off=%.9g;cache_min_epoch=%d",
           o->context, o->batch, o->steps, o->warmup, (double)o->lr, (double)o->optim.weight_decay, o->eval_every,
           o->eval_windows, (double)o->time_budget, (double)l->capacity_setting, (int)l->dispatch, (int)l->dtype,
           a->dynamic_capacity, a->delta_launch, (double)a->headroom, a->cache_assignments, (double)a->cache.on,
           (double)a->cache.off, a->cache.min_epoch);
  size_t len = strlen(buf); /* only when on: the states of runs without it stay as they were */
  if (o->bias_rate != 0 && len < n) snprintf(buf + len, n - len, ";bias_rate=%.9g", (double)o->bias_rate);
}

/* The options into o and l; 0 when missing or out of range. States from before the layers' options
 * have the first 8 fields, those without the bias balancing 19. */
static int options_parse(const char *s, moe_trainer_config *o, moe_layer_config *l) {
  moe_train_adjust *a = &o->adjust;
  moe_layer_config keep = *l;
  int dispatch = l->dispatch, dtype = l->dtype;
  o->bias_rate = 0;
  int n = s ? sscanf(s,
                     "context=%d;batch=%d;steps=%d;warmup=%d;lr=%f;weight_decay=%f;eval_every=%d;eval_windows=%d;"
                     "time_budget=%f;capacity=%f;dispatch=%d;dtype=%d;dynamic_capacity=%d;delta_launch=%d;"
                     "headroom=%f;cache_assignments=%d;cache_on=%f;cache_off=%f;cache_min_epoch=%d;bias_rate=%f",
                     &o->context, &o->batch, &o->steps, &o->warmup, &o->lr, &o->optim.weight_decay, &o->eval_every,
                     &o->eval_windows, &o->time_budget, &keep.capacity_setting, &dispatch, &dtype,
                     &a->dynamic_capacity, &a->delta_launch, &a->headroom, &a->cache_assignments, &a->cache.on,
                     &a->cache.off, &a->cache.min_epoch, &o->bias_rate)
              : 0;
  l->capacity_setting = keep.capacity_setting;
  l->dispatch = dispatch == MOE_DISPATCH_STATIC ? MOE_DISPATCH_STATIC : MOE_DISPATCH_DYNAMIC;
  l->dtype = dtype == MOE_DT_BF16 ? MOE_DT_BF16 : MOE_DT_F32;
  return (n == 8 || n == 19 || n == 20) && isfinite(o->bias_rate) && o->bias_rate >= 0 && o->context > 0 && o->batch > 0 && o->steps > 0 && o->warmup >= 0 && o->lr > 0 &&
         o->eval_every > 0 && o->eval_windows > 0 && o->optim.weight_decay >= 0 && o->time_budget >= 0 &&
         a->delta_launch >= 0 && a->delta_launch < 60 && a->headroom >= 0 && a->headroom <= 10;
}

/* The metadata of f: the step (and updates), seed, training seconds and options. */
static moe_status read_meta(const moe_st *f, const char *path, moe_trainer_config *c, moe_layer_config *l,
                            int64_t *step, int64_t *updates, double *train_s) {
  const char *st = moe_st_meta(f, "step"), *seed = moe_st_meta(f, "seed"), *secs = moe_st_meta(f, "train_seconds");
  const char *up = moe_st_meta(f, "updates");
  long long s = -1, u = -1;
  unsigned long long sd = 0;
  moe_layer_config scratch = {0};
  *train_s = 0; /* absent from checkpoints older than --time-budget */
  int ok = st && sscanf(st, "%lld", &s) == 1 && s >= 0 && seed && sscanf(seed, "%llu", &sd) == 1 &&
           options_parse(moe_st_meta(f, "train"), c, l ? l : &scratch) &&
           (!secs || (sscanf(secs, "%lf", train_s) == 1 && *train_s >= 0)) &&
           (!up || (sscanf(up, "%lld", &u) == 1 && u >= 0 && u <= s));
  MOE_TRY(ok, MOE_ERR_FORMAT, "%s: __metadata__ step, seed, train or train_seconds is missing or not valid", path);
  c->seed = sd;
  *step = s;
  *updates = up ? u : s;
  return MOE_OK;
}

moe_status moe_trainer_state_read(const char *dir, moe_trainer_config *c, moe_layer_config *layer,
                                  double *train_seconds) {
  char path[4096];
  moe__trainer_state_path(path, sizeof path, dir);
  moe_st *f;
  MOE_CHECK(moe_st_open(&f, path));
  int64_t step, updates;
  double secs;
  moe_status st = read_meta(f, path, c, layer, &step, &updates, &secs);
  moe_st_close(f);
  if (st == MOE_OK && train_seconds) *train_seconds = secs;
  return st;
}

moe_status moe_trainer_resume(moe_trainer *t, const char *dir) {
  char path[4096];
  MOE_TRY(t->model.scatter, MOE_ERR_ARG, "trainer: resuming from %s needs the model's scatter", dir);
  moe__trainer_state_path(path, sizeof path, dir);
  moe_st *f;
  MOE_CHECK(moe_st_open(&f, path));
  moe_trainer_config c = t->cfg; /* the state's options are read, not taken: t's config stands */
  int64_t step, updates;
  double secs;
  moe_status st = read_meta(f, path, &c, NULL, &step, &updates, &secs);
  if (st == MOE_OK && step > t->cfg.steps)
    st = moe__error(MOE_ERR_STATE, __FILE__, __LINE__, "%s: already at step %lld of %d", dir, (long long)step,
                    t->cfg.steps);
  size_t n = t->model.whole_numel;
  float *mo = st == MOE_OK ? malloc(n * sizeof *mo) : NULL, *v = mo ? malloc(n * sizeof *v) : NULL;
  if (st == MOE_OK && !v)
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory for %zu moments", path, n);
  if (st == MOE_OK) st = moe_st_get_f32(f, "optim.m", mo, n);
  if (st == MOE_OK && t->opt.v) st = moe_st_get_f32(f, "optim.v", v, n);
  if (st == MOE_OK && t->opt.m) st = t->model.scatter(t->model.self, mo, t->opt.m);
  if (st == MOE_OK && t->opt.v) st = t->model.scatter(t->model.self, v, t->opt.v);
  free(mo);
  free(v);
  moe_st_close(f);
  if (st != MOE_OK) return st;
  t->step = step;
  t->opt.step = updates;
  t->train_s = secs;
  return MOE_OK;
}

moe_status moe_trainer_save(moe_trainer *t, const char *dir) {
  char path[4096], buf[32], opts[1024];
  const moe_train_model *m = &t->model;
  if (m->checkpoint) return m->checkpoint(m->self, dir, &t->opt, t->step);
  MOE_TRY(m->save && m->gather, MOE_ERR_ARG, "trainer: a checkpoint in %s needs the model's save and gather", dir);
  int writer = moe_dist_rank(m->dist) == 0;
  moe_status st = m->save(m->self, dir);
  size_t n = m->whole_numel;
  float *mo = malloc(n * sizeof *mo), *v = malloc(n * sizeof *v);
  moe_status ex = mo && v ? m->gather(m->self, t->opt.m, mo) : MOE_ERR_NOMEM; /* collectives: on every rank */
  if (ex == MOE_OK && t->opt.v) ex = m->gather(m->self, t->opt.v, v); /* SGD: no second moment */
  if (st == MOE_OK && (!mo || !v)) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "out of memory for %zu moments", n);
  if (st == MOE_OK) st = ex;
  moe_st_writer *w = NULL;
  if (st == MOE_OK && writer) st = moe_st_writer_new(&w);
  int64_t shape[1] = {(int64_t)n};
  moe_layer_config none = {0};
  options_string(&t->cfg, m->layer ? m->layer : &none, opts, sizeof opts);
  if (w && st == MOE_OK) st = moe_st_writer_add_f32(w, "optim.m", MOE_DT_F32, 1, shape, mo);
  if (w && st == MOE_OK && t->opt.v) st = moe_st_writer_add_f32(w, "optim.v", MOE_DT_F32, 1, shape, v);
  snprintf(buf, sizeof buf, "%lld", (long long)t->step);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "step", buf);
  snprintf(buf, sizeof buf, "%lld", (long long)t->opt.step);
  if (w && st == MOE_OK && t->opt.step != t->step) st = moe_st_writer_meta(w, "updates", buf);
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)t->cfg.seed);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "seed", buf);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "train", opts);
  snprintf(buf, sizeof buf, "%.17g", t->train_s);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "train_seconds", buf);
  moe__trainer_state_path(path, sizeof path, dir);
  if (w && st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  free(mo);
  free(v);
  return st;
}
