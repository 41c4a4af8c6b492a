/* The language model from a GGUF file as llama.cpp's converter writes it (convert_hf_to_gguf.py):
 * general.architecture llama (with experts: Mixtral), qwen2moe, qwen3moe, olmoe, gpt-oss (its keys:
 * lm_gguf_gptoss.c) or deepseek2 (its keys: lm_gguf_deepseek.c), the {arch}.* keys,
 * tensors by llama.cpp's names (lm_gguf_names.c) with the experts stacked in 3-D tensors and llama's q
 * and k rows permuted per head. The experts stay in their stored type when the layer has kernels for it
 * (moe_layer_bind_experts into the mapped file), and so do the attention's projections, the dense
 * layers' MLPs, the embedding and the head when their types have kernels (moe__lm_bind_quant); every
 * other weight is dequantized into the fp32 model (all of them with moe.expert_type -1); each is checked against the config for its shape (ggml's order, ne[0] the row length) first. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "internal.h"
#include "lm_dist.h"
#include "lm_family.h"
#include "lm_gguf.h"
#include "lm_map.h"
#include "kernels/quant_matmul.h"

int moe__lm_gguf_is(const char *path) {
  size_t n = path ? strlen(path) : 0;
  if (n >= 5 && !strcmp(path + n - 5, ".gguf")) return 1;
  struct stat sb;
  if (!path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  char magic[4] = {0};
  int ok = fd >= 0 && read(fd, magic, 4) == 4 && !memcmp(magic, "GGUF", 4);
  if (fd >= 0) close(fd);
  return ok;
}

const char *moe__lm_gguf_key(char *buf, const char *arch, const char *suffix) {
  snprintf(buf, 128, "%s.%s", arch, suffix);
  return buf;
}

int moe__lm_gguf_has(const moe_gguf *g, const char *arch, const char *suffix) {
  char k[128];
  return moe_gguf_find_key(g, moe__lm_gguf_key(k, arch, suffix)) >= 0;
}

moe_status moe__lm_gguf_count(const moe_gguf *g, const char *arch, const char *suffix, int required, int *out) {
  char k[128];
  moe__lm_gguf_key(k, arch, suffix);
  if (!required && moe_gguf_find_key(g, k) < 0) return MOE_OK;
  uint32_t v;
  MOE_CHECK(moe_gguf_get_u32(g, k, &v));
  MOE_TRY(v > 0 && v <= INT32_MAX, MOE_ERR_FORMAT, "%s: %s is %u, want a positive count", moe_gguf_path(g), k, v);
  *out = (int)v;
  return MOE_OK;
}

moe_status moe__lm_gguf_real(const moe_gguf *g, const char *arch, const char *suffix, int positive, float *out) {
  char k[128];
  if (moe_gguf_find_key(g, moe__lm_gguf_key(k, arch, suffix)) < 0) return MOE_OK;
  MOE_CHECK(moe_gguf_get_f32(g, k, out));
  MOE_TRY(isfinite(*out) && (positive ? *out > 0 : *out >= 0), MOE_ERR_FORMAT, "%s: %s is %g, want a %s number",
          moe_gguf_path(g), k, (double)*out, positive ? "positive" : "non-negative");
  return MOE_OK;
}

moe_status moe__lm_gguf_read_yarn(const moe_gguf *g, const char *arch, moe_lm_yarn *y, int *on) {
  const char *path = moe_gguf_path(g), *type = "none";
  char k[128];
  *on = 0;
  if (moe__lm_gguf_has(g, arch, "rope.scaling.type"))
    MOE_CHECK(moe_gguf_get_str(g, moe__lm_gguf_key(k, arch, "rope.scaling.type"), &type));
  int yarn = !strcmp(type, "yarn"), factor = moe__lm_gguf_has(g, arch, "rope.scaling.factor");
  MOE_TRY(yarn || !strcmp(type, "none"), MOE_ERR_FORMAT, "%s: %s.rope.scaling.type \"%s\" is not supported (none or "
          "yarn)", path, arch, type);
  MOE_TRY(yarn || !factor, MOE_ERR_FORMAT, "%s: %s.rope.scaling.factor without %s.rope.scaling.type yarn is not "
          "supported", path, arch, arch);
  if (!yarn) return MOE_OK;
  MOE_TRY(factor, MOE_ERR_MISSING, "%s: yarn without %s.rope.scaling.factor", path, arch);
  MOE_CHECK(moe__lm_gguf_real(g, arch, "rope.scaling.factor", 1, &y->factor));
  MOE_TRY(y->factor >= 1, MOE_ERR_FORMAT, "%s: %s.rope.scaling.factor is %g, want >= 1", path, arch, (double)y->factor);
  MOE_CHECK(moe__lm_gguf_count(g, arch, "rope.scaling.original_context_length", 0, &y->original_max_pos));
  *on = 1;
  return MOE_OK;
}

static int has_tensor(const moe_gguf *g, const char *fmt, int layer) {
  char name[64];
  snprintf(name, sizeof name, fmt, layer);
  return moe_gguf_has_tensor(g, name);
}

/* Keys that change what the model computes but that libmoe does not implement: refused by name (but
 * where the family's own reader takes them: deepseek2's and gpt-oss's). */
