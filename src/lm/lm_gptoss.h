/* gpt-oss's checkpoint layout (moe.h, MOE_LM_GPT_OSS): its experts are fused tensors,
 *   mlp.experts.gate_up_proj (E, D, 2H), gate in the even columns and up in the odd ones (x @ W, the
 *     transpose of nn.Linear's weight), gate_up_proj_bias (E, 2H) interleaved alike,
 *   mlp.experts.down_proj (E, H, D) (h @ W),
 * or their MXFP4 forms gate_up_proj_blocks (E, 2H, D / 32, 16) with _scales (E, 2H, D / 32) and
 * down_proj_blocks (E, D, H / 32, 16) with _scales (E, D, H / 32), which dequantize to the transposes
 * (transformers' integrations/mxfp4.py). The model holds them as its MoE layers' tensors, under the
 * names mlp.experts.fc1.weight / fc1.bias (gate), fc3.weight / fc3.bias (up) and fc2.weight: these refs
 * are converted on load and save (lm_io.c asks here). */
#ifndef MOE_LM_GPTOSS_H
#define MOE_LM_GPTOSS_H

#include "lm_gguf.h"
#include "moe.h"
#include "sources/cache_reader.h"

/* A checkpoint's tensors as lm_io.c reads them: the file holding a tensor (MOE_ERR_MISSING naming it
 * when none does), and a read into r (r's shape checked; F32, BF16 or F16 to fp32; finite). */
typedef struct {
  void *ctx;
  moe_status (*file_of)(void *ctx, const char *name, moe_st **f);
  moe_status (*read)(const moe_st *f, const moe_tensor_ref *r);
} moe__lm_reader;

/* Values [off, off + n) of tensor v of f into dst as fp32 (F32, BF16 or F16), each finite (lm_io.c). */
moe_status moe__lm_read_values(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n, float *dst);

/* Whether ref `name` of a model of family f is held in the layer's layout (converted on load and save). */
int moe__gptoss_converted(moe_lm_family f, const char *name);
/* Reads converted ref r of m from its checkpoint tensor (or that tensor's MXFP4 blocks and scales). */
moe_status moe__gptoss_read_ref(const moe__lm_reader *rd, const moe_lm_t *m, const moe_tensor_ref *r);
/* Adds converted ref r's checkpoint tensor to w: fc1.weight's gate_up_proj (with fc3.weight's columns),
 * fc1.bias's gate_up_proj_bias (with fc3.bias's), fc2.weight's down_proj; nothing for fc3's. */
moe_status moe__gptoss_write_ref(const moe_lm_t *m, const moe_tensor_ref *r, moe_st_writer *w);
/* Whether `name` is a checkpoint tensor of a gpt-oss model c's experts: one the converted refs are read
 * from, or down_proj_bias (a ref itself, unless the experts are external). */
int moe__gptoss_source(const moe_lm_config *c, const char *name);
/* num_local_experts, hidden_size and intermediate_size of c against layer i's gate_up_proj (or its
 * blocks), before anything of their size is allocated: MOE_ERR_SHAPE naming dir's config.json. */
moe_status moe__gptoss_check_sizes(const moe__lm_reader *rd, const char *dir, const moe_lm_config *c, int i);
/* Layer i's experts of a gpt-oss model c read one at a time from fs (the checkpoint's model.safetensors,
 * or the shards of its index: each fused tensor from the shard that holds it, found here; the reader
 * takes fs's reference, also on an error) for an expert cache (streamed or buffered experts) or a
 * conversion: expert e's slabs of the fused tensors (or of their MXFP4 blocks and scales; the leading
 * dimension is the expert) converted by the code moe__gptoss_read_ref converts all of them with, so that
 * the slots hold the resident model's values; an out[t] NULL is not read. */
moe_status moe__gptoss_expert_reader(const moe__st_files *fs, const moe_lm_config *c, int i, moe__expert_reader *r);

/* The checkpoint tensors moe_lm_save writes for layer i's experts, in its order: k 0 gate_up_proj
 * (E, D, 2H), 1 gate_up_proj_bias (E, 2H), 2 down_proj (E, H, D), 3 down_proj_bias (E, D); the k-th's
 * name and shape into name (n bytes) and shape, its dimensions returned (0: no k-th). */
int moe__gptoss_fused(const moe_lm_config *c, int i, int k, char *name, size_t n, int64_t shape[3]);
/* Expert e's slab of the k-th into dst (fp32, the checkpoint's layout) from its converted tensors read
 * from in, where the model does not hold them (moe_lm_convert's save); an error names `what`. */
moe_status moe__gptoss_fused_read(const moe_lm_config *c, int i, int k, moe__lm_expert_src *in, int e, float *dst,
                                  const char *what);

#endif
