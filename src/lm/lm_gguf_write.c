/* The language model to a GGUF file as llama.cpp's convert_hf_to_gguf.py writes it: general.* and
 * {arch}.* keys, the tokenizer's tokenizer.ggml.* keys (tokenizer_gguf.c), every parameter under
 * llama.cpp's name (llama's q and k rows permuted per head; DeepSeek's latent attention as attn_q_a,
 * attn_q_a_norm, attn_q_b or attn_q, attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b whole, its selection bias
 * as exp_probs_b.bias; gpt-oss's sinks, router bias and expert stacks with their biases, which are its
 * layers' own tensors), each other MoE layer's experts stacked into
 * ffn_gate_exps / ffn_down_exps / ffn_up_exps (ne [D, H, E] and [H, D, E]). The weights take the asked
 * type by llama.cpp's rule of thumb (and moe quantize's): 1-D tensors, norms and routers stay F32; a
 * row whose length is not a multiple of the type's block falls back to Q8_0, or F16. Every tensor is
 * made at save (the writer's fill), a chunk of rows at a time: the file is written holding the model's
 * fp32 values and one chunk, and experts the model does not hold (moe_lm_convert's) are read then, one
 * expert's projection at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm/tokenizer_gguf.h"
#include "lm_family.h"
#include "lm_gguf.h"
#include "lm_gptoss.h"

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && !strcmp(s + n - k, tail);
}

static moe_gguf_type type_for(const char *name, int ndim, int64_t row, moe_gguf_type want) {
  if (ndim < 2 || ends_with(name, "_norm.weight") || strstr(name, ".ffn_gate_inp") || !ends_with(name, ".weight"))
    return MOE_GGUF_F32;
  if (row % moe_gguf_type_block(want) == 0) return want;
  return row % 32 == 0 ? MOE_GGUF_Q8_0 : MOE_GGUF_F16; /* as moe quantize */
}

/* What the save shares: the experts read from the checkpoint (NULL: none) and the fp32 buffer of one
 * expert's projection they are read into. */
typedef struct {
  moe__lm_expert_src *in;
  float *x;
  size_t most;
} stream;

/* One tensor's source: the fp32 values of a ref or of a layer's resident expert stack (rows permuted
 * per head for llama's q and k), or the reader's tensor t (lm_gguf.h) of layer `layer`'s experts, read
 * expert by expert. */
typedef struct {
  stream *s;
  const char *name; /* the writer's copy is the file's; this one for errors */
  char own[64];
  const float *x;   /* or NULL: read */
  int64_t rows, cols;
  int permute, layer, t;
  int64_t expert_rows; /* rows of one expert (a chunk of an expert stack) */
  moe_gguf_type type;
  size_t row_bytes;
} source;

/* The writer and its tensors' sources, kept until the file is saved. */
typedef struct {
  moe_gguf_writer *w;
  moe_gguf_type type;
  stream s;
  source **src;
  int n, cap;
} tensors;

#define CHUNK_VALUES ((int64_t)1 << 20) /* a dense tensor's values made at a time */

/* Rows [r0, r0 + n) of expert stack src (all of expert e's or within them) as fp32: the resident
 * values, or the expert's projection read into the shared buffer (layer's reader opened first). */
static moe_status expert_rows(source *src, int64_t r0, const float **x) {
  stream *s = src->s;
  int64_t e = r0 / src->expert_rows;
  if (src->x) {
    *x = src->x + r0 * src->cols;
    return MOE_OK;
  }
  MOE_CHECK(moe__lm_expert_src_read(s->in, src->layer, src->t, (int)e, s->x, src->name));
  *x = s->x + (r0 - e * src->expert_rows) * src->cols;
  return MOE_OK;
}

/* The writer's fill: the stored bytes [off, off + n) of src's tensor, whole rows, quantized row by row
 * (the bytes of the whole tensor quantized at once: blocks never straddle rows). */
static moe_status fill(void *ctx, size_t off, void *dst, size_t n) {
  source *src = ctx;
  int64_t r0 = (int64_t)(off / src->row_bytes), nr = (int64_t)(n / src->row_bytes);
  const float *x = src->x;
  if (src->expert_rows) MOE_CHECK(expert_rows(src, r0, &x));
  else x += r0 * src->cols;
  moe_status st = MOE_OK;
  for (int64_t r = 0; r < (src->permute ? nr : 1) && st == MOE_OK; r++) /* permuted: a row at a time */
    st = src->permute ? moe_gguf_quantize(src->type, src->x + moe__lm_gguf_hf_row(r0 + r, src->rows, src->permute) * src->cols,
                                          (uint8_t *)dst + r * src->row_bytes, src->cols)
                      : moe_gguf_quantize(src->type, x, dst, nr * src->cols);
  MOE_TRY(st == MOE_OK, st, "tensor '%s' as %s: %s", src->name, moe_gguf_type_name(src->type), moe_last_error());
  return MOE_OK;
}

