/* The layer's stages that work on explicit data (DESIGN 3): each takes the configuration, the plan
 * (layer/plan.h) and its input and output buffers, and nothing of the layer's private state. */
#ifndef MOE_LAYER_STAGES_H
#define MOE_LAYER_STAGES_H

#include "base/arena.h"
#include "layer/plan.h"

/* placement.c: capacity and slot-major placement of the view's tokens (plan.counts: this process's
 * assignments per expert): fills the plan's C, cap, row, kept, offs, dropped and rows. ecap: DynaMoE's
 * per-expert capacities for ecap_tokens tokens, or NULL; fill (E) scratch; the priority order's keys
 * from the route arena. */
moe_status moe__place(const moe_layer_config *cfg, const int32_t *ecap, int ecap_tokens, const moe__view *v,
                      int32_t *fill, moe__arena *route, moe__plan *p);

/* micro.c: the experts' stage as n micro-batches, each a contiguous part of the groups' rows (one
 * destination: in process); route arena bytes for n micro-batches of at most ng groups and keys; the
 * plan's micro-batches (mb, n, mb_rows) from its groups, from the route arena. */
size_t moe__micro_bytes(int n, int ng);
moe_status moe__split_rows(const moe_layer_config *cfg, int n, moe__arena *route, moe__plan *p);

/* dispatch.c: moving tokens to dispatch rows and back, dynamic (gather/scatter) or static (mask GEMMs),
 * over the plan's rows. First, the workspace of a forward's dispatch and of the combine's backward. */
size_t moe__dispatch_bytes(const moe__plan *p, int D, moe_dispatch kind);
/* xs (rows, D) and d's tensors from the arena. */
moe_status moe__dispatch_alloc(const moe__plan *p, moe__dispatch *d, moe__arena *a, float **xs);
/* x (T, D) -> xs (rows, D) */
void moe__dispatch_forward(const moe__plan *p, const moe__dispatch *d, const float *x, float *xs);
/* out (rows, D) and the plan's weights -> y (T, D), and spec (T, k, D) when not NULL */
void moe__combine_forward(const moe__plan *p, const moe__dispatch *d, const float *out, float *y, float *spec);
/* dout (rows, D) and dw (T, k) from dy (T, D) and dspec (T, k, D, or NULL); static dispatch's
 * combine gradient from the arena. */
moe_status moe__combine_backward(const moe__plan *p, const moe__dispatch *d, moe__arena *work, const float *out,
                                  const float *dy, const float *dspec, float *dout, float *dw);
/* dx (T, D) = gradient through the dispatch of dxs (rows, D). */
void moe__dispatch_backward(const moe__plan *p, const moe__dispatch *d, const float *dxs, float *dx);

#endif
