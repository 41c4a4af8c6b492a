/* The layer's private state: its two workspace arenas and the forward cache that backward reads.
 * Shared by layer.c (orchestration), gate.c, route.c, dispatch.c and experts.c. */
#ifndef MOE_LAYER_INTERNAL_H
#define MOE_LAYER_INTERNAL_H

#include "arena.h"
#include "gemm.h"
#include "moe.h"

/* Pointers into l->params (or l->grads: same layout); NULL for tensors the layer lacks. */
typedef struct {
  float *gw, *gb;         /* gate.weight (E, D|P), gate.bias (E) */
  float *pw, *pb, *scale; /* gate.proj.weight (P, D), gate.proj.bias (P), gate.logit_scale (1) */
  float *w1, *b1;         /* experts.fc1 (E, H, D), (E, H) */
  float *w2, *b2;         /* experts.fc2 (E, D, H), (E, D) */
  float *w3;              /* experts.fc3 (E, H, D) */
} moe__weights;

struct moe__layer_state {
  moe__arena route; /* router and routing tensors: sized from T, k, E, P */
  moe__arena work;  /* dispatch and expert tensors: sized after routing (rows, capacity) */
  int have_fwd;     /* a forward ran and backward has not consumed it yet */
  int threads;      /* resolved thread count */

  /* forward cache */
  const float *x;   /* (T, D), caller's */
  int T, k, C;      /* C: capacity (static) or largest count (dynamic) */
  int rows;         /* rows in the expert buffers: kept assignments (dynamic) or E*C (static) */
  float *logits;    /* (T, E) */
  float *probs;     /* (T, E) */
  float *lse;       /* (T) logsumexp of the logits */
  float *proj;      /* (T, P) cosine: projected tokens, normalized in place */
  float *proj_norm; /* (T) */
  float *emb;       /* (E, P) cosine: normalized expert embeddings */
  float *emb_norm;  /* (E) */
  int32_t *top_e;   /* (T, k) expert of slot j */
  int32_t *fresh;   /* (T, k) the router's own top-k (differs from top_e under caching) */
  int use_cache;    /* top_e came from the layer's cached experts */
  float *top_p;     /* (T, k) its probability */
  float *top_w;     /* (T, k) combine weight (normalized or not) */
  int32_t *row;     /* (T, k) row in the expert buffers, -1 if dropped */
  int32_t *counts;  /* (E) assignments per expert before dropping */
  int32_t *kept;    /* (E) rows per expert in the buffers */
  int32_t *offs;    /* (E + 1) first row of each expert */
  int32_t *order;   /* (T) token order for priority=score */
  int32_t *fill;    /* (E) scratch */
  int32_t *cap;     /* (E) static: each expert's capacity in this forward (C, or per-expert) */
  float *frac1;     /* (E) fraction of tokens whose top-1 is e */
  double *gate_acc; /* (chunks + 1, 2 E + 2) the losses' sums: total, then each router chunk's */
  moe__weights gate_w; /* the parameters, bound for the router's chunks */
  float aux, z;
  float inner_aux, inner_z; /* hierarchical: sums over the inner layers */
  int dropped;
  /* the expert groups that experts.c computes: this process's experts. Without expert parallelism
   * they alias the dispatch buffers (ng = E, goffs = offs, gx = xs, gout = out, grows = rows);
   * expert-parallel they hold the rows received from every rank, expert-major (ep.c). */
  int ng, grows;        /* groups, their rows */
  int32_t *goffs;       /* (ng + 1) */
  float *gx, *gout;     /* (grows, D) */
  /* expert parallelism (ep.c) */
  int32_t *gcounts;     /* (E) assignments per expert over all ranks (the stats) */
  double Tg;            /* tokens over all ranks */
  int t0, Tgi;          /* static: this rank's first token among all ranks', and their number */
  moe_comm_stats comm;  /* exchanges since the last reset */
  int *ex;              /* (4 W) send rows, send displs, recv rows, recv displs: the token exchange */
  int32_t *rc;          /* (W, E/W) rows from rank s for local expert e */
  int32_t *perm;        /* (grows) source-major row of each expert-major row */
  float *xr;            /* (grows, D) the exchange buffer, source-major */
  /* expert buffers, rows x ... */
  float *xs;        /* (rows, D) expert inputs */
  float *a1;        /* (rows, H) fc1 pre-activation */
  float *a3;        /* (rows, H) fc3 output (swiglu) */
  float *h;         /* (rows, H) activation */
  float *out;       /* (rows, D) expert outputs */
  moe__gemm *gemms; /* (3 E) the experts' GEMM list */
  /* bf16 experts (cfg.dtype): bf16 copies of the parameters (only the expert weights are filled),
   * refreshed before a forward after the parameters changed; and the bf16 inputs of the GEMMs */
  uint16_t *wbf;    /* (numel), at the parameters' offsets */
  int wbf_stale;
  uint16_t *xb;     /* (grows, D) expert inputs */
  uint16_t *hb;     /* (grows, H) activation; backward: da1 */
  uint16_t *db;     /* (grows, D) backward: dout */
  uint16_t *d3b;    /* (grows, H) swiglu backward: da3 */
  float *mask;      /* (T, E, C) static: dispatch mask */
  float *comb;      /* (T, E, C) static: combine weights */
};

