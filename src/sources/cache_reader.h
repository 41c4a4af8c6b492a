/* An expert cache whose experts are read by the caller's reader rather than from one tensor per expert
 * or a stacked (E, ...) tensor of a file (sources/cache.c): for checkpoints that store experts in
 * another layout (gpt-oss's fused, interleaved or MXFP4 tensors, lm_gptoss.h), converted on each load
 * by the same code the resident loader converts them with. */
#ifndef MOE_SOURCES_CACHE_READER_H
#define MOE_SOURCES_CACHE_READER_H

#include "moe.h"

typedef struct {
  void *ctx;
  /* Expert e's tensors as fp32 into out[t], t in the cache's order fc1.weight (H, D), fc1.bias (H),
   * fc2.weight (D, H), fc2.bias (D), fc3.weight (H, D), fc3.bias (H), NULL where the layer has none;
   * every value finite, else an error naming the tensor. drop: drop the pages read from the page cache. */
  moe_status (*read)(void *ctx, int e, float *const out[6], int drop);
  void (*free)(void *ctx); /* ctx, when the cache is freed (also when opening it fails) */
  size_t file_bytes;       /* bytes one expert's read takes from the file */
  /* 0: read gives fp32 as above. Else the experts stay in these stored GGUF types (fc1, fc2, fc3; fc3 0
   * without a gated activation): read writes the file's bytes of each projection's rows (ggml's layout)
   * into out[0], out[2], out[4] (the slot's, typed float only by this signature) and checks what the
   * type allows, and the biases (gpt-oss's), where out[1], out[3], out[5] are not NULL, as fp32 as above;
   * the cache's experts compute from them with the quantized kernels (moe__qffn_forward). */
  moe_gguf_type type[3];
} moe__expert_reader;

/* moe_expert_cache_open with r in place of a file's tensors; the cache owns r.ctx from the call on. */
moe_status moe__expert_cache_open_reader(moe_expert_cache **out, const moe_layer_config *l, int K, moe_cache_policy p,
                                         const moe__expert_reader *r);

/* Bytes of a slot of layer l's cache over r into out (its stored types' bytes, or
 * moe_expert_cache_slot_bytes), or the error opening the cache would give for r's types. */
moe_status moe__expert_cache_reader_slot_bytes(const moe_layer_config *l, const moe__expert_reader *r, size_t *out);

/* Where a checkpoint's tensors are: one safetensors file, or the shards of an index (lm_shards.h), an
 * expert's tensors possibly in several. file_of: the file holding tensor `name` into *f, or NULL when
 * there is none and not `required` (required: an error naming the tensor, or the file that lacks it
 * later at moe_st_get); a file is opened on its first tensor, and an error opening it names it.
 * release (may be NULL): the holder's reference to ctx, dropped when the cache or reader is freed (also
 * when opening it fails). Files are looked up on the opening thread only; reads use the files found. */
typedef struct {
  void *ctx;
  moe_status (*file_of)(void *ctx, const char *name, int required, const moe_st **f);
  void (*release)(void *ctx);
} moe__st_files;

/* moe_expert_cache_open over the tensors of fs (each expert's, per expert or stacked, from whichever file
 * holds it); the cache takes fs's reference. */
moe_status moe__expert_cache_open_files(moe_expert_cache **out, const moe__st_files *fs, const char *prefix,
                                        const moe_layer_config *l, int K, moe_cache_policy p);

/* A reader over the experts under prefix in fs (the tensors moe_expert_cache_open reads, F32 or BF16, per
 * expert or stacked) giving fp32 values, without slots or a loader thread: each read reads the asked
 * tensors of one expert now, checked as a cache's loads are (moe_lm_convert). The reader takes fs's
 * reference. */
moe_status moe__expert_st_reader(const moe__st_files *fs, const char *prefix, const moe_layer_config *l,
                                 moe__expert_reader *out);

/* For tests: c's loader reads nothing until c's next forward has dropped the queued prefetches that
 * forward does not need, so which loads a prefetch and a forward cause does not depend on timing. */
void moe__expert_cache_hold_loads(moe_expert_cache *c);
/* For tests: c's mean read and window seconds fixed at these, no longer measured, so that which
 * predictions MOE_PREFETCH_AUTO reads does not depend on timing. */
void moe__expert_cache_set_costs(moe_expert_cache *c, double read_s, double window_s);
/* Whether a read ahead right with probability p pays (moe_expert_cache_set_prefetch's rule): p min(r, w)
 * > (1 - p) max(r - w, 0) for r = read_s, w = window_s, both measured (> 0). */
int moe__prefetch_pays(double p, double read_s, double window_s);

#endif
