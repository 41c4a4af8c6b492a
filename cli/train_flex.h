/* moe train --replicas auto: FlexMoE's replicas of hot experts (see train_flex.c). */
#ifndef MOE_TRAIN_FLEX_H
#define MOE_TRAIN_FLEX_H

#include <stdio.h>

#include "moe.h"

/* Starts the replica trainer (a collective) and prints its profile on f (rank 0's stdout). */
int flex_start(moe_flex_trainer **out, moe_model_t *m, float threshold, int horizon, int delta, const char *ops,
               FILE *f);
void flex_report(const moe_flex_trainer *t, const moe_model_t *m, FILE *f, int json);

#endif
