/* The language model in GGUF files (llama.cpp's architectures, keys and tensor names): lm_gguf.c reads
 * the config and the weights, lm_gguf_write.c writes them; both map the model's Hugging Face names to
 * llama.cpp's with moe__lm_gguf_name. */
#ifndef MOE_LM_GGUF_H
#define MOE_LM_GGUF_H

#include "kernels/quant_matmul.h"
#include "moe.h"
#include "sources/cache_reader.h"

/* Whether path names a GGUF file: it ends in ".gguf", or it is a regular file starting with "GGUF". */
int moe__lm_gguf_is(const char *path);

/* llama.cpp's architecture name of family f ("llama", "qwen2moe", "qwen3moe", "olmoe", "gpt-oss",
 * "deepseek2" for both DeepSeek families); NULL for a family without one. */
const char *moe__lm_gguf_arch(moe_lm_family f);
/* Whether llama.cpp's graph of f normalizes the top-k weights (its build_moe_ffn norm_w), the default
 * when a file has no {arch}.expert_weights_norm. */
int moe__lm_gguf_norm_default(moe_lm_family f);

/* Where the model's parameter `hf` (a moe_lm_t ref name) lives in a GGUF file: tensor `name` (room for
 * 64), as a slice `expert` (>= 0: the expert's rows of a stacked tensor of c->moe.E experts; -1: the
 * whole tensor), its rows permuted per head as llama.cpp's converter does for llama's q and k (permute:
 * the number of heads; 0: none). 0 when hf is no parameter libmoe knows. */
int moe__lm_gguf_name(const moe_lm_config *c, const char *hf, char *name, int *expert, int *permute);

/* Row r of a (rows) tensor permuted over `heads` heads holds this row of the Hugging Face one:
 * llama.cpp's permute interleaves each head's two rotary halves (rows i and i + head_dim / 2 of a head
 * become rows 2 i and 2 i + 1). */
int64_t moe__lm_gguf_hf_row(int64_t r, int64_t rows, int heads);

/* m keeps g open until moe_lm_free (lm_model.c): its layers' experts (and its weights in quantized
 * types) are bound into g's mapping. */
void moe__lm_keep_mapped(moe_lm_t *m, moe_gguf *g);
/* Whether parameter `name` of m can be computed in a quantized type (an attention projection (q, k
 * and v only together), a dense layer's MLP weight, the embedding, the head); and that binding: its
 * rows as bytes of type t (moe__qmat_fits for its row length) at w, which the model reads until
 * moe_lm_free, and frees own (NULL, or the bytes w points into) then. The ref's fp32 values are left
 * as they are (zero) and the model is inference-only. */
int moe__lm_quantizable(const moe_lm_t *m, const char *name);
/* The bytes parameter `name` is computed from, when bound; else NULL. */
const moe__qmat *moe__lm_quant_weight(const moe_lm_t *m, const char *name);
void moe__lm_bind_quant(moe_lm_t *m, const char *name, moe_gguf_type t, const void *w, void *own);

/* "{arch}.<suffix>" into buf (128 bytes); whether g has that key; a finite float there, positive (or
 * with positive 0 non-negative), *out left as it is when absent. */
const char *moe__lm_gguf_key(char *buf, const char *arch, const char *suffix);
int moe__lm_gguf_has(const moe_gguf *g, const char *arch, const char *suffix);
moe_status moe__lm_gguf_real(const moe_gguf *g, const char *arch, const char *suffix, int positive, float *out);
/* {arch}.rope.scaling.*: type none (absent too; *on 0, y untouched, no factor) or yarn (*on 1) with its
 * factor (>= 1) and original_context_length (absent: y's) into y; another type is an error naming it. */
moe_status moe__lm_gguf_read_yarn(const moe_gguf *g, const char *arch, moe_lm_yarn *y, int *on);
/* A positive count {arch}.<suffix>: required, or (when absent) *out left as it is. */
moe_status moe__lm_gguf_count(const moe_gguf *g, const char *arch, const char *suffix, int required, int *out);

/* Key {arch}.<suffix> set to v as a u32, or a f32 (lm_gguf_write.c). */
moe_status moe__lm_gguf_set_u32(moe_gguf_writer *w, const char *arch, const char *suffix, int v);
moe_status moe__lm_gguf_set_f32(moe_gguf_writer *w, const char *arch, const char *suffix, float v);