/* Adds tensor name of ne (ndim dims; rows = the product of ne[1..]) from src (x, permute, and for an
 * expert stack layer, t and expert_rows set), in the type type_for gives it. */
static moe_status add(tensors *ts, const char *name, int ndim, const int64_t *ne, source src) {
  src.rows = 1, src.cols = ne[0];
  for (int d = 1; d < ndim; d++) src.rows *= ne[d];
  src.type = type_for(name, ndim, ne[0], ts->type);
  src.row_bytes = (size_t)(ne[0] / moe_gguf_type_block(src.type)) * moe_gguf_type_block_bytes(src.type);
  src.s = &ts->s;
  snprintf(src.own, sizeof src.own, "%s", name);
  if (ts->n == ts->cap) {
    int cap = ts->cap ? 2 * ts->cap : 64;
    source **b = realloc(ts->src, (size_t)cap * sizeof *b);
    MOE_TRY(b, MOE_ERR_NOMEM, "out of memory");
    ts->src = b, ts->cap = cap;
  }
  source *p = malloc(sizeof *p);
  MOE_TRY(p, MOE_ERR_NOMEM, "out of memory for tensor '%s'", name);
  *p = src;
  p->name = p->own;
  ts->src[ts->n++] = p;
  int64_t rows = src.expert_rows ? src.expert_rows : src.cols < CHUNK_VALUES ? CHUNK_VALUES / src.cols : 1;
  return moe_gguf_writer_add_tensor_fill(ts->w, name, src.type, ndim, ne, (size_t)rows * src.row_bytes, fill, p);
}

/* Ref r under its llama.cpp name (rows permuted for llama's q and k). */
static moe_status add_ref(tensors *ts, const moe_lm_t *m, const moe_tensor_ref *r) {
  char name[64];
  int expert, permute;
  MOE_TRY(moe__lm_gguf_name(&m->cfg, r->name, name, &expert, &permute), MOE_ERR_ARG, "no GGUF name for parameter '%s'",
          r->name);
  MOE_TRY(r->data || !r->numel, MOE_ERR_STATE, "moe_lm_save_gguf: parameter '%s' has no values (served by an expert "
          "cache)", r->name);
  /* ggml's order, the reverse of the ref's: gpt-oss's (E, H, D) expert stacks are [D, H, E] */
  int nd = r->ndim;
  int64_t ne[3] = {r->shape[nd - 1], nd > 1 ? r->shape[nd - 2] : 1, nd > 2 ? r->shape[0] : 1};
  return add(ts, name, nd, ne, (source){.x = r->data, .permute = permute});
}

/* Layer i's experts as llama.cpp stacks them, after the router (gpt-oss's: after its bias): the layer's
 * (E, H, D) fc1 and fc3 and (E, D, H) fc2 are already ggml's [D, H, E] and [H, D, E], gpt-oss's biases
 * (E, H) and (E, D) its [H, E] and [D, E]; read an expert at a time when the layer does not hold them. */
static moe_status add_experts(tensors *ts, const moe_lm_t *m, int i) {
  static const struct {
    const char *ours, *theirs;
    int t; /* the reader's tensor (lm_gguf.h) */
  } stacks[] = {{"experts.fc1.weight", "ffn_gate_exps.weight", 0}, {"experts.fc1.bias", "ffn_gate_exps.bias", 1},
                {"experts.fc3.weight", "ffn_up_exps.weight", 4},   {"experts.fc3.bias", "ffn_up_exps.bias", 5},
                {"experts.fc2.weight", "ffn_down_exps.weight", 2}, {"experts.fc2.bias", "ffn_down_exps.bias", 3}};
  static const int order[2][6] = {{0, 4, 2}, {0, 1, 2, 3, 4, 5}}; /* gate, down, up; gpt-oss's */
  int oss = m->cfg.family == MOE_LM_GPT_OSS;
  int64_t D = m->cfg.moe.D, H = m->cfg.moe.H, E = m->cfg.moe.E;
  for (int k = 0; k < (oss ? 6 : 3); k++) {
    int t = stacks[order[oss][k]].t, bias = t % 2;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s", i, stacks[order[oss][k]].theirs);
    int64_t ne[3] = {t == 2 || t == 1 || t == 5 ? H : D, bias ? E : t == 2 ? D : H, E};
    const float *x = moe_layer_param(&m->layers[i], stacks[order[oss][k]].ours);
    MOE_TRY(x || ts->s.in, MOE_ERR_STATE, "moe_lm_save_gguf: layer %d's experts are not parameters (streamed or "
            "bound): moe_lm_convert writes them from the checkpoint", i);
    MOE_CHECK(add(ts, name, 3 - bias, ne, (source){.x = x, .layer = i, .t = t, .expert_rows = bias ? 1 : ne[1]}));
  }
  size_t most = (size_t)(D * H) * sizeof(float);
  if (!moe_layer_param(&m->layers[i], stacks[0].ours) && most > ts->s.most) ts->s.most = most;
  return MOE_OK;
}

