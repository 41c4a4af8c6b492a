/* Double-precision evaluations of a layer's parts from its parameters, for the tests' references:
 * the linear router's softmax, and one expert's FFN. */
#ifndef MOE_TEST_LAYER_REF_H
#define MOE_TEST_LAYER_REF_H

#include "moe.h"

/* p (E) = softmax of the linear router's logits (with gate.bias when the layer has it) for token x
 * (D); returns the logsumexp of the logits. */
double ref_gate_softmax(moe_layer_t *l, const float *x, double *p);

/* out (D) = expert e's output for token x (D): fc1, the layer's activation (relu, gelu or silu;
 * swiglu is not covered), fc2, with the biases when the layer has them. */
void ref_expert(moe_layer_t *l, int e, const float *x, double *out);

#endif
