/* The language model's hook for streamed experts (lm_stream.c): called before each MoE layer's
 * feed-forward with that layer's hidden state, so that the next MoE layer's experts can be predicted
 * and read ahead while this one computes. Set by moe_lm_load_streaming; lm_model.c calls it. */
#ifndef MOE_LM_STREAM_H
#define MOE_LM_STREAM_H

#include "moe.h"
#include "lm_shards.h"

/* h: (N, D) layer i's residual stream after its attention (the input of its post-attention norm). */
typedef moe_status (*moe__lm_layer_hook)(void *ctx, const moe_lm_t *m, int i, const float *h, int N, int nt);
void moe__lm_set_hook(moe_lm_t *m, moe__lm_layer_hook fn, void *ctx);
/* Layer i's expert cache of K slots (policy p) over the files (lm_shards.h: dir's model.safetensors or
 * the shards of its index; each layer's cache takes a reference), for layer config lc, into
 * x->caches[i]: the family's tensors per expert or stacked, or gpt-oss's fused tensors through its
 * reader (lm_gptoss.h), each from whichever shard holds it. */
moe_status moe__lm_open_cache(const moe_lm_t *m, moe_lm_experts *x, moe__lm_shards *files, int i,
                              const moe_layer_config *lc, int K, moe_cache_policy p);
/* The slots of each MoE layer (K[j] for the j-th, whose slots take slot[j] bytes) from s's budget and
 * placement (lm_stream_place.c), or an error saying the least budget that works. */
moe_status moe__lm_stream_slots(const moe_lm_t *m, const moe_lm_stream_config *s, const size_t *slot, int *K);
/* s's pinned experts (none without s->pin_trace) read into x's caches. */
moe_status moe__lm_stream_pin(const moe_lm_t *m, const moe_lm_stream_config *s, moe_lm_experts *x);
/* Frees moe_lm_load_streaming's predictor (moe_lm_experts_free). */
void moe__lm_prefetch_free(struct moe_lm_prefetch *p);

#endif
