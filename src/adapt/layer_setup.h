/* The adaptive setup as the layer's policy (layer_setup.c, DESIGN 3.6): Tutel's dictionary of setups
 * (r, n, the all-to-all) and MPipeMoE's memory reuse choice. */
#ifndef MOE_ADAPT_LAYER_SETUP_H
#define MOE_ADAPT_LAYER_SETUP_H

#include "layer/plugins.h"

extern const moe__policy moe__policy_setup;
/* Whether l's step now tries a setup of its dictionary. */
int moe__layer_setup_trial(const moe_layer_t *l);

#endif