static moe_status refuse_keys(const moe_gguf *g, const char *arch, const moe_lm_config *c) {
  char k[128];
  enum { DS = 1, OSS = 2 };
  static const struct {
    const char *suffix;
    int read_by;
  } unsupported[] = {{"attention.sliding_window", OSS},       {"attention.sliding_window_pattern", OSS},
                     {"rope.freq_base_swa", OSS},             {"attn_logit_softcapping", 0},
                     {"final_logit_softcapping", 0},          {"logit_scale", 0},
                     {"embedding_scale", 0},                  {"residual_scale", 0},
                     {"rope.scaling.factor", DS | OSS},       {"expert_shared_count", DS},
                     {"leading_dense_block_count", DS},       {"expert_weights_scale", DS}};
  int ds = moe__lm_gguf_is_deepseek(c->family), oss = c->family == MOE_LM_GPT_OSS, who = ds ? DS : oss ? OSS : 0;
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
    MOE_TRY((unsupported[i].read_by & who) || moe_gguf_find_key(g, moe__lm_gguf_key(k, arch, unsupported[i].suffix)) < 0,
            MOE_ERR_FORMAT, "%s: %s is not supported for %s", moe_gguf_path(g), k, arch);
  if (ds) return MOE_OK; /* its rope, value length and gating: moe__lm_gguf_read_deepseek */
  const char *s;
  if (!oss && moe_gguf_find_key(g, moe__lm_gguf_key(k, arch, "rope.scaling.type")) >= 0) { /* gpt-oss's: its reader */
    MOE_CHECK(moe_gguf_get_str(g, k, &s));
    MOE_TRY(!strcmp(s, "none"), MOE_ERR_FORMAT, "%s: %s \"%s\" is not supported (only none)", moe_gguf_path(g), k, s);
  }
  int rope_dim = c->head_dim, v_len = c->head_dim;
  MOE_CHECK(moe__lm_gguf_count(g, arch, "rope.dimension_count", 0, &rope_dim));
  MOE_TRY(rope_dim == c->head_dim, MOE_ERR_FORMAT, "%s: %s.rope.dimension_count %d is not the head size %d (partial "
          "rotary embeddings are not supported)", moe_gguf_path(g), arch, rope_dim, c->head_dim);
  MOE_CHECK(moe__lm_gguf_count(g, arch, "attention.value_length", 0, &v_len));
  MOE_TRY(v_len == c->head_dim, MOE_ERR_FORMAT, "%s: %s.attention.value_length %d is not key_length %d",
          moe_gguf_path(g), arch, v_len, c->head_dim);
  if (moe_gguf_find_key(g, moe__lm_gguf_key(k, arch, "expert_gating_func")) >= 0) {
    uint32_t f;
    MOE_CHECK(moe_gguf_get_u32(g, k, &f));
    MOE_TRY(f == 1, MOE_ERR_FORMAT, "%s: %s %u is not supported (only 1, softmax)", moe_gguf_path(g), k, f);
  }
  return MOE_OK;
}

