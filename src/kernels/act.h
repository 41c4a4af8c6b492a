/* The experts' activation functions over rows of the hidden layer, forward and backward. */
#ifndef MOE_ACT_H
#define MOE_ACT_H

#include <stddef.h>

#include "moe.h"

/* h[i] = act(a1[i]) for i < n; swiglu: silu(a1[i]) * a3[i]. */
void moe__act_forward(moe_act act, const float *a1, const float *a3, float *h, size_t n);
/* Backward through act at a1: dh[i] *= act'(a1[i]); swiglu: a3[i] becomes da3 = dh silu(a1), and dh
 * becomes dh a3 silu'(a1). */
void moe__act_backward(moe_act act, const float *a1, float *a3, float *dh, size_t n);

/* Whether act has an up projection (fc3): swiglu and swiglu_oai. */
static inline int moe__act_gated(moe_act act) { return act == MOE_ACT_SWIGLU || act == MOE_ACT_SWIGLU_OAI; }

/* swiglu_oai (moe.h): h[i] = (clamp(a3[i], -limit, limit) + 1) g sigmoid(alpha g), g = min(a1[i], limit). */
void moe__act_oai_forward(float alpha, float limit, const float *a1, const float *a3, float *h, size_t n);
/* Its backward as moe__act_backward's swiglu: a3 becomes da3, dh becomes da1; 0 where clamped. */
void moe__act_oai_backward(float alpha, float limit, const float *a1, float *a3, float *dh, size_t n);
/* The layer's activation of config c: the two above for swiglu_oai, else moe__act_forward / _backward. */
void moe__act_cfg_forward(const moe_layer_config *c, const float *a1, const float *a3, float *h, size_t n);
void moe__act_cfg_backward(const moe_layer_config *c, const float *a1, float *a3, float *dh, size_t n);

#endif
