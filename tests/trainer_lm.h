/* What the trainer's language-model tests share: a token stream to learn, and a run of moe_trainer over
 * moe_train_lm that logs each step's loss. */
#ifndef MOE_TEST_TRAINER_LM_H
#define MOE_TEST_TRAINER_LM_H

#include "moe.h"

/* ids (n) := tokens below vocab from seed, each a function of the one before, now and then not. */
void trainer_token_stream(int32_t *ids, int n, uint64_t seed, int vocab);

typedef struct {
  double loss[64]; /* by step (1-based) */
  int n;           /* steps logged */
} trainer_loss_log;

/* Steps until done on m (new, or resumed from the checkpoint dir resume) under base (its on_step
 * replaced by the log's) with the streams tr (ntr) and va (nva); m's parameters are the result. */
moe_status trainer_lm_run(moe_lm_t *m, const moe_trainer_config *base, const int32_t *tr, size_t ntr,
                          const int32_t *va, size_t nva, const char *resume, trainer_loss_log *log);

#endif