/* The family's keys beside the common ones: the experts' width, dense layers, shared expert, norms. */
static moe_status read_family(const moe_gguf *g, const char *arch, moe_lm_config *c) {
  int ff = 0;
  MOE_CHECK(moe__lm_gguf_count(g, arch, "feed_forward_length", 0, &ff));
  if (c->family == MOE_LM_MIXTRAL || c->family == MOE_LM_OLMOE) {
    char k[128];
    MOE_TRY(ff > 0, MOE_ERR_MISSING, "%s: no %s (the experts' width)", moe_gguf_path(g),
            moe__lm_gguf_key(k, arch, "feed_forward_length"));
    c->moe.H = ff;
  } else {
    MOE_CHECK(moe__lm_gguf_count(g, arch, "expert_feed_forward_length", 1, &c->moe.H));
  }
  if (c->family == MOE_LM_OLMOE) {
    c->qk_norm = MOE_QK_NORM_FULL;
    MOE_CHECK(moe__lm_gguf_real(g, arch, "attention.clamp_kqv", 1, &c->clip_qkv)); /* absent: none */
  }
  if (c->family == MOE_LM_QWEN3_MOE) c->qk_norm = MOE_QK_NORM_HEAD;
  if (c->family == MOE_LM_QWEN2_MOE || c->family == MOE_LM_QWEN3_MOE) {
    /* a layer with a dense feed-forward (blk.N.ffn_gate) and no router is a dense layer */
    int any = 0;
    for (int i = 0; i < c->n_layers; i++)
      if (!has_tensor(g, "blk.%d.ffn_gate_inp.weight", i) && has_tensor(g, "blk.%d.ffn_gate.weight", i)) {
        c->dense_layers[i / 8] |= (uint8_t)(1u << (i % 8));
        any = 1;
      }
    if (any) {
      char k[128];
      MOE_TRY(ff > 0, MOE_ERR_MISSING, "%s: no %s (the dense layers' width)", moe_gguf_path(g),
              moe__lm_gguf_key(k, arch, "feed_forward_length"));
      c->dense_H = ff;
    }
  }
  if (c->family == MOE_LM_QWEN2_MOE) {
    c->qkv_bias = has_tensor(g, "blk.%d.attn_q.bias", 0);
    MOE_CHECK(moe__lm_gguf_count(g, arch, "expert_shared_feed_forward_length", 0, &c->moe.shared_H));
    c->moe.shared_gate = c->moe.shared_H > 0;
  }
  c->moe.normalize_topk = moe__lm_gguf_norm_default(c->family);
  char k[128];
  if (moe__lm_gguf_has(g, arch, "expert_weights_norm"))
    MOE_CHECK(moe_gguf_get_bool(g, moe__lm_gguf_key(k, arch, "expert_weights_norm"), &c->moe.normalize_topk));
  return MOE_OK;
}

/* When every MoE layer's three expert stacks are of types with kernels whose rows (D long for the gate
 * and up stacks, H for the down one) are whole blocks (one type, or a mix such as llama.cpp's _M files
 * make: Q4_K gates beside Q6_K down projections, or a Q8_0 down projection where H is not a multiple of
 * 256), the first gate stack's type: the experts then stay in their types (bound, DESIGN
 * 4.8b); else -1 (dequantized). */
static int experts_type(const moe_gguf *g, const moe_lm_config *c) {
  static const char *const stacks[3] = {"gate", "up", "down"};
  int first = -1;
  for (int i = 0; i < c->n_layers; i++)
    for (int j = 0; j < 3 && !moe_lm_layer_dense(c, i); j++) {
      char name[64];
      moe_gguf_tensor t;
      snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", i, stacks[j]);
      if (moe_gguf_tensor_get(g, name, &t) != MOE_OK || !moe__qdot_has(t.type)) return -1;
      if ((j < 2 ? c->moe.D : c->moe.H) % moe_gguf_type_block(t.type)) return -1; /* rows of whole blocks */
      if (first < 0) first = (int)t.type;
    }
  return first;
}

