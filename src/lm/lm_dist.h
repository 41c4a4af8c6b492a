/* The language model under expert parallelism: lm_dist.c. */
#ifndef MOE_LM_DIST_H
#define MOE_LM_DIST_H

#include "moe.h"

/* moe_lm_save of a model over several ranks (a collective): every rank's experts gathered into the
 * one-process model, which rank 0 writes; the other ranks write nothing. */
moe_status moe__lm_save_ranks(const moe_lm_t *m, const char *dir);

#endif
