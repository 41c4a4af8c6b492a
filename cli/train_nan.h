/* moe train --on-nan: what a step that goes non-finite does (see train_nan.c). */
#ifndef MOE_TRAIN_NAN_H
#define MOE_TRAIN_NAN_H

#include "moe.h"

typedef struct {
  int skip;        /* --on-nan skip-step (else stop) */
  int64_t skipped; /* steps whose update was dropped */
  float *copy;     /* skip-step: the parameters and optimizer state before the update */
  int grads_zero;  /* the last step's update zeroed the gradients (moe_optim_step_checked) */
} nan_guard;
/* 0, or 1 when out of memory (moe_last_error unset: the caller says so). */
int nan_guard_init(nan_guard *g, int skip, const moe_model_t *m, const moe_optim_t *o);
void nan_guard_free(nan_guard *g);
/* One training step: forward, backward and the update at rate lr, then the parameters checked.
 * MOE_OK; MOE_ERR_VALUE when it went non-finite (skip-step: the update undone, counted); or any other
 * failure. */
moe_status nan_guard_step(nan_guard *g, moe_model_t *m, moe_optim_t *o, const float *x, const uint8_t *y, int B,
                          float lr, moe_model_stats *st);

#endif