static moe_status read_config(const moe_gguf *g, moe_lm_config *c) {
  const char *path = moe_gguf_path(g), *arch;
  MOE_CHECK(moe_gguf_get_str(g, "general.architecture", &arch));
  int family = -1;
  for (int f = MOE_LM_DEEPSEEK_V3; f >= 0; f--) /* deepseek2: V2 until its keys say V3 */
    if (moe__lm_gguf_arch(f) && !strcmp(arch, moe__lm_gguf_arch(f))) family = f;
  MOE_TRY(family >= 0, MOE_ERR_FORMAT, "%s: general.architecture \"%s\" is not a language model libmoe runs (llama "
          "with experts, qwen2moe, qwen3moe, olmoe, gpt-oss, deepseek2)", path, arch);
  moe_lm_config_default(c);
  c->family = family;
  c->aux_coef = 0; /* a training setting GGUF files do not carry */
  c->tie_embeddings = 0;
  MOE_CHECK(moe__lm_gguf_count(g, arch, "block_count", 1, &c->n_layers));
  MOE_TRY(c->n_layers <= MOE_LM_MAX_LAYERS, MOE_ERR_FORMAT, "%s: %s.block_count %d is more than %d", path, arch,
          c->n_layers, MOE_LM_MAX_LAYERS);
  MOE_CHECK(moe__lm_gguf_count(g, arch, "embedding_length", 1, &c->moe.D));
  MOE_CHECK(moe__lm_gguf_count(g, arch, "attention.head_count", 1, &c->n_heads));
  c->n_kv_heads = c->n_heads;
  MOE_CHECK(moe__lm_gguf_count(g, arch, "attention.head_count_kv", 0, &c->n_kv_heads));
  c->head_dim = c->moe.D / c->n_heads;
  MOE_CHECK(moe__lm_gguf_count(g, arch, "attention.key_length", 0, &c->head_dim));
  MOE_CHECK(moe__lm_gguf_count(g, arch, "context_length", 0, &c->max_seq));
  c->rope_theta = 10000.0f; /* llama.cpp's default */
  MOE_CHECK(moe__lm_gguf_real(g, arch, "rope.freq_base", 1, &c->rope_theta));
  char k[128];
  MOE_TRY(moe_gguf_find_key(g, moe__lm_gguf_key(k, arch, "attention.layer_norm_rms_epsilon")) >= 0, MOE_ERR_MISSING,
          "%s: no %s", path, k);
  MOE_CHECK(moe__lm_gguf_real(g, arch, "attention.layer_norm_rms_epsilon", 1, &c->rms_eps));
  MOE_TRY(moe_gguf_find_key(g, moe__lm_gguf_key(k, arch, "expert_count")) >= 0, MOE_ERR_FORMAT,
          "%s: no %s: %s without experts is not a mixture of experts libmoe runs", path, k, arch);
  MOE_CHECK(moe__lm_gguf_count(g, arch, "expert_count", 1, &c->moe.E));
  MOE_CHECK(moe__lm_gguf_count(g, arch, "expert_used_count", 1, &c->moe.top_k));
  MOE_CHECK(moe__lm_gguf_is_deepseek(c->family) ? moe__lm_gguf_read_deepseek(g, c)
            : c->family == MOE_LM_GPT_OSS      ? moe__lm_gguf_read_gptoss(g, c)
                                               : read_family(g, arch, c));
  MOE_CHECK(refuse_keys(g, arch, c));
  moe_gguf_tensor t;
  MOE_CHECK(moe_gguf_tensor_get(g, "token_embd.weight", &t));
  MOE_TRY(t.ndim == 2 && t.ne[0] == c->moe.D && t.ne[1] <= INT32_MAX, MOE_ERR_SHAPE,
          "%s: tensor 'token_embd.weight' is [%lld, %lld], want [%d (%s.embedding_length), vocabulary]", path,
          (long long)t.ne[0], (long long)t.ne[1], c->moe.D, arch);
  c->vocab = (int)t.ne[1];
  int v = c->vocab;
  MOE_CHECK(moe__lm_gguf_count(g, arch, "vocab_size", 0, &v));
  MOE_TRY(v == c->vocab, MOE_ERR_SHAPE, "%s: %s.vocab_size %d is not token_embd.weight's %d rows", path, arch, v,
          c->vocab);
  c->tie_embeddings = !moe_gguf_has_tensor(g, "output.weight");
  c->moe.expert_type = experts_type(g, c);
  return MOE_OK;
}

moe_status moe__lm_gguf_read_config(const char *path, moe_lm_config *c) {
  moe_gguf *g;
  MOE_CHECK(moe_gguf_open(&g, path));
  moe_status st = read_config(g, c);
  moe_gguf_close(g);
  return st;
}

/* "[a, b, c]" of a tensor's ne. */
static void ne_str(char *buf, size_t n, const int64_t *ne, int ndim) {
  size_t at = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && at < n; d++) at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? ", " : "", (long long)ne[d]);
  if (at < n) snprintf(buf + at, n - at, "]");
}

/* The stored tensor `name` has the dims want (ndim of them; trailing 1s do not count, as in ggml). */
static moe_status expect_shape(const moe_gguf *g, const char *name, const moe_gguf_tensor *t, const int64_t *want,
                               int ndim) {
  int same = 1;
  for (int d = 0; d < 4; d++) same &= t->ne[d] == (d < ndim ? want[d] : 1);
  if (same) return MOE_OK;
  char a[96], b[96];
  ne_str(a, sizeof a, t->ne, t->ndim);
  ne_str(b, sizeof b, want, ndim);
  return moe__error(MOE_ERR_SHAPE, __FILE__, __LINE__, "%s: tensor '%s' is %s (%s), want %s", moe_gguf_path(g), name,
                    a, moe_gguf_type_name(t->type), b);
}

