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

#endif
