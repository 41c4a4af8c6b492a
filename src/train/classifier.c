/* The classifier behind the trainer's model interface: each epoch a shuffled order of the training
 * images, a batch augmented as a function of (seed, epoch, position) so that a resumed run sees the
 * batches the uninterrupted one would have, the checked update, the accuracy on the validation set as
 * its evaluation, and moe_checkpoint_save's one file as its checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "train/augment.h"

enum { EVAL_BATCH = 500 };

typedef struct {
  moe_model_t *m;
  const moe_dataset *train, *valid;
  moe_augment aug;
  uint64_t seed;
  char extra[sizeof(((moe_train_state *)0)->extra)];
  int B, steps, b0, b1, F, threads; /* every rank forms the same global batch and takes [b0, b1) of it */
  int epoch;                        /* of perm (-1: none yet) */
  int grads_zero;                   /* the last checked update left the gradients zeroed */
  int32_t *perm;                    /* (n) this epoch's order */
  float *x;                         /* (B, F) */
  uint8_t *y;                       /* (B) */
} cls_task;

/* A uniform draw in [-1, 1) from the top 53 bits of h. */
static double unit_pm1(uint64_t h) { return (double)(h >> 11) * 0x1p-52 - 1.0; }

static uint64_t mix(uint64_t z) { /* splitmix64 finalizer */
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* x and y := batch s of the epoch, the images on k->threads threads (the bits do not depend on how many). */
static void fill(cls_task *k, int s) {
  const moe_dataset *d = k->train;
  int R = d->rows, C = d->cols, a = k->aug.shift, warp = k->aug.rotate > 0 || k->aug.scale > 0;
#pragma omp parallel for num_threads(k->threads) if (warp) /* a shift alone is a copy, not worth the threads */
  for (int i = 0; i < k->B; i++) {
    int pos = s * k->B + i, idx = k->perm[pos];
    const float *src = d->images + (size_t)idx * R * C;
    float *dst = k->x + (size_t)i * R * C;
    k->y[i] = d->labels[idx];
    uint64_t h = mix(k->seed ^ mix(((uint64_t)k->epoch << 32) ^ (uint64_t)pos));
    int dy = 0, dx = 0;
    if (a > 0) { /* a random shift of up to a pixels each way, zeros shifted in */
      dy = (int)(h % (uint64_t)(2 * a + 1)) - a;
      dx = (int)((h >> 32) % (uint64_t)(2 * a + 1)) - a;
    }
    if (warp) {
      uint64_t h1 = mix(h ^ 0x5CA1E), h2 = mix(h1);
      moe__augment_warp(src, dst, R, C, k->aug.rotate * unit_pm1(h1), 1.0 + k->aug.scale * unit_pm1(h2), dy, dx);
      continue;
    }
    for (int r = 0; r < R; r++)
      for (int c = 0; c < C; c++) {
        int sr = r - dy, sc = c - dx;
        dst[r * C + c] = sr >= 0 && sr < R && sc >= 0 && sc < C ? src[sr * C + sc] : 0.0f;
      }
  }
}

static moe_status cls_batch(void *self, int64_t step, const int32_t **samples, int *n) {
  cls_task *k = self;
  int epoch = (int)(step / k->steps), s = (int)(step % k->steps);
  if (epoch != k->epoch) moe_train_shuffle(k->perm, k->train->n, k->seed, k->epoch = epoch);
  fill(k, s);
  *samples = k->perm + (size_t)s * k->B + k->b0;
  *n = k->b1 - k->b0;
  return MOE_OK;
}

static moe_status cls_forward(void *self, moe_train_batch_stats *out) {
  cls_task *k = self;
  if (!k->grads_zero) moe_model_zero_grad(k->m);
  k->grads_zero = 0;
  memset(out, 0, sizeof *out);
  moe_model_stats st;
  MOE_CHECK(moe_model_forward(k->m, k->x + (size_t)k->b0 * k->F, k->y + k->b0, k->b1 - k->b0, &st));
  out->loss = out->ce = st.loss;
  out->dropped = st.dropped;
  out->aux = st.aux;
  out->correct = st.correct;
  return MOE_OK;
}

static moe_status cls_backward(void *self, moe_train_batch_stats *st) {
  (void)st;
  return moe_model_backward(((cls_task *)self)->m);
}

static void cls_params_changed(void *self) {
  cls_task *k = self;
  for (int i = 0; i < k->m->cfg.blocks; i++) moe_layer_params_changed(&k->m->layers[i]); /* bf16 copies */
}

/* The update and its check in one pass (which leaves the gradients zeroed). */
static moe_status cls_update(void *self, moe_optim_t *opt, float lr) {
  cls_task *k = self;
  moe_status st = moe_optim_step_checked(opt, k->m, lr);
  k->grads_zero = 1;
  return st;
}

static moe_status cls_balance_bias(void *self, float gamma) {
  cls_task *k = self;
  for (int i = 0; i < k->m->cfg.blocks; i++) MOE_CHECK(moe_layer_balance_bias(&k->m->layers[i], gamma));
  return MOE_OK;
}

static moe_status cls_evaluate(void *self, double *loss, double *accuracy) {
  cls_task *k = self;
  MOE_CHECK(moe_model_accuracy(k->m, k->valid, EVAL_BATCH, accuracy));
  *loss = 1 - *accuracy; /* the error rate */
  return MOE_OK;
}

/* Under expert parallelism a collective, after which rank 0 writes. */
static moe_status cls_checkpoint(void *self, const char *path, const moe_optim_t *opt, int64_t step) {
  cls_task *k = self;
  moe_train_state ts = {.epoch = (int)(step / k->steps), .step = step, .seed = k->seed};
  memcpy(ts.extra, k->extra, sizeof ts.extra);
  return moe_checkpoint_save(path, k->m, opt, &ts);
}

static const moe_layer_stats *cls_layer_stats(void *self, int i) {
  return moe_model_layer_stats(((cls_task *)self)->m, i);
}

static void cls_free(void *self) {
  cls_task *k = self;
  if (!k) return;
  free(k->perm);
  free(k->x);
  free(k->y);
  free(k);
}

void moe_classifier_options_format(const moe_classifier_options *o, char *buf, size_t n) {
  const moe_train_adjust *a = &o->adjust;
  snprintf(buf, n,
           "epochs=%d;batch=%d;warmup=%d;augment=%d;lr=%.9g;dynamic_capacity=%d;delta_launch=%d;headroom=%.9g;"
           "cache_assignments=%d;cache_on=%.9g;cache_off=%.9g;cache_min_epoch=%d;augment_rotate=%.9g;augment_scale=%.9g",
           o->epochs, o->batch, o->warmup, o->aug.shift, (double)o->lr, a->dynamic_capacity, a->delta_launch,
           (double)a->headroom, a->cache_assignments, (double)a->cache.on, (double)a->cache.off, a->cache.min_epoch,
           (double)o->aug.rotate, (double)o->aug.scale);
}

int moe_classifier_options_parse(const char *s, moe_classifier_options *o) {
  moe_train_adjust *a = &o->adjust;
  o->aug.rotate = o->aug.scale = 0;
  int n = s ? sscanf(s,
                     "epochs=%d;batch=%d;warmup=%d;augment=%d;lr=%f;dynamic_capacity=%d;delta_launch=%d;headroom=%f;"
                     "cache_assignments=%d;cache_on=%f;cache_off=%f;cache_min_epoch=%d;augment_rotate=%f;"
                     "augment_scale=%f",
                     &o->epochs, &o->batch, &o->warmup, &o->aug.shift, &o->lr, &a->dynamic_capacity,
                     &a->delta_launch, &a->headroom, &a->cache_assignments, &a->cache.on, &a->cache.off,
                     &a->cache.min_epoch, &o->aug.rotate, &o->aug.scale)
            : 0;
  return (n == 5 || n == 12 || n == 14) && o->epochs > 0 && o->batch > 0 && o->warmup >= -1 && o->aug.shift >= 0 &&
         o->aug.shift < 8 && o->aug.rotate >= 0 && o->aug.rotate <= 90 && o->aug.scale >= 0 && o->aug.scale < 1 &&
         o->lr > 0 && o->lr < 1e3f && a->delta_launch >= 0 && a->delta_launch < 60 && a->headroom >= 0 &&
         a->headroom <= 10 && a->cache.min_epoch >= 0;
}

/* What a resumed run keeps of c and aug (steps per epoch spe). */
static void options_of(const moe_trainer_config *c, const moe_augment *aug, int spe, char *buf, size_t n) {
  int w = c->warmup < 0 ? c->steps / 20 : c->warmup; /* the trainer's default, resolved */
  moe_classifier_options o = {c->steps / spe, c->batch, w == spe ? -1 : w, c->lr, c->adjust, {0, 0, 0}};
  if (aug) o.aug = *aug;
  moe_classifier_options_format(&o, buf, n);
}

moe_status moe_train_classifier(moe_train_model *out, moe_model_t *m, const moe_dataset *train,
                                const moe_dataset *valid, const moe_augment *aug, const moe_trainer_config *c) {
  memset(out, 0, sizeof *out);
  int B = c->batch, F = train->rows * train->cols;
  MOE_TRY(B > 0 && B <= train->n, MOE_ERR_ARG, "trainer: batch %d is not in [1, the %d training samples]", B,
          train->n);
  MOE_TRY(F == m->cfg.in_dim && valid->rows * valid->cols == F, MOE_ERR_ARG,
          "trainer: the model takes %d features, the training images have %d and the validation images %d",
          m->cfg.in_dim, F, valid->rows * valid->cols);
  const moe_dist *d = m->cfg.moe.dist;
  int W = moe_dist_size(d), r = moe_dist_rank(d);
  cls_task *k = calloc(1, sizeof *k);
  if (k) {
    *k = (cls_task){.m = m, .train = train, .valid = valid, .seed = c->seed, .B = B, .steps = train->n / B,
                    .b0 = B * r / W, .b1 = B * (r + 1) / W, .F = F, .threads = moe__threads(m->cfg.moe.threads),
                    .epoch = -1};
    if (aug) k->aug = *aug;
    options_of(c, aug, k->steps, k->extra, sizeof k->extra);
    k->perm = malloc((size_t)train->n * sizeof *k->perm);
    k->x = malloc((size_t)B * F * sizeof *k->x);
    k->y = malloc((size_t)B);
  }
  if (!k || !k->perm || !k->x || !k->y) {
    cls_free(k);
    MOE_TRY(0, MOE_ERR_NOMEM, "trainer: out of memory for a batch of %d x %d and an order of %d", B, F, train->n);
  }
  *out = (moe_train_model){.self = k, .refs = m->refs, .nrefs = m->nrefs, .numel = m->numel, .dist = d,
                           .layer = &m->cfg.moe, .whole_numel = m->numel, .samples = train->n,
                           .steps_per_epoch = k->steps, .batch = cls_batch, .forward = cls_forward,
                           .backward = cls_backward, .params_changed = cls_params_changed, .update = cls_update,
                           .evaluate = cls_evaluate, .checkpoint = cls_checkpoint, .moe_layers = m->layers,
                           .n_moe_layers = m->cfg.blocks, .layer_stats = cls_layer_stats, .rows = B,
                           .free = cls_free, .balance_bias = m->cfg.moe.select_bias ? cls_balance_bias : NULL};
  return MOE_OK;
}

moe_status moe_model_accuracy(moe_model_t *m, const moe_dataset *d, int B, double *acc) {
  MOE_TRY(B > 0, MOE_ERR_ARG, "accuracy: batch %d must be positive", B);
  const moe_dist *dist = m->cfg.moe.dist; /* expert-parallel: each rank takes its slice of a batch */
  int W = moe_dist_size(dist), r = moe_dist_rank(dist);
  double hits = 0;
  int F = d->rows * d->cols;
  for (int s = 0; s < d->n; s += B) {
    int n = d->n - s < B ? d->n - s : B, b0 = s + n * r / W, b1 = s + n * (r + 1) / W;
    MOE_CHECK(moe_model_forward(m, d->images + (size_t)b0 * F, NULL, b1 - b0, NULL));
    const int32_t *p = moe_model_predictions(m);
    for (int i = 0; i < b1 - b0; i++) hits += p[i] == d->labels[b0 + i];
  }
  if (dist) MOE_CHECK(moe_dist_allreduce(dist, &hits, 1));
  *acc = d->n ? hits / d->n : 0;
  return MOE_OK;
}