moe_status moe__lm_gguf_set_u32(moe_gguf_writer *w, const char *arch, const char *suffix, int v) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", arch, suffix);
  return moe_gguf_writer_set_u32(w, k, (uint32_t)v);
}

moe_status moe__lm_gguf_set_f32(moe_gguf_writer *w, const char *arch, const char *suffix, float v) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", arch, suffix);
  return moe_gguf_writer_set_f32(w, k, v);
}

static moe_status set_counts(moe_gguf_writer *w, const char *arch, const char *const *keys, const int *v, int n) {
  for (int i = 0; i < n; i++) MOE_CHECK(moe__lm_gguf_set_u32(w, arch, keys[i], v[i]));
  return MOE_OK;
}

/* The general.* and {arch}.* keys, in the converter's order (deepseek2's: lm_gguf_deepseek.c). */
static moe_status set_keys(moe_gguf_writer *w, const moe_lm_t *m, const moe_lm_gguf_options *o) {
  const moe_lm_config *c = &m->cfg;
  const char *arch = moe__lm_gguf_arch(c->family);
  char k[128];
  MOE_CHECK(moe_gguf_writer_set_str(w, "general.architecture", arch));
  MOE_CHECK(moe_gguf_writer_set_str(w, "general.type", "model"));
  MOE_CHECK(moe_gguf_writer_set_str(w, "general.name", o->name ? o->name : moe_lm_family_name(c->family)));
  int qwen = c->family == MOE_LM_QWEN2_MOE || c->family == MOE_LM_QWEN3_MOE, ds = moe__lm_gguf_is_deepseek(c->family);
  int ff = qwen || ds ? (c->dense_H ? c->dense_H : c->moe.H) : c->moe.H; /* gpt-oss: its intermediate_size */
  static const char *const common[] = {"block_count", "context_length", "embedding_length", "feed_forward_length",
                                       "attention.head_count", "attention.head_count_kv"};
  MOE_CHECK(set_counts(w, arch, common, (int[]){c->n_layers, c->max_seq, c->moe.D, ff, c->n_heads, c->n_kv_heads}, 6));
  snprintf(k, sizeof k, "%s.rope.freq_base", arch);
  MOE_CHECK(moe_gguf_writer_set_f32(w, k, c->rope_theta));
  snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
  MOE_CHECK(moe_gguf_writer_set_f32(w, k, c->rms_eps));
  if (ds) {
    snprintf(k, sizeof k, "%s.expert_used_count", arch);
    MOE_CHECK(moe_gguf_writer_set_u32(w, k, (uint32_t)c->moe.top_k));
    MOE_CHECK(moe_gguf_writer_set_u32(w, "general.file_type", (uint32_t)moe_gguf_file_type(o->type)));
    MOE_CHECK(moe__lm_gguf_write_deepseek(w, c));
    return moe_gguf_writer_set_u32(w, "general.quantization_version", 2);
  }
  static const char *const rest[] = {"expert_count", "expert_used_count", "attention.key_length",
                                     "attention.value_length"};
  MOE_CHECK(set_counts(w, arch, rest, (int[]){c->moe.E, c->moe.top_k, c->head_dim, c->head_dim}, 4));
  MOE_CHECK(moe_gguf_writer_set_u32(w, "general.file_type", (uint32_t)moe_gguf_file_type(o->type)));
  if (c->family == MOE_LM_GPT_OSS) { /* its gating is the softmax over the chosen: no expert_weights_norm */
    MOE_CHECK(moe__lm_gguf_write_gptoss(w, c));
    return moe_gguf_writer_set_u32(w, "general.quantization_version", 2);
  }
  if (c->family == MOE_LM_MIXTRAL) {
    static const char *const llama[] = {"vocab_size", "rope.dimension_count"};
    MOE_CHECK(set_counts(w, arch, llama, (int[]){c->vocab, c->head_dim}, 2));
  }
  if (qwen) {
    static const char *const ex[] = {"expert_feed_forward_length", "expert_shared_feed_forward_length"};
    MOE_CHECK(set_counts(w, arch, ex, (int[]){c->moe.H, c->moe.shared_H}, c->moe.shared_H ? 2 : 1));
  }
  if (c->clip_qkv > 0) {
    snprintf(k, sizeof k, "%s.attention.clamp_kqv", arch);
    MOE_CHECK(moe_gguf_writer_set_f32(w, k, c->clip_qkv));
  }
  int nt = c->moe.normalize_topk;
  snprintf(k, sizeof k, "%s.expert_weights_norm", arch);
  MOE_CHECK(moe_gguf_writer_set_bool(w, k, nt == 1 || (nt < 0 && c->moe.top_k > 1)));
  return moe_gguf_writer_set_u32(w, "general.quantization_version", 2);
}

