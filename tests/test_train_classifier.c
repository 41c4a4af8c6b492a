/* The classifier behind moe_trainer (moe_train_classifier), from the library (no CLI): each epoch's
 * batches are a permutation of the training samples, a different one each epoch; the evaluation after
 * each epoch is the accuracy counted here sample by sample; a run stopped after an epoch with its one-file
 * checkpoint and resumed from it gives the uninterrupted run's losses and weights bit for bit; and
 * moe_dataset_hold_out's split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"
#include "test.h"

#define CHECK_(x) do { moe_status st_ = (x); if (st_ != MOE_OK) return st_; } while (0)

#define B 50 /* 600 training samples: 12 steps an epoch */

static moe_status load(moe_dataset *train, moe_dataset *test) {
  char img[1024], lab[1024];
  const char *dir = synth_data_dir();
  snprintf(img, sizeof img, "%s/train-images-idx3-ubyte", dir);
  snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte", dir);
  CHECK_(moe_dataset_load_idx(train, img, lab));
  snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte", dir);
  snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte", dir);
  return moe_dataset_load_idx(test, img, lab);
}

static moe_status new_model(moe_model_t *m, const moe_dataset *d) {
  moe_model_config c;
  moe_model_config_default(&c);
  c.in_dim = d->rows * d->cols;
  c.classes = 10;
  c.moe.D = 16;
  c.moe.H = 32;
  c.moe.E = 4;
  c.moe.top_k = 2;
  c.moe.threads = 1;
  CHECK_(moe_model_init(m, &c));
  moe_model_init_params(m, 5);
  return MOE_OK;
}

typedef struct {
  int steps_per_epoch, epochs_seen;
  int32_t seen[3][600]; /* per epoch: how often each sample was in a batch */
  int32_t first[3];     /* the epoch's first sample */
  double loss[64];
  int64_t evaluated[8];
  double acc[8];
  int n_eval;
} record;

static moe_status on_batch(void *ctx, int64_t step, const int32_t *ids, int n) {
  record *r = ctx;
  int e = (int)(step / r->steps_per_epoch);
  if (e < 3) {
    if (step % r->steps_per_epoch == 0) r->first[e] = ids[0];
    for (int i = 0; i < n; i++) r->seen[e][ids[i]]++;
  }
  return n == B ? MOE_OK : MOE_ERR_STATE;
}

static moe_status on_step(void *ctx, const moe_train_step *s) {
  record *r = ctx;
  if (s->step <= 64) r->loss[s->step - 1] = s->batch.loss;
  return MOE_OK;
}

static moe_status on_eval(void *ctx, const moe_train_step *s) {
  record *r = ctx;
  if (r->n_eval < 8) r->evaluated[r->n_eval] = s->step, r->acc[r->n_eval] = s->valid_accuracy;
  r->n_eval++;
  return s->valid_loss == 1 - s->valid_accuracy ? MOE_OK : MOE_ERR_STATE;
}

static void config(moe_trainer_config *tc, record *r, int epochs, int spe) {
  moe_trainer_config_default(tc);
  tc->lr = 2e-3f;
  tc->steps = epochs * spe;
  tc->warmup = spe;
  tc->eval_every = spe;
  moe_optim_config_default(&tc->optim);
  tc->optim.weight_decay = 0.01f;
  tc->batch = B;
  tc->seed = 3;
  tc->on_batch = on_batch;
  tc->on_step = on_step;
  tc->on_eval = on_eval;
  tc->ctx = r;
  r->steps_per_epoch = spe;
}

/* The accuracy on d counted one sample at a time. */
static double accuracy_by_hand(moe_model_t *m, const moe_dataset *d) {
  int hits = 0, F = d->rows * d->cols;
  for (int i = 0; i < d->n; i++) {
    if (moe_model_forward(m, d->images + (size_t)i * F, NULL, 1, NULL) != MOE_OK) return -1;
    hits += moe_model_predictions(m)[0] == d->labels[i];
  }
  return (double)hits / d->n;
}

