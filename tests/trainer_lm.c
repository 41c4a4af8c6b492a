/* The trainer's language-model test helpers (trainer_lm.h). */
#include "trainer_lm.h"

#include <stdlib.h>

void trainer_token_stream(int32_t *ids, int n, uint64_t seed, int vocab) {
  ids[0] = 1;
  for (int i = 1; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = (seed >> 60) ? (ids[i - 1] * 7 + 3) % vocab : (int32_t)((seed >> 33) % (uint64_t)vocab);
  }
}

static moe_status log_loss(void *ctx, const moe_train_step *s) {
  trainer_loss_log *l = ctx;
  if (s->step < 64) l->loss[s->step] = s->batch.loss;
  l->n++;
  return MOE_OK;
}

moe_status trainer_lm_run(moe_lm_t *m, const moe_trainer_config *base, const int32_t *tr, size_t ntr,
                          const int32_t *va, size_t nva, const char *resume, trainer_loss_log *log) {
  moe_trainer_config c = *base;
  c.on_step = log_loss;
  c.ctx = log;
  moe_train_model model;
  moe_trainer *t = NULL;
  moe_status st = moe_train_lm(&model, m, NULL, tr, ntr, va, nva, &c);
  if (st == MOE_OK) st = moe_trainer_new(&t, &c, &model);
  if (st == MOE_OK && resume) st = moe_trainer_resume(t, resume);
  while (st == MOE_OK && !moe_trainer_done(t)) st = moe_trainer_step(t, NULL);
  moe_trainer_free(t);
  return st;
}
