/* FlexMoE wired into the layer (DESIGN 3.4): each layer's placement table and routing state
 * (flex/transport.c), read by the trainer that changes the placement (src/flex/train.c). */
#ifndef MOE_FLEX_WIRE_H
#define MOE_FLEX_WIRE_H

#include "flex/flex.h"
#include "layer/plugins.h"

extern const moe__transport moe__transport_flex; /* flex/transport.c: all-to-all-v over FlexMoE's replicas */

typedef struct moe__flex_comms moe__flex_comms; /* the replica groups' communicators (grads.c) */
void moe__flex_comms_free(moe__flex_comms *c);

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
  float *xr;                        /* (grows, D) receive staging, source-major */
  moe__flex_comms *comms;           /* for the placement they were made for; NULL: none yet */
} moe__flex_layer;

/* A layer's expert tensors (fc1 and fc2 weights and biases, fc3): each one's rows in the parameters,
 * the gradients and the optimizer's moments (NULL: none). */
#define MOE__FLEX_NREF 5
typedef struct {
  float *p[MOE__FLEX_NREF], *m[MOE__FLEX_NREF], *v[MOE__FLEX_NREF], *g[MOE__FLEX_NREF];
  size_t n[MOE__FLEX_NREF]; /* one row's floats */
  int nt;
} moe__flex_rows;
/* Block b's of a model, its moments in o (may be NULL); a layer's own, without moments. */
void moe__flex_rows_of(const moe_model_t *m, const moe_optim_t *o, int b, moe__flex_rows *r);
void moe__flex_rows_of_layer(moe_layer_t *l, moe__flex_rows *r);
/* l takes the placement `slots` (W x E_v, the same on every rank: a collective), the rows r of its
 * experts' state moving with it; *bytes grows by the bytes copied between ranks, all ranks' together. */
moe_status moe__flex_land(moe_layer_t *l, const moe__flex_rows *r, const int *slots, double *bytes);

/* One expert's parameters (its rows of the expert tensors), in floats. */
size_t moe__flex_expert_floats(const moe_layer_config *c);
/* The FlexMoE state of layer l (its transport's), or NULL when it has no replica slots. */
static inline moe__flex_layer *moe__flex_of(const moe_layer_t *l) { return moe__layer_transport(l, &moe__transport_flex); }

/* The row of this rank's expert tensors holding expert e, or -1 (transport.c); the replicas' gradients
 * summed over the ranks holding them (grads.c, moe_layer_reduce_grads). */
int moe__flex_row(const moe_layer_t *l, int e);
moe_status moe__flex_reduce_grads(moe_layer_t *l);

/* held and nh from the table's slots of this rank. */
void moe__flex_layer_sync_held(moe__flex_layer *f);

/* m's blocks take the placement of text s (from moe_flex_layout_write, moe.h) when it is for m's W and E_v;
 * another W or E_v leaves m's placement alone. MOE_ERR_FORMAT naming `what`
 * and the offending entry when s is malformed or a block's slots break the table's invariants. No
 * exchange: every rank reads the same text. */
moe_status moe__flex_layout_read(moe_model_t *m, const char *s, const char *what);

#endif