TEST(train_classifier_batches_evaluations_and_accuracy) {
  moe_dataset train = {0}, test = {0};
  ASSERT_OK(load(&train, &test));
  moe_model_t m = {0};
  ASSERT_OK(new_model(&m, &train));
  record *r = calloc(1, sizeof *r);
  moe_trainer_config tc;
  int spe = train.n / B;
  config(&tc, r, 3, spe);
  moe_augment aug = {1, 10, 0.1f};
  moe_train_model model;
  moe_trainer *t = NULL;
  ASSERT_OK(moe_train_classifier(&model, &m, &train, &test, &aug, &tc));
  ASSERT_OK(moe_trainer_new(&t, &tc, &model));
  while (!moe_trainer_done(t)) ASSERT_OK(moe_trainer_step(t, NULL));
  moe_trainer_free(t);
  for (int e = 0; e < 3; e++)
    for (int i = 0; i < train.n; i++)
      if (r->seen[e][i] > 1) FAIL_("epoch %d: sample %d in %d batches", e, i, r->seen[e][i]);
  ASSERT(r->first[0] != r->first[1] || r->first[1] != r->first[2]); /* a new order each epoch */
  ASSERT_EQ_INT(r->n_eval, 3);
  for (int e = 0; e < 3; e++) ASSERT_EQ_INT(r->evaluated[e], (e + 1) * spe);
  ASSERT(r->loss[3 * spe - 1] < r->loss[0]);
  /* the last evaluation saw the final weights: the same accuracy counted one sample at a time */
  double acc;
  ASSERT_OK(moe_model_accuracy(&m, &test, 64, &acc));
  ASSERT(acc == r->acc[2]);
  ASSERT(accuracy_by_hand(&m, &test) == acc);
  ASSERT(acc > 0.3); /* 10 classes: chance is 0.1 */
  free(r);
  moe_model_free(&m);
  moe_dataset_free(&train);
  moe_dataset_free(&test);
}

/* Epochs [from, to) of a run on m with opt's state (NULL: new), checkpointing to ck after each. */
static moe_status train_epochs(moe_model_t *m, moe_optim_t *opt, const moe_dataset *train, const moe_dataset *test,
                               record *r, int from, int stop, const char *ck) {
  moe_trainer_config tc;
  int spe = train->n / B;
  config(&tc, r, 3, spe);
  tc.stop_after = stop * spe;
  tc.checkpoint = ck;
  moe_augment aug = {2, 15, 0.15f};
  moe_train_model model;
  moe_trainer *t = NULL;
  CHECK_(moe_train_classifier(&model, m, train, test, &aug, &tc));
  CHECK_(moe_trainer_new(&t, &tc, &model));
  moe_status st = MOE_OK;
  if (opt) {
    moe_optim_t *to = moe_trainer_optim(t);
    moe_optim_free(to);
    *to = *opt;
    memset(opt, 0, sizeof *opt);
    moe_trainer_set_step(t, (int64_t)from * spe);
  }
  while (st == MOE_OK && !moe_trainer_done(t)) st = moe_trainer_step(t, NULL);
  moe_trainer_free(t);
  return st;
}

TEST(train_classifier_resume_is_bit_exact) {
  moe_dataset train = {0}, test = {0};
  ASSERT_OK(load(&train, &test));
  int spe = train.n / B;
  char full[512], half[512];
  test_tmp_path("cls_full.safetensors", full, sizeof full);
  test_tmp_path("cls_half.safetensors", half, sizeof half);
  record *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  moe_model_t m = {0}, h = {0}, back = {0};
  ASSERT_OK(new_model(&m, &train));
  ASSERT_OK(train_epochs(&m, NULL, &train, &test, a, 0, 0, full));
  ASSERT_OK(new_model(&h, &train));
  ASSERT_OK(train_epochs(&h, NULL, &train, &test, b, 0, 1, half));
  moe_model_free(&h);
  moe_optim_t opt = {0};
  moe_train_state ts;
  ASSERT_OK(moe_checkpoint_load(half, &back, &opt, &ts));
  ASSERT_EQ_INT(ts.epoch, 1);
  ASSERT_EQ_INT(ts.step, spe);
  ASSERT_EQ_INT(ts.seed, 3);
  /* the options moe train --resume keeps, from the trainer's config and the augmentation */
  moe_classifier_options co;
  if (!moe_classifier_options_parse(ts.extra, &co)) FAIL_("extra '%s' is not a set of training options", ts.extra);
  ASSERT(co.epochs == 3 && co.batch == B && co.warmup == -1 && co.lr == 2e-3f && co.aug.shift == 2 &&
         co.aug.rotate == 15 && co.aug.scale == 0.15f && !co.adjust.dynamic_capacity);
  moe_model_set_threads(&back, 1);
  ASSERT_OK(train_epochs(&back, &opt, &train, &test, b, 1, 0, half));
  for (int s = 0; s < 3 * spe; s++)
    if (memcmp(&a->loss[s], &b->loss[s], sizeof(double))) FAIL_("step %d: loss %.17g resumed, %.17g", s + 1, b->loss[s], a->loss[s]);
  ASSERT_EQ_INT(b->n_eval, 3);
  ASSERT(a->acc[2] == b->acc[2]);
  for (int i = 0; i < m.nrefs; i++)
    if (memcmp(m.refs[i].data, back.refs[i].data, m.refs[i].numel * sizeof(float))) FAIL_("%s differs", m.refs[i].name);
  ASSERT(test_same_file(full, half));
  free(a);
  free(b);
  moe_optim_free(&opt);
  moe_model_free(&m);
  moe_model_free(&back);
  moe_dataset_free(&train);
  moe_dataset_free(&test);
}

