/* The data the layer's stages pass to each other (DESIGN 3.1): the routing plan and its micro-batches,
 * the tokens placement runs over, the groups of rows the experts compute, and the dispatch's own
 * tensors. Data only: no functions, and nothing of the layer. */
#ifndef MOE_LAYER_PLAN_H
#define MOE_LAYER_PLAN_H

#include "moe.h"

/* One micro-batch of the experts' stage (MPipeMoE): groups [e0, e1), rows [lo, lo + rows) of all the
 * groups' rows (also where its activations sit when every micro-batch's are kept); keys [k0, k1) (see
 * micro.c: local experts, the same as the groups, or global experts under plan.gkey). */
typedef struct {
  int lo, rows;
  int e0, e1;
  int k0, k1;
  int32_t *goffs; /* (ng + 1) first row of each group in the micro-batch, from 0 (empty outside it) */
} moe__micro;
#define MOE__MAX_MICRO 64

/* The routing plan: where every assignment goes. Made by the router and the placement, read by every
 * later stage. Rows are expert-sorted: expert e's rows are [offs[e], offs[e + 1]) of the dispatch
 * buffers. The groups are what this process's experts compute: without expert parallelism the
 * dispatch rows themselves; expert-parallel, the rows received from every rank, expert-major. */
typedef struct {
  int T, k;              /* this process's tokens, slots per token */
  int C;                 /* capacity (static) or the largest count (dynamic) */
  int rows;              /* dispatch rows: kept assignments (dynamic) or the capacities' sum (static) */
  int dropped;           /* assignments dropped, over the placement's view of the tokens */
  int32_t *top_e;        /* (T, k) expert of each slot */
  float *top_w;          /* (T, k) its combine weight */
  int32_t *row;          /* (T, k) its dispatch row, -1 if dropped */
  int32_t *counts;       /* (E) this process's assignments per expert before dropping */
  const int32_t *stat_counts; /* (E) the counts the stats report (over all ranks, expert-parallel) */
  int32_t *kept;         /* (E) rows in use per expert (static: the rest of its slice is padding) */
  int32_t *offs;         /* (E + 1) first row of each expert */
  int32_t *cap;          /* (E) static: each expert's capacity in this forward */
  int ng, grows;         /* the groups: their number and rows */
  int32_t *goffs;        /* (ng + 1) first row of each group */
  const int32_t *gkey;   /* (ng) each group's global expert, ascending (the sharded layout's tasks), or
                          * NULL: group g is local expert g of every owner (micro.c cuts by these keys) */
  /* the experts' stage as n micro-batches (n = 1: the groups themselves) */
  int n, mb_rows;        /* micro-batches, the rows of the largest */
  int shared;            /* their activations (T_M) share one buffer (S3, S4), recomputed in backward */
  int slotted;           /* the moving transport's buffers (T_DI, T_DO) hold two micro-batches, and
                          * backward receives T_DI again (S2, S4): the experts' side of micro-batch i
                          * starts at row 0 of its buffers, not at its first row */
  moe__micro *mb;        /* (n) */
} moe__plan;

/* The tokens placement runs over: this process's, or all ranks' (static dispatch expert-parallel,
 * so that positions and drops are those of one process); tokens [t0, t0 + plan.T) are this rank's. */
typedef struct {
  int T, t0;
  const int32_t *top_e;  /* (T, k) */
  const float *score;    /* priority keys: score[t * stride] */
  int stride;
  const int32_t *counts; /* (E) assignments per expert over the view's ranks */
  int32_t *order;        /* (T) scratch */
} moe__view;

/* Rows of expert groups: group g is rows [offs[g], offs[g + 1]) of x (in) and y (out); kept, when
 * not NULL, the rows in use at the start of each group (the rest is static padding). A micro-batch's
 * groups are [e0, e1): the others have no rows in it. */
typedef struct {
  int n, rows;
  int e0, e1;
  const int32_t *offs, *kept;
  const float *x;
  float *y;
} moe__groups;

/* Static dispatch's dense (T, rows) tensors, kept from the forward to the backward: the dispatch mask
 * and the combine weights (none under dynamic dispatch). */
typedef struct {
  moe_dispatch kind;
  int D, threads;
  float *mask, *comb; /* (T, rows) static */
} moe__dispatch;

#endif
