/* The language model under expert parallelism: lm_dist.c. */
#ifndef MOE_LM_DIST_H
#define MOE_LM_DIST_H

#include "moe.h"

/* moe_lm_save of a model over several ranks (a collective): every rank's experts gathered into the
 * one-process model, which rank 0 writes; the other ranks write nothing. */
moe_status moe__lm_save_ranks(const moe_lm_t *m, const char *dir);

/* Ref r of m in its whole (one-process) shape: *w is r with the whole shape and numel (data and grad
 * r's), and moe__lm_ref_local the index in r's data of whole element j, or -1 when another rank holds
 * it. Under Tutel's sharded layout (cfg.moe.parallel_r with dist, moe.h) an expert's w1 and w3 hold
 * this rank's rows [H q / W, H (q + 1) / W) of (H, D) and its w2 those columns of (D, H); every other
 * ref is whole on every rank that has it. */
void moe__lm_ref_whole(const moe_lm_t *m, const moe_tensor_ref *r, moe_tensor_ref *w);
long long moe__lm_ref_local(const moe_lm_t *m, const moe_tensor_ref *r, size_t j);

#endif