TEST(dataset_hold_out_takes_the_last_samples) {
  moe_dataset train = {0}, test = {0}, val;
  ASSERT_OK(load(&train, &test));
  int n = train.n, F = train.rows * train.cols;
  ASSERT_STATUS(moe_dataset_hold_out(&train, n, &val), MOE_ERR_ARG);
  ASSERT_STATUS(moe_dataset_hold_out(&train, 0, &val), MOE_ERR_ARG);
  ASSERT_EQ_INT(train.n, n);
  ASSERT_OK(moe_dataset_hold_out(&train, 100, &val));
  ASSERT_EQ_INT(train.n, n - 100);
  ASSERT_EQ_INT(val.n, 100);
  ASSERT_EQ_INT(val.rows * val.cols, F);
  ASSERT(!memcmp(val.images, train.images + (size_t)(n - 100) * F, 100 * (size_t)F * sizeof(float)));
  ASSERT(!memcmp(val.labels, train.labels + n - 100, 100));
  ASSERT_STATUS(moe_model_accuracy(&(moe_model_t){0}, &val, 0, &(double){0}), MOE_ERR_ARG);
  moe_dataset_free(&val);
  moe_dataset_free(&train);
  moe_dataset_free(&test);
}

/* The public helpers of FlexMoE's checkpoints: the slots a resumed run takes by default (the file's
 * placement's E_v when as many ranks saved it, else E / W + 1; 0 for no file), and the placement text
 * refused for a model without replica slots. */
TEST(checkpoint_replica_slots_and_layout) {
  moe_dataset train = {0}, test = {0};
  ASSERT_OK(load(&train, &test));
  moe_model_t m = {0};
  ASSERT_OK(new_model(&m, &train)); /* E = 4 */
  char plain[512], placed[512], buf[256];
  test_tmp_path("slots_plain.safetensors", plain, sizeof plain);
  test_tmp_path("slots_placed.safetensors", placed, sizeof placed);
  moe_train_state ts = {.epoch = 1, .step = 1, .seed = 1};
  ASSERT_OK(moe_checkpoint_save(plain, &m, NULL, &ts));
  snprintf(ts.extra, sizeof ts.extra, "epochs=1;replicas=2x3:0,1,2,3,0,1");
  ASSERT_OK(moe_checkpoint_save(placed, &m, NULL, &ts));
  ASSERT_EQ_INT(moe_checkpoint_replica_slots(plain, 2), 3);
  ASSERT_EQ_INT(moe_checkpoint_replica_slots(plain, 4), 2);
  ASSERT_EQ_INT(moe_checkpoint_replica_slots(placed, 2), 3);
  ASSERT_EQ_INT(moe_checkpoint_replica_slots(placed, 4), 2); /* saved by 2 ranks: blocks again */
  snprintf(ts.extra, sizeof ts.extra, "epochs=1;replicas=2x5:0,1,2,3,-1,0,1,2,3,-1");
  ASSERT_OK(moe_checkpoint_save(placed, &m, NULL, &ts));
  ASSERT_EQ_INT(moe_checkpoint_replica_slots(placed, 2), 5);
  ASSERT_EQ_INT(moe_checkpoint_replica_slots("/nonexistent/ck.safetensors", 2), 0);
  ASSERT_STATUS(moe_flex_layout_write(&m, buf, sizeof buf), MOE_ERR_ARG);
  moe_model_free(&m);
  moe_dataset_free(&train);
  moe_dataset_free(&test);
}