moe_status moe__lm_save_gguf(const moe_lm_t *m, const char *path, const moe_lm_gguf_options *o,
                             moe__lm_expert_src *in) {
  MOE_TRY(m && m->st && path, MOE_ERR_ARG, "moe_lm_save_gguf: NULL argument");
  moe_lm_gguf_options def = {MOE_GGUF_F32, NULL, NULL};
  if (!o) o = &def;
  const moe_lm_config *c = &m->cfg;
  MOE_TRY(moe_gguf_type_supported(o->type), MOE_ERR_DTYPE, "moe_lm_save_gguf: type %d has no codec", (int)o->type);
  MOE_TRY(c->moe.expert_type <= 0, MOE_ERR_ARG,
          "moe_lm_save_gguf: %s: the experts (and the weights with kernels of their type) are %s bytes, not "
          "parameters (load with moe.expert_type -1 to save; "
          "moe quantize converts a GGUF file's types)", path, moe_gguf_type_name((moe_gguf_type)c->moe.expert_type));
  MOE_TRY(moe__lm_gguf_arch(c->family), MOE_ERR_ARG, "%s: the %s family has no GGUF architecture here (llama, "
          "qwen2moe, qwen3moe, olmoe, gpt-oss, deepseek2)", path, moe_lm_family_name(c->family));
  if (moe__lm_gguf_is_deepseek(c->family)) MOE_CHECK(moe__lm_gguf_check_deepseek(c, path));
  if (c->family == MOE_LM_GPT_OSS) MOE_CHECK(moe__lm_gguf_check_gptoss(c, path));
  MOE_TRY(moe_dist_size(c->moe.dist) <= 1, MOE_ERR_ARG,
          "moe_lm_save_gguf: the model is spread over ranks; save it from one process");
  MOE_TRY(!c->sliding_window || c->family == MOE_LM_GPT_OSS, MOE_ERR_ARG, "%s: a sliding window (%d) has no key in llama.cpp's %s architecture",
          path, c->sliding_window, moe__lm_gguf_arch(c->family));
  tensors ts = {.type = o->type, .s = {.in = in}};
  MOE_CHECK(moe_gguf_writer_new(&ts.w));
  moe_status st = set_keys(ts.w, m, o);
  if (st == MOE_OK && o->tokenizer) st = moe__tok_gguf_write(ts.w, o->tokenizer, c->vocab);
  int e, j;
  for (int k = 0; st == MOE_OK && k < m->nrefs; k++) {
    const moe_tensor_ref *r = &m->refs[k];
    if (moe__lm_expert_of(c->family, r->name, &e, &j) || moe__gptoss_converted(c->family, r->name) ||
        moe__gptoss_source(c, r->name))
      continue; /* the experts, stacked by add_experts */
    st = add_ref(&ts, m, r);
    int layer;
    if (st == MOE_OK && ends_with(r->name, c->family == MOE_LM_GPT_OSS ? ".mlp.router.bias" : ".gate.weight") &&
        sscanf(r->name, "model.layers.%d.", &layer) == 1)
      st = add_experts(&ts, m, layer); /* the router comes first, then the experts it routes to */
  }
  if (st == MOE_OK && ts.s.most && !(ts.s.x = malloc(ts.s.most)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory for an expert (%zu bytes)", path, ts.s.most);
  if (st == MOE_OK) st = moe_gguf_writer_save(ts.w, path);
  moe_gguf_writer_free(ts.w);
  if (in) moe__lm_expert_src_close(in);
  for (int i = 0; i < ts.n; i++) free(ts.src[i]);
  free(ts.src), free(ts.s.x);
  return st;
}

moe_status moe_lm_save_gguf(const moe_lm_t *m, const char *path, const moe_lm_gguf_options *o) {
  return moe__lm_save_gguf(m, path, o, NULL);
}