/* DeepSeek-V2/V3 as llama.cpp's deepseek2 (lm_gguf_deepseek.c). Whether f is one of them; its keys
 * beside the common ones into c (the latent attention, shared experts, leading dense layers, the
 * router, YaRN; c->family V3 for sigmoid scores, a selection bias, or renormalized weights scaled);
 * MOE_ERR_ARG naming the setting when c has one those keys cannot say (path names the file); its keys
 * after general.file_type, in the converter's order. */
int moe__lm_gguf_is_deepseek(moe_lm_family f);
moe_status moe__lm_gguf_read_deepseek(const moe_gguf *g, moe_lm_config *c);
moe_status moe__lm_gguf_check_deepseek(const moe_lm_config *c, const char *path);
moe_status moe__lm_gguf_write_deepseek(moe_gguf_writer *w, const moe_lm_config *c);

/* A GGUF file's descriptor, shared by the streamed layers' readers: opened once (one reference, the
 * opener's), closed when the last reference is released (each reader holds one until it is freed). */
typedef struct moe__lm_gguf_fd moe__lm_gguf_fd;
moe_status moe__lm_gguf_fd_open(moe__lm_gguf_fd **out, const char *path);
void moe__lm_gguf_fd_release(moe__lm_gguf_fd *f);
/* Layer `layer`'s routed experts of the GGUF file g (parsed once for every layer) for an expert cache
 * (lm_gguf_stream.c): expert e's rows of each stacked ffn_{gate,down,up}_exps tensor read with pread
 * from f (the reader takes a reference) and dequantized (any type with a codec, each projection its
 * own) as moe_lm_load reads them, or kept in their stored types (c->moe.expert_type > 0); with
 * c->moe.expert_bias the ffn_*_exps.bias rows too, as fp32; shapes checked against c at the call. */
moe_status moe__lm_gguf_expert_reader(const moe_gguf *g, moe__lm_gguf_fd *f, const moe_lm_config *c, int layer,
                                      moe__expert_reader *out);

/* The experts a save reads from the checkpoint when the model does not hold them (moe_lm_convert,
 * lm_convert.c): open(ctx, layer) opens a layer's reader (fp32 reads); one layer's is open at a time. */
typedef struct {
  moe_status (*open)(void *ctx, int layer, moe__expert_reader *out);
  void *ctx;
  moe__expert_reader rd;
  int layer;      /* rd's layer, or -1 */
  float *scratch; /* a read the save converts before writing it (gpt-oss's fused tensors), kept: one
                     allocation for the save, not one an expert */
  size_t scratch_n;
} moe__lm_expert_src;
/* Tensor t of layer's expert e (the reader's order: 0 fc1.weight (H, D), 1 fc1.bias (H), 2 fc2.weight
 * (D, H), 3 fc2.bias (D), 4 fc3.weight (H, D), 5 fc3.bias (H)) as fp32 into dst, the layer's reader
 * opened first (another's closed); an error names `what`, the tensor being written. */
moe_status moe__lm_expert_src_read(moe__lm_expert_src *s, int layer, int t, int e, float *dst, const char *what);
/* s's scratch of at least n floats (grown here), or NULL out of memory (the error set naming `what`). */
float *moe__lm_expert_src_scratch(moe__lm_expert_src *s, size_t n, const char *what);
/* The reader closed and the scratch freed. */
void moe__lm_expert_src_close(moe__lm_expert_src *s);
/* moe_lm_save_gguf and moe_lm_save, the experts of a MoE layer that m does not hold (external experts)
 * read from in at save, one expert's projection at a time (in NULL: m must hold them); in is closed after. */
moe_status moe__lm_save_gguf(const moe_lm_t *m, const char *path, const moe_lm_gguf_options *o, moe__lm_expert_src *in);
moe_status moe__lm_save_dir(const moe_lm_t *m, const char *dir, moe__lm_expert_src *in);

/* gpt-oss as llama.cpp's gpt-oss (lm_gguf_gptoss.c): its keys beside the common ones into c (the
 * family's options, the experts' width, the sliding window and its layer pattern, YaRN); MOE_ERR_ARG
 * naming the setting when c has one those keys cannot say (path names the file); its keys after
 * general.file_type. */
moe_status moe__lm_gguf_read_gptoss(const moe_gguf *g, moe_lm_config *c);
moe_status moe__lm_gguf_check_gptoss(const moe_lm_config *c, const char *path);
moe_status moe__lm_gguf_write_gptoss(moe_gguf_writer *w, const moe_lm_config *c);

/* moe_lm_read_config and moe_lm_load of a GGUF file. */
moe_status moe__lm_gguf_read_config(const char *path, moe_lm_config *c);
moe_status moe__lm_gguf_load(moe_lm_t *m, const char *path, const moe_lm_config *c);

#endif