/* Where ref r of m is in the file: the tensor (shape-checked), the first row of r's rows and the
 * per-head permutation. whole: r as one process holds it (moe__lm_part_of). */
typedef struct {
  moe_gguf_tensor t;
  char name[64];
  int64_t row0, rows, cols;
  int permute;
} located;

static moe_status locate(const moe_gguf *g, const moe_lm_t *m, const moe_tensor_ref *whole, located *l) {
  const moe_lm_config *c = &m->cfg;
  int expert;
  MOE_TRY(moe__lm_gguf_name(c, whole->name, l->name, &expert, &l->permute), MOE_ERR_ARG,
          "%s: no GGUF name for parameter '%s'", moe_gguf_path(g), whole->name);
  MOE_CHECK(moe_gguf_tensor_get(g, l->name, &l->t));
  /* rows of cols values: a matrix's, a vector's one, a stack's (gpt-oss's experts, (E, H, D)) E x H */
  int nd = whole->ndim;
  l->cols = whole->shape[nd - 1];
  l->rows = nd == 1 ? 1 : nd == 2 ? whole->shape[0] : whole->shape[0] * whole->shape[1];
  int64_t want[3] = {l->cols, nd == 3 ? whole->shape[1] : l->rows, nd == 3 ? whole->shape[0] : c->moe.E};
  l->row0 = expert >= 0 ? expert * l->rows : 0;
  return expect_shape(g, l->name, &l->t, want, expert >= 0 ? 3 : nd);
}

/* The whole ref's values (rows x cols floats into dst) from its rows in the file, undoing llama's
 * permutation, all finite. */
static moe_status check_finite(const moe_gguf *g, const located *l, const float *dst) {
  size_t n = (size_t)(l->rows * l->cols), i = moe__first_nonfinite(dst, n);
  MOE_TRY(i == n, MOE_ERR_VALUE, "%s: tensor '%s' has a non-finite value, %g, at row %lld column %lld",
          moe_gguf_path(g), l->name, (double)dst[i], (long long)(l->row0 + (int64_t)i / l->cols),
          (long long)((int64_t)i % l->cols));
  return MOE_OK;
}

static moe_status read_rows(const moe_gguf *g, const located *l, float *dst) {
  for (int64_t r = 0; r < l->rows; r++) {
    int64_t to = l->permute ? moe__lm_gguf_hf_row(r, l->rows, l->permute) : r;
    MOE_CHECK(moe_gguf_tensor_row_f32(g, &l->t, l->row0 + r, dst + to * l->cols));
  }
  return check_finite(g, l, dst);
}