void moe__weights_bind(const moe_layer_t *l, float *base, moe__weights *w);

/* gate.c: router, softmax, top-k, losses. The forward is cut in three so that the router can run
 * alongside the experts when the assignment is known before it (sample-assignment caching):
 * begin (workspace; the cached experts, read once, into top_e), the rows in fixed chunks of tokens
 * (side work, moe__gate_work), and end (the losses from the chunks' sums). */
size_t moe__gate_bytes(const moe_layer_t *l, int T, int k);
moe_status moe__gate_begin(moe_layer_t *l, const float *x, int T, int k);
moe__side_work moe__gate_work(moe_layer_t *l);
moe_status moe__gate_end(moe_layer_t *l);
/* dw (T, k): gradient of the combine weights. Adds router grads; dx += router contribution. */
moe_status moe__gate_backward(moe_layer_t *l, const float *dw, float daux, float dz, float *dx);

/* route.c: capacity and slot-major placement: fills counts, C, row, kept, offs, dropped. */
moe_status moe__route(moe_layer_t *l);

/* dispatch.c: moving tokens to expert rows and back, dynamic (gather/scatter) or static (mask GEMMs). */
size_t moe__dispatch_bytes(const moe_layer_t *l);
moe_status moe__dispatch_forward(moe_layer_t *l);
void moe__combine_forward(moe_layer_t *l, float *y, float *spec);
/* dout (rows, D) and dw (T, k) from dy and dspec. */
moe_status moe__combine_backward(moe_layer_t *l, const float *dy, const float *dspec, float *dout,
                                  float *dw);
/* dx (T, D) = gradient through the dispatch of dxs (rows, D). */
void moe__dispatch_backward(moe_layer_t *l, const float *dxs, float *dx);

/* experts.c: the FFNs over per-expert row groups. */
/* One expert's weights; the bf16 copies of the matrices are read instead when cfg.dtype is bf16. */
typedef struct {
  const float *w1, *b1, *w2, *b2, *w3;
  const uint16_t *w1h, *w2h, *w3h;
} moe__expert_w;
moe_status moe__experts_alloc(moe_layer_t *l);
/* Forward of groups [e0, e1), with expert e's weights at w[e]; side work (or NULL) runs alongside the
 * first GEMMs. */
moe_status moe__experts_compute(moe_layer_t *l, int e0, int e1, const moe__expert_w *w, const moe__side_work *side);
size_t moe__experts_bytes(const moe_layer_t *l, int rows);
moe_status moe__experts_forward(moe_layer_t *l, const moe__side_work *side);
/* dout (rows, D) -> dxs (rows, D); adds expert weight grads. Scratch from the work arena. */
moe_status moe__experts_backward(moe_layer_t *l, const float *dout, float *dxs);

/* hier.c: inner MoE layers as the experts (hierarchical MoE). */
moe_status moe__inner_forward(moe_layer_t *l);
moe_status moe__inner_backward(moe_layer_t *l, const float *dout, float daux, float dz, float *dxs);

/* ep.c: expert parallelism, over at most MOE__EP_MAX_RANKS ranks (per-rank bookkeeping on the stack;
 * moe_layer_init refuses more). After routing: the size exchange (per-expert counts to the experts'
 * owners), then the token exchange into expert-major groups; and the way back. */
size_t moe__ep_route_bytes(const moe_layer_t *l);
#define MOE__EP_MAX_RANKS 64
moe_status moe__ep_sizes(moe_layer_t *l);
size_t moe__ep_work_bytes(const moe_layer_t *l);
/* Allocates the exchange buffers (xr, gx, gout) and the expert-major permutation. */
moe_status moe__ep_plan(moe_layer_t *l);
/* Static dispatch: where this rank's tokens sit among all ranks' (t0, Tgi), before routing; the
 * routing workspace that the gathered routing needs; and the fixed-size exchanges of (E, C, D)
 * buffers: owners sum the ranks' buffers of their experts, and every rank gathers all outputs. */
moe_status moe__ep_static_view(moe_layer_t *l, int T);
size_t moe__ep_static_route_bytes(const moe_layer_t *l);
moe_status moe__ep_static_scatter(moe_layer_t *l, const float *rows, float *g);
moe_status moe__ep_static_gather(moe_layer_t *l, const float *g, float *rows);
/* rows (rows, D) local, expert-sorted -> g (grows, D) expert-major on the owners */
moe_status moe__ep_scatter(moe_layer_t *l, const float *rows, float *g);
/* g (grows, D) expert-major on the owners -> rows (rows, D) back where they came from; g is clobbered */
moe_status moe__ep_gather(moe_layer_t *l, float *g, float *rows);

/* serve/buffer.c: the experts' forward through the expert cache (expert buffering). */
moe_status moe__cache_forward(moe_layer_t *l);
/* Whether a cache was opened for this layer's shape (E, D, H, activation, biases, dtype). */
int moe__cache_fits(const moe_expert_cache *c, const moe_layer_config *l);

#endif
