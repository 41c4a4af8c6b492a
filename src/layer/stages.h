/* The layer's stages that work on explicit data (DESIGN 3): each takes the configuration, the plan
 * (layer/plan.h) and its input and output buffers, and nothing of the layer's private state. */
#ifndef MOE_LAYER_STAGES_H
#define MOE_LAYER_STAGES_H

#include "base/arena.h"
#include "kernels/gemm.h"
#include "kernels/mlp.h"
#include "layer/plan.h"

#define MOE__MAX_GROUPS 64 /* group-limited selection: at most this many groups */

/* The layer's parameters (or their gradients: same layout) by tensor; NULL for tensors the layer lacks. */
typedef struct {
  float *gw, *gb;         /* gate.weight (E, D|P), gate.bias (E) */
  float *pw, *pb, *scale; /* gate.proj.weight (P, D), gate.proj.bias (P), gate.logit_scale (1) */
  float *w1, *b1;         /* experts.fc1 (E, H, D), (E, H) */
  float *w2, *b2;         /* experts.fc2 (E, D, H), (E, D) */
  float *w3, *b3;         /* experts.fc3 (E, H, D), (E, H) */
  float *sbias;           /* gate.select_bias (E) */
  float *sw1, *sw3, *sw2; /* shared.fc1 (Hs, D), shared.fc3 (Hs, D), shared.fc2 (D, Hs) */
  float *sg;              /* shared.gate.weight (1, D) */
} moe__weights;

/* router.c: the router's forward cache, kept for its backward. */
typedef struct {
  float *logits;    /* (T, E) */
  float *probs;     /* (T, E) */
  float *lse;       /* (T) logsumexp of the logits */
  float *proj;      /* (T, P) cosine: projected tokens, normalized in place */
  float *proj_norm; /* (T) */
  float *emb;       /* (E, P) cosine: normalized expert embeddings */
  float *emb_norm;  /* (E) */
  float *top_p;     /* (T, k) probability of each slot's expert */
  int32_t *fresh;   /* (T, k) the router's own top-k (differs from plan.top_e under caching) */
  float *choice;    /* (T, E) the values the top-k is chosen on, with a selection bias or groups */
  const float *sbias; /* (E) gate.select_bias, or NULL */
  int use_cache;    /* plan.top_e came from the layer's cached experts */
  int32_t *order;   /* (T) placement scratch */
  int32_t *fill;    /* (E) placement scratch */
  float *frac1;     /* (E) fraction of tokens whose top-1 is e */
  double *acc;      /* (chunks + 1, 2 E + 2) the losses' sums: total, then each router chunk's */
  double Tg;        /* tokens over all ranks */
  float aux, z;
  float *seq_f;     /* seq_aux_alpha > 0: (S, E) each sequence's f_i, for backward */
  int seq_n, seq_len; /* its S sequences of seq_len tokens */
  float seq_aux;    /* alpha times the loss */
} moe__router;

/* The router's rows for one forward, as side work (moe__gemm_run_side): the job is their context. */
typedef struct {
  const moe_layer_config *cfg;
  const moe__weights *w;
  const float *x; /* (T, D) the forward's input */
  moe__router *r;
  moe__plan *p;
} moe__router_job;
/* The forward is cut in three so that the router can run alongside the experts when the assignment is
 * known before it (sample-assignment caching): begin (the router's cache and the plan's arrays from the
 * route arena for T tokens and k slots; the cached experts, when not NULL, into plan.top_e), the rows in
 * fixed chunks of tokens (side work: x -> logits, probabilities, plan.top_e and plan.top_w, the chunks'
 * loss sums), and end (the losses from the chunks' sums, over all ranks). */
size_t moe__router_bytes(const moe_layer_config *cfg, int T, int k);
moe_status moe__router_begin(const moe_layer_config *cfg, const moe__weights *w, int T, int k, const int32_t *cached,
                             moe__arena *route, moe__router *r, moe__plan *p);
moe__side_work moe__router_work(moe__router_job *job);
/* The router's rows on their own, on `threads` threads. A single token's linear logits (a decode step)
 * are one product over all the threads, the gate's rows shared (moe__gemm_row: the same one-row kernel
 * as the chunk's, so the same bits): as one work item one thread read the whole gate while the others
 * waited (64 x 1024 floats a layer in a Qwen3-shaped model, 4.5% of its decode). */
moe_status moe__router_run(moe__router_job *job, int threads);
moe_status moe__router_end(const moe_layer_config *cfg, moe__router *r, const moe__plan *p);
/* dw (T, k): the gradient of the combine weights; adds the router's weight gradients to gw and its
 * input gradient to dx (T, D), from the forward's input x. */
moe_status moe__router_backward(const moe_layer_config *cfg, const moe__weights *w, const moe__weights *gw,
                                const float *x, const moe__router *r, const moe__plan *p, const float *dw,
                                float daux, float dz, moe__arena *route, int threads, float *dx);

/* shared.c: the shared experts. Workspace bytes of a forward and its backward for T tokens; the
 * forward adds their output to y, keeping in s what backward needs (from the arena); the backward adds
 * their weight gradients into gw and their input gradient into dx. */
typedef struct {
  moe__mlp_acts acts;
  float *out;  /* (T, D) the FFN's output, gated layers only */
  float *gate; /* (T) sigmoid(x . shared.gate.weight), gated layers only */
} moe__shared;
size_t moe__shared_bytes(const moe_layer_config *cfg, int T);
moe_status moe__shared_forward(const moe_layer_config *cfg, const moe__weights *w, const float *x, int T,
                               moe__arena *a, int threads, moe__shared *s, float *y);
moe_status moe__shared_backward(const moe_layer_config *cfg, const moe__weights *w, const moe__weights *gw,
                                const float *x, int T, moe__shared *s, const float *dy, moe__arena *a,
                                int threads, float *dx);

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
