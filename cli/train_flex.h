/* moe train --replicas auto: FlexMoE's replicas of hot experts (see train_flex.c). */
#ifndef MOE_TRAIN_FLEX_H
#define MOE_TRAIN_FLEX_H

#include <stdio.h>

#include "moe.h"

/* Starts the replica trainer (a collective) and prints its profile on f (rank 0's stdout). */
int flex_start(moe_flex_trainer **out, moe_model_t *m, float threshold, int horizon, int delta, const char *ops,
               FILE *f);
/* --slots' default: one spare slot per rank (E/W + 1); resuming, the checkpoint's E, and on as many
 * ranks as saved it the slots of its placement. */
int flex_default_slots(const char *resume, int E, int W);
/* The start-up profile as text: "expert tokens/s R:TPS ..." by rows R per expert, then the
 * all-to-all's and the all-reduce's latency and bandwidth. */
void flex_profile_text(const moe_flex_env *e, char *buf, size_t n);
void flex_report(const moe_flex_trainer *t, const moe_model_t *m, FILE *f, int json);

#endif
