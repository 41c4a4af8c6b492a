/* The language model under expert parallelism: lm_dist.c. */
#ifndef MOE_LM_DIST_H
#define MOE_LM_DIST_H

#include "moe.h"

/* moe_lm_save of a model over several ranks (a collective): every rank's experts gathered into the
 * one-process model, which rank 0 writes; the other ranks write nothing. */
moe_status moe__lm_save_ranks(const moe_lm_t *m, const char *dir);

/* Ref r of m as a part of its whole (one-process) tensor: `whole` is r with the whole shape and numel
 * (data and grad r's), and r's data is `runs` runs of `len` floats, run i at i len in r's data and at
 * first + i stride in the whole tensor. Under Tutel's sharded layout (cfg.moe.parallel_r with dist,
 * moe.h) an expert's w1 and w3 hold this rank's rows [H q / W, H (q + 1) / W) of (H, D) (one run) and
 * its w2 those columns of (D, H) (D runs); every other ref is one run of all of it. */
typedef struct {
  moe_tensor_ref whole;
  size_t runs, len, first, stride;
} moe__lm_part;
void moe__lm_part_of(const moe_lm_t *m, const moe_tensor_ref *r, moe__lm_part *p);
/* Copies the part's runs from a whole tensor to r's layout, or back (to_whole). */
void moe__lm_part_copy(const moe__lm_part *p, const float *src, float *dst, int to_whole);

#endif
