/* A dense feed-forward network over N rows, forward and backward: the shared experts of MoE layers and
 * the dense layers of language models between their MoE layers.
 *   a1 = x W1^T, h = act(a1) (swiglu: silu(a1) * a3 with a3 = x W3^T), y = h W2^T (+ beta y)
 * W1, W3 (H, D), W2 (D, H); no biases. */
#ifndef MOE_MLP_H
#define MOE_MLP_H

#include "moe.h"

typedef struct {
  int D, H;
  moe_act act;
  float *w1, *w3, *w2; /* w3 NULL unless swiglu; as gradients, the same layout */
} moe__mlp;

/* What forward keeps for backward, N H floats each (a3 only for swiglu); backward reuses them. */
typedef struct {
  float *a1, *a3, *h;
} moe__mlp_acts;

/* Floats of the activations of N rows. */
size_t moe__mlp_act_floats(const moe__mlp *m, int N);
/* Carves the activations of N rows out of buf (moe__mlp_act_floats of them). */
moe__mlp_acts moe__mlp_acts_at(const moe__mlp *m, int N, float *buf);
/* y (N, D) = the network of x (N, D), plus beta y (beta 0 or 1). */
moe_status moe__mlp_forward(const moe__mlp *m, int N, const float *x, moe__mlp_acts *a, float beta, float *y,
                            int threads);
/* From dy (N, D): adds the weight gradients into g's tensors and the input gradient into dx (N, D).
 * Overwrites the activations. */
moe_status moe__mlp_backward(const moe__mlp *m, const moe__mlp *g, int N, const float *x, moe__mlp_acts *a,
                             const float *dy, float *dx, int threads);

#endif
