/* The trainer's state, shared by its loop (trainer.c) and its files (trainer_state.c). */
#ifndef MOE_TRAIN_TRAINER_H
#define MOE_TRAIN_TRAINER_H

#include "train/adjust.h"

struct moe_trainer {
  moe_trainer_config cfg; /* warmup resolved */
  moe_train_model model;
  moe_optim_t opt;        /* opt.step: updates done (fewer than step when some were skipped) */
  int64_t step;           /* steps of the schedule done */
  int64_t last;           /* the last step of this run: stop_after, or steps */
  double train_s;         /* training seconds so far (rank 0's) */
  double best;            /* lowest validation loss so far */
  int64_t skipped;
  float *copy;            /* MOE_ON_NAN_SKIP: the parameters and Adam's state before an update */
  moe__dyncap *dc;        /* DynaMoE's adjustments (NULL: off) */
  moe__assign_cache *ac;
};

/* DIR/trainer_state.safetensors */
void moe__trainer_state_path(char *buf, size_t n, const char *dir);

#endif
