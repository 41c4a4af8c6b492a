/* Dynamic per-expert capacities for moe train (see train_capacity.c). */
#ifndef MOE_TRAIN_CAPACITY_H
#define MOE_TRAIN_CAPACITY_H

#include <stdio.h>

#include "train_adjust.h"

typedef struct dyncap dyncap;
/* Every block starts at capacity_setting's C for batches of B tokens (rows of the layers); decisions
 * take effect delta steps late. */
int dyncap_start(dyncap **out, const train_blocks *b, int B, int delta, float headroom);
int dyncap_begin(dyncap *d, int64_t step); /* applies what is due at this step */
int dyncap_push(dyncap *d, int64_t step, double loss);
void dyncap_report(const dyncap *d, FILE *f);
void dyncap_free(dyncap *d);

#endif