/* Ref r from the file: all of it, or under the sharded layout this rank's part (lm_dist.h). */
static moe_status read_ref(const moe_gguf *g, const moe_lm_t *m, const moe_tensor_ref *r) {
  moe__lm_part p;
  moe__lm_part_of(m, r, &p);
  located l;
  MOE_CHECK(locate(g, m, &p.whole, &l));
  if (p.whole.numel == r->numel) return read_rows(g, &l, r->data);
  float *whole = malloc(p.whole.numel * sizeof *whole);
  MOE_TRY(whole, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", moe_gguf_path(g), l.name);
  moe_status st = read_rows(g, &l, whole);
  if (st == MOE_OK) moe__lm_part_copy(&p, whole, r->data, 0);
  free(whole);
  return st;
}

/* Whether the tensors computed together with parameter `name` all have a type with a dot kernel for
 * their rows: a layer's attn_q, attn_k and attn_v (one product), a dense layer's ffn_gate, ffn_up and
 * ffn_down (one MLP); any other parameter alone. */
static int group_fits(const moe_gguf *g, const moe_lm_t *m, const char *name) {
  int i, n = 0, D = m->cfg.moe.D, H = m->cfg.dense_H;
  if (sscanf(name, "model.layers.%d.%n", &i, &n) != 1 || !n) return 1;
  static const char *const attn[3] = {"attn_q", "attn_k", "attn_v"}, *const mlp[3] = {"ffn_gate", "ffn_up", "ffn_down"};
  const char *const *group = !strncmp(name + n, "self_attn.", 10) && !strstr(name, "o_proj") ? attn
                             : !strncmp(name + n, "mlp.", 4) ? mlp : NULL;
  for (int j = 0; group && j < 3; j++) {
    char t_name[64];
    moe_gguf_tensor t;
    snprintf(t_name, sizeof t_name, "blk.%d.%s.weight", i, group[j]);
    if (!moe_gguf_has_tensor(g, t_name) || moe_gguf_tensor_get(g, t_name, &t) != MOE_OK ||
        !moe__qmat_fits(t.type, group == mlp && j == 2 ? H : D))
      return 0;
  }
  return 1;
}

/* Ref r (a non-expert weight of a model whose experts are bound) kept in its stored type where it lies
 * in the mapped file when the model can compute it so (DESIGN 4.8b): llama's permuted q and k rows put
 * back as whole rows into bytes the model owns (exact); else read into fp32 as read_ref does. */
static moe_status bind_or_read(const moe_gguf *g, moe_lm_t *m, const moe_tensor_ref *r) {
  located l;
  if (!moe__lm_quantizable(m, r->name)) return read_ref(g, m, r);
  MOE_CHECK(locate(g, m, r, &l));
  if (!moe__qmat_fits(l.t.type, l.cols) || !group_fits(g, m, r->name)) return read_ref(g, m, r);
  const uint8_t *w = l.t.data;
  uint8_t *own = NULL;
  if (l.permute) {
    size_t rb = moe__qrow_bytes(l.t.type, l.cols);
    own = malloc((size_t)l.rows * rb);
    MOE_TRY(own, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", moe_gguf_path(g), l.name);
    for (int64_t k = 0; k < l.rows; k++) memcpy(own + moe__lm_gguf_hf_row(k, l.rows, l.permute) * rb, w + k * rb, rb);
    w = own;
  }
  moe__lm_bind_quant(m, r->name, l.t.type, w, own);
  if (!own && !moe__gguf_copied(g)) moe__lm_add_mapped_bytes(m, (size_t)l.rows * moe__qrow_bytes(l.t.type, l.cols));
  return MOE_OK;
}

/* Ref k of m if it is mappable (lm_map.h): F32 in the file, not permuted, the whole ref, and not a
 * weight bind_or_read may keep in its stored type. */
static int mappable(const moe_gguf *g, const moe_lm_t *m, int k, int bound, moe__lm_map_item *x) {
  const moe_tensor_ref *r = &m->refs[k];
  moe__lm_part p;
  located l;
  moe__lm_part_of(m, r, &p);
  if (p.whole.numel != r->numel || (bound && moe__lm_quantizable(m, r->name))) return 0;
  if (locate(g, m, r, &l) != MOE_OK || l.t.type != MOE_GGUF_F32 || l.permute) return 0; /* errors: the read's */
  *x = (moe__lm_map_item){k, 0, l.t.file_offset + (uint64_t)(l.row0 * l.cols) * 4};
  return 1;
}

/* The mappable refs mapped (or where their pages do not line up, read) into m, flagged in done. */
static moe_status map_refs(const moe_gguf *g, moe_lm_t *m, int bound, char *done) {
  const char *path = moe_gguf_path(g);
  moe__lm_map_item *x = malloc((size_t)m->nrefs * sizeof *x);
  MOE_TRY(x, MOE_ERR_NOMEM, "%s: out of memory", path);
  int n = 0, fd = -1;
  for (int k = 0; k < m->nrefs; k++) n += mappable(g, m, k, bound, &x[n]);
  moe_status st = MOE_OK;
  if (n && (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
    st = moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: cannot open: %s", path, strerror(errno));
  if (st == MOE_OK && n) st = moe__lm_map_items(m, x, n, &fd, &path); /* the mappings keep the file */
  for (int k = 0; st == MOE_OK && k < n; k++) done[x[k].ref] = 1;
  if (fd >= 0) close(fd);
  free(x);
  return st;
}

/* A mapped ref's values, all finite (as a read checks them). */
static moe_status check_mapped(const moe_gguf *g, const moe_lm_t *m, const moe_tensor_ref *r) {
  located l;
  MOE_CHECK(locate(g, m, r, &l));
  return check_finite(g, &l, r->data);
}

/* Layer i's routed experts (their slices of ffn_gate_exps, ffn_up_exps and ffn_down_exps) into its
 * stacked fp32 weights: the one place the experts are read, so that a source keeping them in their
 * stored type can take its place. */
static moe_status load_experts(const moe_gguf *g, const moe_lm_t *m, int i, const char *mapped) {
  char prefix[32];
  int n = snprintf(prefix, sizeof prefix, "model.layers.%d.", i), e, j;
  for (int k = 0; k < m->nrefs; k++) {
    const moe_tensor_ref *r = &m->refs[k];
    if (!strncmp(r->name, prefix, (size_t)n) && moe__lm_expert_of(m->cfg.family, r->name, &e, &j))
      MOE_CHECK(mapped[k] ? check_mapped(g, m, r) : read_ref(g, m, r));
  }
  return MOE_OK;
}

/* Layer i's routed experts bound where they lie in the mapped file, each stack in its stored type (a
 * type with kernels: the config's expert_type says they all are), each checked for its shape first. */
static moe_status bind_experts(const moe_gguf *g, moe_lm_t *m, int i) {
  static const char *const stacks[3] = {"gate", "down", "up"}; /* the layer's fc1, fc2, fc3 */
  const moe_lm_config *c = &m->cfg;
  moe_gguf_tensor t[3];
  moe_gguf_type types[3];
  for (int j = 0; j < 3; j++) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", i, stacks[j]);
    MOE_CHECK(moe_gguf_tensor_get(g, name, &t[j]));
    int64_t want[3] = {j == 1 ? c->moe.H : c->moe.D, j == 1 ? c->moe.D : c->moe.H, c->moe.E};
    MOE_CHECK(expect_shape(g, name, &t[j], want, 3));
    types[j] = t[j].type;
  }
  moe_status st = moe_layer_bind_experts_typed(&m->layers[i], types, t[0].data, t[1].data, t[2].data);
  MOE_TRY(st == MOE_OK, st, "%s: layer %d's experts: %s", moe_gguf_path(g), i, moe_last_error());
  if (!moe__gguf_copied(g)) moe__lm_add_mapped_bytes(m, t[0].nbytes + t[1].nbytes + t[2].nbytes);
  return MOE_OK;
}

/* The config's sizes against the tensors that carry them before anything of their size is allocated
 * (as lm_io.c's check_sizes): the last layer's q and k (with latent attention q, kv_a and kv_b), the
 * last MoE layer's router and experts, the first dense layer's MLP, the shared expert. */
static moe_status check_sizes(const moe_gguf *g, const moe_lm_config *c) {
  int64_t D = c->moe.D, hd = c->head_dim, L = c->n_layers - 1;
  int last_moe = -1, first_dense = -1;
  for (int i = 0; i < c->n_layers; i++)
    if (moe_lm_layer_dense(c, i)) first_dense = first_dense < 0 ? i : first_dense;
    else last_moe = i;
  struct { char name[64]; int ndim; int64_t ne[3]; } w[8];
  int n = 0;
#define WANT(nd, a, b, e, ...) (snprintf(w[n].name, 64, __VA_ARGS__), w[n].ndim = nd, w[n].ne[0] = a, w[n].ne[1] = b, w[n].ne[2] = e, n++)
  const moe_lm_mla *a = &c->mla;
  if (a->kv_lora_rank) { /* the latent attention's: q (through its latent or not), kv_a and kv_b */
    int64_t qd = c->n_heads * (a->qk_nope_dim + hd), r = a->kv_lora_rank;
    if (a->q_lora_rank) WANT(2, a->q_lora_rank, qd, 1, "blk.%lld.attn_q_b.weight", (long long)L);
    else WANT(2, D, qd, 1, "blk.%lld.attn_q.weight", (long long)L);
    WANT(2, D, r + hd, 1, "blk.%lld.attn_kv_a_mqa.weight", (long long)L);
    WANT(2, r, c->n_heads * (a->qk_nope_dim + a->v_head_dim), 1, "blk.%lld.attn_kv_b.weight", (long long)L);
  } else {
    WANT(2, D, c->n_heads * hd, 1, "blk.%lld.attn_q.weight", (long long)L);
    WANT(2, D, c->n_kv_heads * hd, 1, "blk.%lld.attn_k.weight", (long long)L);
  }
  if (last_moe >= 0) {
    WANT(2, D, c->moe.E, 1, "blk.%d.ffn_gate_inp.weight", last_moe);
    WANT(3, D, c->moe.H, c->moe.E, "blk.%d.ffn_gate_exps.weight", last_moe);
    WANT(3, c->moe.H, D, c->moe.E, "blk.%d.ffn_down_exps.weight", last_moe);
    if (c->moe.shared_H) WANT(2, D, c->moe.shared_H, 1, "blk.%d.ffn_gate_shexp.weight", last_moe);
  }
  if (first_dense >= 0) WANT(2, D, c->dense_H, 1, "blk.%d.ffn_gate.weight", first_dense);
#undef WANT
  for (int i = 0; i < n; i++) {
    moe_gguf_tensor t;
    MOE_CHECK(moe_gguf_tensor_get(g, w[i].name, &t));
    MOE_CHECK(expect_shape(g, w[i].name, &t, w[i].ne, w[i].ndim));
  }
  return MOE_OK;
}

/* Every tensor of the file is one the model reads: another (a rope_freqs table, a bias the config does
 * not have) is an error naming it, not a weight silently left out. */
static moe_status check_unused(const moe_gguf *g, const moe_lm_t *m) {
  char(*names)[64] = malloc((size_t)m->nrefs * sizeof *names);
  MOE_TRY(names, MOE_ERR_NOMEM, "%s: out of memory", moe_gguf_path(g));
  int expert, permute;
  for (int k = 0; k < m->nrefs; k++)
    if (!moe__lm_gguf_name(&m->cfg, m->refs[k].name, names[k], &expert, &permute)) names[k][0] = 0;
  moe_status st = MOE_OK;
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t;
    st = moe_gguf_tensor_at(g, i, &t);
    int used = 0;
    for (int k = 0; st == MOE_OK && k < m->nrefs && !used; k++) used = !strcmp(names[k], t.name);
    int layer, n = 0;
    char stack[8], kind[8];
    const moe_layer_config *mc = &m->cfg.moe; /* bound or streamed stacks have no refs, streamed biases neither */
    if (!used && (mc->expert_type > 0 || mc->external_experts) &&
        sscanf(t.name, "blk.%d.ffn_%7[a-z]_exps.%7[a-z]%n", &layer, stack, kind, &n) == 3 && !t.name[n] &&
        (!strcmp(kind, "weight") || (mc->external_experts && mc->expert_bias && !strcmp(kind, "bias"))))
      used = !moe_lm_layer_dense(&m->cfg, layer);
    if (st == MOE_OK && !used)
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                      "%s: tensor '%s' is not a parameter of the %s model the file's metadata describes",
                      moe_gguf_path(g), t.name, moe__lm_gguf_arch(m->cfg.family));
  }
  free(names);
  return st;
}

moe_status moe__lm_gguf_load(moe_lm_t *m, const char *path, const moe_lm_config *c) {
  memset(m, 0, sizeof *m);
  moe_gguf *g;
  MOE_CHECK(moe_gguf_open(&g, path));
  moe_lm_config own;
  moe_status st = MOE_OK;
  if (!c) {
    st = read_config(g, &own);
    c = &own;
  }
  if (st == MOE_OK) st = check_sizes(g, c);
  if (st == MOE_OK) st = moe_lm_init(m, c);
  if (st != MOE_OK) {
    moe_gguf_close(g);
    return st;
  }
  int e, j, bound = c->moe.expert_type > 0, map = moe__lm_mapping(moe__gguf_size(g));
  if (bound && !map) { /* the weights kept in their stored type are the file's bytes: read them in */
    moe_gguf *copy;
    st = moe__gguf_open_copy(&copy, path);
    moe_gguf_close(g);
    if (st != MOE_OK) return moe_lm_free(m), st;
    g = copy;
  }
  char *mapped = calloc((size_t)m->nrefs, 1);
  st = mapped ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
  if (st == MOE_OK && map) st = map_refs(g, m, bound, mapped);
  for (int k = 0; st == MOE_OK && k < m->nrefs; k++) {
    const moe_tensor_ref *r = &m->refs[k];
    if (moe__lm_expert_of(c->family, r->name, &e, &j)) continue; /* the layers' turn, next */
    st = mapped[k] ? check_mapped(g, m, r) : bound ? bind_or_read(g, m, r) : read_ref(g, m, r);
  }
  for (int i = 0; st == MOE_OK && !c->moe.external_experts && i < c->n_layers; i++) /* streamed: read later */
    if (!moe_lm_layer_dense(c, i)) st = bound ? bind_experts(g, m, i) : load_experts(g, m, i, mapped);
  free(mapped);
  if (st == MOE_OK) st = check_unused(g, m);
  if (st == MOE_OK && bound) moe__lm_keep_mapped(m, g); /* the experts' bytes: closed with the model */
  else moe_gguf_close(g);
  if (st != MOE_OK) {
    moe_lm_free(m);
    return st;
  }
  moe_lm_params_changed(m);
  return MOE_OK;
}
