/* FlexMoE wired into the layer (DESIGN 3.4): each layer's placement table and routing state
 * (ep_flex.c), read by the trainer that changes the placement (src/flex/train.c). */
#ifndef MOE_FLEX_WIRE_H
#define MOE_FLEX_WIRE_H

#include "flex/flex.h"
#include "layer_internal.h"

typedef struct moe__flex_layer {
  moe__flex_table t; /* the placement every rank holds alike */
  int W, me;
  int nh;            /* distinct experts this rank holds: row j of its expert tensors holds held[j] */
  int *held;         /* (E_v) ascending */
  int64_t *Isrc;     /* (W, E) the last forward's rows per rank and expert, all-gathered */
  int64_t *r;        /* (W, E, W) their routing (moe__flex_route) */
  double *gather;    /* (W E) the all-gather's buffer */
  int cnt[4 * MOE__FLEX_MAX_RANKS]; /* send counts, displacements, receive counts, displacements */
  int32_t *sperm, *rperm;           /* dispatch row -> send staging row; expert-major row -> receive staging row */
  float *sbuf;                      /* (rows, D) send staging, destination-major */
} moe__flex_layer;

/* One expert's parameters (its rows of the expert tensors), in floats. */
size_t moe__flex_expert_floats(const moe_layer_config *c);
/* held and nh from the table's slots of this rank. */
void moe__flex_layer_sync_held(moe__flex_layer *f);

#endif
