/* A checkpoint to a GGUF file without its experts in memory (moe.h, moe_lm_convert_gguf): the model is
 * loaded with external experts (its dense weights fp32, no expert read), and moe_lm_save_gguf's writer
 * reads each expert stack's projections at save, one expert at a time, through the readers the
 * streamed experts use: a safetensors file's per-expert or stacked F32/BF16 tensors
 * (moe__expert_st_reader) or a GGUF file's stacks dequantized (moe__lm_gguf_expert_reader). Their
 * values are moe_lm_load's, so the file is moe_lm_save_gguf's of the loaded model byte for byte.
 * gpt-oss (its experts' biases are refs of the layer) and sharded checkpoints (a reader reads one
 * file) are loaded whole. */
#include <stdio.h>
#include <unistd.h>

#include "internal.h"
#include "lm_family.h"
#include "lm_gguf.h"

typedef struct {
  const moe_lm_t *m;
  const char *src;
  moe_st *file; /* a directory's model.safetensors, or NULL: src is a GGUF file */
} converter;

static moe_status open_experts(void *ctx, int layer, moe__expert_reader *out) {
  const converter *v = ctx;
  const moe_lm_config *c = &v->m->cfg;
  if (!v->file) return moe__lm_gguf_expert_reader(v->src, c, layer, out);
  char prefix[96];
  snprintf(prefix, sizeof prefix, "model.layers.%d.%s.experts.", layer, moe__lm_family(c->family)->ffn);
  return moe__expert_st_reader(v->file, prefix, &v->m->layers[layer].cfg, out);
}

moe_status moe_lm_convert_gguf(const char *src, const char *path, const moe_lm_gguf_options *o, size_t *numel) {
  MOE_TRY(src && path, MOE_ERR_ARG, "moe_lm_convert_gguf: NULL %s", src ? "path" : "source");
  moe_lm_config c;
  MOE_CHECK(moe_lm_read_config(src, &c));
  c.moe.expert_type = -1; /* every weight as fp32 values, which the writer quantizes */
  int gguf = moe__lm_gguf_is(src);
  char file[4096];
  snprintf(file, sizeof file, "%s/model.safetensors.index.json", src);
  int stream = c.family != MOE_LM_GPT_OSS && !c.moe.dist && (gguf || access(file, F_OK) != 0);
  c.moe.external_experts = stream;
  moe_lm_t m;
  MOE_CHECK(moe_lm_load(&m, src, &c));
  converter v = {&m, src, NULL};
  snprintf(file, sizeof file, "%s/model.safetensors", src);
  moe_status st = stream && !gguf ? moe_st_open_lazy(&v.file, file) : MOE_OK;
  if (st == MOE_OK) st = moe__lm_save_gguf(&m, path, o, stream ? open_experts : NULL, &v);
  if (st == MOE_OK && numel)
    *numel = m.numel + (stream ? (size_t)moe__lm_moe_layers(&c) * (size_t)c.moe.E * 3 * (size_t)c.moe.D * (size_t)c.moe.H : 0);
  moe_st_close(v.file);
  moe_lm_free(&m);
  return st;
}
