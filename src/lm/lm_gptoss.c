/* gpt-oss's fused expert tensors to and from the MoE layers' own (lm_gptoss.h). */
#include "lm_gptoss.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm_gguf.h"

/* A converted ref: layer, fc 1 (gate), 3 (up) or 2 (down), weight or bias. */
typedef struct {
  int layer, fc, bias;
} conv;

static int parse(const char *name, conv *k) {
  char kind[8];
  int n = 0;
  if (sscanf(name, "model.layers.%d.mlp.experts.fc%d.%7[a-z]%n", &k->layer, &k->fc, kind, &n) != 3 || name[n])
    return 0;
  k->bias = !strcmp(kind, "bias");
  if (!k->bias && strcmp(kind, "weight")) return 0;
  return k->fc == 1 || k->fc == 3 || (k->fc == 2 && !k->bias);
}

int moe__gptoss_converted(moe_lm_family f, const char *name) {
  conv k;
  return f == MOE_LM_GPT_OSS && parse(name, &k);
}

/* The checkpoint tensor of k and its shape (E, D, 2H), (E, 2H) or (E, H, D). */
static int source_of(const moe_lm_config *c, const conv *k, char *hf, size_t n, int64_t shape[3]) {
  int64_t E = c->moe.E, H = c->moe.H, D = c->moe.D;
  const char *what = k->fc == 2 ? "down_proj" : k->bias ? "gate_up_proj_bias" : "gate_up_proj";
  snprintf(hf, n, "model.layers.%d.mlp.experts.%s", k->layer, what);
  shape[0] = E;
  shape[1] = k->fc == 2 ? H : k->bias ? 2 * H : D;
  shape[2] = k->fc == 2 ? D : 2 * H;
  return k->bias ? 2 : 3;
}

/* The checkpoint's expert that ref r's first row holds: expert-parallel, this rank's first (r has E/W
 * experts, rank q's from q E/W); else 0. */
static size_t first_expert(const moe_lm_config *c, const moe_tensor_ref *r) {
  return r->shape[0] < c->moe.E ? (size_t)moe_dist_rank(c->moe.dist) * (size_t)r->shape[0] : 0;
}

/* One MXFP4 block as transformers stores it (16 bytes, value 2i in the low nibble of byte i and 2i + 1
 * in the high one; its E8M0 scale apart) into 32 floats, through ggml's block layout (the scale, then
 * value i in the low nibble of byte i and value i + 16 in the high), which libmoe's codec reads. */
static moe_status mxfp4_block(const uint8_t *b, uint8_t scale, float *y) {
  uint8_t q[17];
  q[0] = scale;
  for (int i = 0; i < 16; i++) {
    int lo = (b[i / 2] >> (4 * (i & 1))) & 15, hi = (b[(i + 16) / 2] >> (4 * (i & 1))) & 15;
    q[1 + i] = (uint8_t)(lo | hi << 4);
  }
  return moe_gguf_dequantize(MOE_GGUF_MXFP4, q, y, 32);
}

/* A view of `name` (U8, ndim dims of shape want): MOE_ERR_SHAPE naming the file otherwise. */
static moe_status u8_view(const moe__lm_reader *rd, const char *name, int ndim, const int64_t *want, moe_st **f,
                          moe_tensor_view *v) {
  MOE_CHECK(rd->file_of(rd->ctx, name, f));
  MOE_CHECK(moe_st_get(*f, name, v));
  MOE_TRY(v->dtype == MOE_DT_U8, MOE_ERR_DTYPE, "%s: tensor '%s' is %s, want U8 (MXFP4)", moe_st_path(*f), name,
          moe_dtype_name(v->dtype));
  return moe__st_expect_shape(*f, v, name, ndim, want);
}

/* A fused tensor's MXFP4 blocks and scales: R rows of K values (G blocks of 32) per expert. */
typedef struct {
  moe_st *fb, *fs;
  moe_tensor_view vb, vs;
  int64_t R, K, G;
} mx_src;

/* The blocks and scales of hf (gate_up_proj for k fc1 or fc3, down_proj for fc2), their shapes checked. */
static moe_status mx_open(const moe__lm_reader *rd, const moe_lm_config *c, const conv *k, const char *hf, mx_src *x) {
  int64_t E = c->moe.E, H = c->moe.H, D = c->moe.D;
  x->R = k->fc == 2 ? D : 2 * H, x->K = k->fc == 2 ? H : D, x->G = x->K / 32;
  char bn[128], sn[128];
  snprintf(bn, sizeof bn, "%s_blocks", hf);
  snprintf(sn, sizeof sn, "%s_scales", hf);
  MOE_TRY(x->K % 32 == 0, MOE_ERR_SHAPE, "tensor '%s': MXFP4 needs rows of a multiple of 32 values, got %lld", bn,
          (long long)x->K);
  int64_t wb[4] = {E, x->R, x->G, 16}, ws[3] = {E, x->R, x->G};
  MOE_CHECK(u8_view(rd, bn, 4, wb, &x->fb, &x->vb));
  return u8_view(rd, sn, 3, ws, &x->fs, &x->vs);
}

/* Expert e's part of converted weight k (fc1, fc3: rows 2j or 2j + 1 of its dequantized (2H, D); fc2: its
 * (D, H) as it is) into dst, a row at a time through blk (G * 17 bytes). */
static moe_status mx_expert(const mx_src *x, const conv *k, int64_t e, uint8_t *blk, float *dst) {
  int64_t G = x->G, K = x->K, rows = k->fc == 2 ? x->R : x->R / 2;
  uint8_t *sc = blk + G * 16;
  moe_status st = MOE_OK;
  for (int64_t j = 0; j < rows && st == MOE_OK; j++) {
    int64_t src = e * x->R + (k->fc == 2 ? j : 2 * j + (k->fc == 3)); /* gate rows even, up rows odd */
    float *y = dst + (size_t)j * (size_t)K;
    st = moe_st_read(x->fb, &x->vb, (size_t)src * G * 16, (size_t)G * 16, blk);
    if (st == MOE_OK) st = moe_st_read(x->fs, &x->vs, (size_t)src * G, (size_t)G, sc);
    for (int64_t g = 0; g < G && st == MOE_OK; g++) st = mxfp4_block(blk + g * 16, sc[g], y + g * 32);
    for (int64_t i = 0; i < K && st == MOE_OK; i++)
      if (!isfinite(y[i]))
        st = moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "%s: tensor '%s' row %lld has scale %d: not finite",
                        moe_st_path(x->fs), x->vs.name, (long long)src, sc[i / 32]);
  }
  return st;
}

/* Converted weight r from hf's MXFP4 blocks and scales, expert by expert. */
static moe_status read_mxfp4(const moe__lm_reader *rd, const moe_lm_config *c, const conv *k, const char *hf,
                             const moe_tensor_ref *r) {
  mx_src x;
  MOE_CHECK(mx_open(rd, c, k, hf, &x));
  uint8_t *blk = malloc((size_t)x.G * 17);
  MOE_TRY(blk, MOE_ERR_NOMEM, "out of memory for a row of '%s'", x.vb.name);
  moe_status st = MOE_OK;
  size_t El = (size_t)r->shape[0], part = r->numel / El; /* this rank's experts, from e0 */
  int64_t e0 = (int64_t)first_expert(c, r);
  for (size_t e = 0; e < El && st == MOE_OK; e++) st = mx_expert(&x, k, e0 + (int64_t)e, blk, r->data + e * part);
  free(blk);
  return st;
}

/* Expert e's part of converted ref k (its (H, D), (D, H) or H values) from its slab of the checkpoint
 * tensor ((D, 2H), (H, D) or 2H values): the gate's (even) or the up's (odd) columns, down_proj
 * transposed; fuse: the other way, the part into its place in the slab. */
static void convert_expert(const conv *k, size_t H, size_t D, const float *from, float *to, int fuse) {
  size_t up = k->fc == 3;
  for (size_t j = 0; j < H; j++)
    for (size_t d = 0; d < (k->bias ? 1 : D); d++) {
      size_t ours = k->bias ? j : k->fc == 2 ? d * H + j : j * D + d,
             theirs = k->bias ? 2 * j + up : k->fc == 2 ? j * D + d : d * 2 * H + 2 * j + up;
      if (fuse) to[theirs] = from[ours];
      else to[ours] = from[theirs];
    }
}

moe_status moe__gptoss_read_ref(const moe__lm_reader *rd, const moe_lm_t *m, const moe_tensor_ref *r) {
  const moe_lm_config *c = &m->cfg;
  conv k;
  MOE_TRY(parse(r->name, &k), MOE_ERR_STATE, "internal: '%s' is not a converted gpt-oss tensor", r->name);
  moe_tensor_ref t;
  memset(&t, 0, sizeof t);
  t.ndim = source_of(c, &k, t.name, sizeof t.name, t.shape);
  moe_st *f = NULL;
  char bn[128];
  snprintf(bn, sizeof bn, "%s_blocks", t.name);
  int plain = rd->file_of(rd->ctx, t.name, &f) == MOE_OK && moe_st_has(f, t.name);
  if (!plain && !k.bias && rd->file_of(rd->ctx, bn, &f) == MOE_OK && moe_st_has(f, bn))
    return read_mxfp4(rd, c, &k, t.name, r);
  MOE_CHECK(rd->file_of(rd->ctx, t.name, &f)); /* absent: the error names the tensor */
  size_t E = (size_t)c->moe.E, El = (size_t)r->shape[0], e0 = first_expert(c, r); /* this rank's experts */
  t.numel = E * (size_t)t.shape[1] * (t.ndim == 3 ? (size_t)t.shape[2] : 1);
  t.data = malloc(t.numel * 4 + 4);
  MOE_TRY(t.data, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", moe_st_path(f), t.name);
  moe_status st = rd->read(f, &t);
  for (size_t e = 0; st == MOE_OK && e < El; e++) /* e + e0: the expert's place in the checkpoint */
    convert_expert(&k, (size_t)c->moe.H, (size_t)c->moe.D, t.data + (e + e0) * (t.numel / E),
                   r->data + e * (r->numel / El), 0);
  free(t.data);
  return st;
}

moe_status moe__gptoss_write_ref(const moe_lm_t *m, const moe_tensor_ref *r, moe_st_writer *w) {
  const moe_lm_config *c = &m->cfg;
  conv k;
  MOE_TRY(parse(r->name, &k), MOE_ERR_STATE, "internal: '%s' is not a converted gpt-oss tensor", r->name);
  if (k.fc == 3) return MOE_OK; /* with fc1's */
  char hf[96], un[96];
  int64_t shape[3];
  int ndim = source_of(c, &k, hf, sizeof hf, shape);
  snprintf(un, sizeof un, "model.layers.%d.mlp.experts.fc3.%s", k.layer, k.bias ? "bias" : "weight");
  const moe_tensor_ref *u = moe_lm_find(m, un);
  MOE_TRY(k.fc == 2 || u, MOE_ERR_STATE, "internal: no '%s' beside '%s'", un, r->name);
  const conv up = {k.layer, 3, k.bias};
  size_t E = (size_t)c->moe.E, H = (size_t)c->moe.H, D = (size_t)c->moe.D, part = r->numel / E,
         slab = part * (k.fc == 2 ? 1 : 2);
  float *buf = malloc(E * slab * 4);
  MOE_TRY(buf, MOE_ERR_NOMEM, "out of memory for tensor '%s'", hf);
  for (size_t e = 0; e < E; e++) {
    convert_expert(&k, H, D, r->data + e * part, buf + e * slab, 1);
    if (k.fc != 2) convert_expert(&up, H, D, u->data + e * part, buf + e * slab, 1);
  }
  moe_status st = moe_st_writer_add_f32(w, hf, MOE_DT_F32, ndim, shape, buf);
  free(buf);
  return st;
}

/* The converted refs (fc1 with fc3, or fc2) that fused tensor k of layer i is made from. */
static conv fused_from(int i, int k) { return (conv){i, k == 2 ? 2 : 1, k == 1}; }

int moe__gptoss_fused(const moe_lm_config *c, int i, int k, char *name, size_t n, int64_t shape[3]) {
  if (k < 0 || k > 3) return 0;
  if (k < 3) {
    conv f = fused_from(i, k);
    return source_of(c, &f, name, n, shape);
  }
  snprintf(name, n, "model.layers.%d.mlp.experts.down_proj_bias", i);
  shape[0] = c->moe.E, shape[1] = c->moe.D;
  return 2;
}

moe_status moe__gptoss_fused_read(const moe_lm_config *c, int i, int k, moe__lm_expert_src *in, int e, float *dst,
                                  const char *what) {
  if (k == 3) return moe__lm_expert_src_read(in, i, 3, e, dst, what); /* down_proj_bias: fc2.bias as it is */
  size_t H = (size_t)c->moe.H, D = (size_t)c->moe.D;
  conv f = fused_from(i, k), up = {i, 3, f.bias};
  float *part = moe__lm_expert_src_scratch(in, f.bias ? H : H * D, what);
  if (!part) return MOE_ERR_NOMEM;
  MOE_CHECK(moe__lm_expert_src_read(in, i, f.fc == 2 ? 2 : f.bias, e, part, what));
  convert_expert(&f, H, D, part, dst, 1);
  if (f.fc == 2) return MOE_OK;
  MOE_CHECK(moe__lm_expert_src_read(in, i, 4 + f.bias, e, part, what));
  convert_expert(&up, H, D, part, dst, 1);
  return MOE_OK;
}

int moe__gptoss_source(const moe_lm_config *c, const char *name) {
  static const char *const kinds[] = {"gate_up_proj",        "gate_up_proj_bias",   "down_proj",
                                      "gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                      "down_proj_scales",    "down_proj_bias"}; /* a ref, unless external */
  char kind[32];
  int layer, n = 0;
  if (c->family != MOE_LM_GPT_OSS || sscanf(name, "model.layers.%d.mlp.experts.%31[a-z_]%n", &layer, kind, &n) != 2 ||
      name[n] || layer < 0 || layer >= c->n_layers)
    return 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (!strcmp(kind, kinds[i])) return 1;
  return 0;
}

moe_status moe__gptoss_check_sizes(const moe__lm_reader *rd, const char *dir, const moe_lm_config *c, int i) {
  char name[128], blocks[140];
  snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", i);
  snprintf(blocks, sizeof blocks, "%s_blocks", name);
  int64_t E = c->moe.E, H = c->moe.H, D = c->moe.D;
  moe_st *f = NULL;
  moe_tensor_view v;
  int plain = rd->file_of(rd->ctx, name, &f) == MOE_OK && moe_st_has(f, name);
  const char *n = plain ? name : blocks;
  moe_status st = rd->file_of(rd->ctx, n, &f);
  if (st == MOE_OK) st = moe_st_get(f, n, &v);
  MOE_TRY(st == MOE_OK, MOE_ERR_SHAPE, "%s/config.json: \"num_hidden_layers\" %d asks for tensor '%s' or its MXFP4 "
          "blocks: %s", dir, c->n_layers, name, moe_last_error());
  int ok = plain ? v.ndim == 3 && v.shape[0] == E && v.shape[1] == D && v.shape[2] == 2 * H
                 : v.ndim == 4 && v.shape[0] == E && v.shape[1] == 2 * H && v.shape[2] * 32 == D && v.shape[3] == 16;
  MOE_TRY(ok, MOE_ERR_SHAPE, "%s/config.json: \"num_local_experts\" %lld, \"hidden_size\" %lld and "
          "\"intermediate_size\" %lld do not fit tensor '%s' in %s (%s, got %d dims: %lld x %lld x ...)", dir,
          (long long)E, (long long)D, (long long)H, n, moe_st_path(f),
          plain ? "want E x D x 2H" : "want E x 2H x D/32 x 16",
          v.ndim, (long long)v.shape[0], v.ndim > 1 ? (long long)v.shape[1] : 0LL);
  return MOE_OK;
}

/* A tensor of a streamed layer and the file (the shard) that holds it. */
typedef struct {
  const moe_st *f;
  moe_tensor_view v;
} part;

/* A streamed layer's fused tensors (moe__gptoss_expert_reader). */
typedef struct {
  moe__st_files fs; /* the checkpoint's files (a reference held) */
  int layer, mx;
  int64_t H, D;
  part gu, gub, dn, dnb; /* gate_up_proj (plain form), its bias, down_proj (plain form), its bias */
  mx_src mgu, mdn;       /* the MXFP4 forms */
  float *slab;           /* one expert's (D, 2H) of gate_up_proj as fp32, or a row's MXFP4 bytes */
} oss_reader;

/* lm_gptoss.h's reader over the shards: the file holding the tensor (an error names a missing tensor,
 * or the shard that cannot be opened). */
static moe_status shard_of(void *ctx, const char *name, moe_st **f) {
  const oss_reader *o = ctx;
  const moe_st *held;
  MOE_CHECK(o->fs.file_of(o->fs.ctx, name, 1, &held));
  *f = (moe_st *)held;
  return MOE_OK;
}

/* Values [e n, (e + 1) n) of p (expert e's slab) into dst; their pages dropped when asked. */
static moe_status slab(const part *p, int e, size_t n, float *dst, int drop) {
  moe_status st = moe__lm_read_values(p->f, &p->v, (size_t)e * n, n, dst);
  if (drop) moe__st_drop_pages(p->f, &p->v, (size_t)e * n * moe_dtype_size(p->v.dtype), n * moe_dtype_size(p->v.dtype));
  return st;
}

/* The pages of expert e's rows of an MXFP4 tensor dropped. */
static void mx_drop(const mx_src *x, int e) {
  size_t rows = (size_t)x->R, G = (size_t)x->G;
  moe__st_drop_pages(x->fb, &x->vb, (size_t)e * rows * G * 16, rows * G * 16);
  moe__st_drop_pages(x->fs, &x->vs, (size_t)e * rows * G, rows * G);
}

/* Expert e's gate (fc1) and up (fc3) columns of a fused tensor (gate_up_proj or its MXFP4 blocks and
 * scales x, or with bias gate_up_proj_bias) into out[bias] and out[4 + bias], those not NULL. */
static moe_status read_pair(oss_reader *o, const part *p, const mx_src *x, int bias, int e, float *const out[6],
                            int drop) {
  size_t H = (size_t)o->H, D = (size_t)o->D;
  const conv gate = {o->layer, 1, bias}, up = {o->layer, 3, bias};
  float *g = out[bias], *u = out[4 + bias];
  if (!g && !u) return MOE_OK;
  if (o->mx && !bias) {
    uint8_t *blk = (uint8_t *)o->slab;
    if (g) MOE_CHECK(mx_expert(x, &gate, e, blk, g));
    if (u) MOE_CHECK(mx_expert(x, &up, e, blk, u));
    if (drop) mx_drop(x, e);
    return MOE_OK;
  }
  MOE_CHECK(slab(p, e, bias ? 2 * H : D * 2 * H, o->slab, drop));
  if (g) convert_expert(&gate, H, D, o->slab, g, 0);
  if (u) convert_expert(&up, H, D, o->slab, u, 0);
  return MOE_OK;
}

static moe_status oss_read(void *ctx, int e, float *const out[6], int drop) {
  oss_reader *o = ctx;
  size_t H = (size_t)o->H, D = (size_t)o->D;
  const conv down = {o->layer, 2, 0};
  MOE_CHECK(read_pair(o, &o->gu, &o->mgu, 0, e, out, drop));
  if (out[2] && o->mx) {
    MOE_CHECK(mx_expert(&o->mdn, &down, e, (uint8_t *)o->slab, out[2]));
    if (drop) mx_drop(&o->mdn, e);
  } else if (out[2]) {
    MOE_CHECK(slab(&o->dn, e, H * D, o->slab, drop));
    convert_expert(&down, H, D, o->slab, out[2], 0);
  }
  MOE_CHECK(read_pair(o, &o->gub, NULL, 1, e, out, drop));
  return out[3] ? slab(&o->dnb, e, D, out[3], drop) : MOE_OK;
}

static void oss_free(void *ctx) {
  oss_reader *o = ctx;
  if (o->fs.release) o->fs.release(o->fs.ctx);
  free(o->slab);
  free(o);
}

/* View `name` of its shard into p, (E, a) or (E, a, b) (b 0: 2 dims), F32, BF16 or F16. */
static moe_status plain_view(oss_reader *o, const moe_lm_config *c, const char *what, int64_t a, int64_t b, part *p) {
  char name[128];
  snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", o->layer, what);
  moe_st *f;
  MOE_CHECK(shard_of(o, name, &f));
  p->f = f;
  MOE_CHECK(moe_st_get(f, name, &p->v));
  int64_t want[3] = {c->moe.E, a, b};
  MOE_CHECK(moe__st_expect_shape(f, &p->v, name, b ? 3 : 2, want));
  MOE_TRY(p->v.dtype == MOE_DT_F32 || p->v.dtype == MOE_DT_BF16 || p->v.dtype == MOE_DT_F16, MOE_ERR_DTYPE,
          "%s: tensor '%s' is %s, want F32, BF16 or F16", moe_st_path(f), name, moe_dtype_name(p->v.dtype));
  return MOE_OK;
}

moe_status moe__gptoss_expert_reader(const moe__st_files *fs, const moe_lm_config *c, int i, moe__expert_reader *r) {
  oss_reader *o = calloc(1, sizeof *o);
  if (!o && fs->release) fs->release(fs->ctx);
  MOE_TRY(o, MOE_ERR_NOMEM, "expert reader: out of memory");
  o->fs = *fs, o->layer = i, o->H = c->moe.H, o->D = c->moe.D;
  int64_t H = o->H, D = o->D;
  char gu[96], dn[96];
  snprintf(gu, sizeof gu, "model.layers.%d.mlp.experts.gate_up_proj", i);
  snprintf(dn, sizeof dn, "model.layers.%d.mlp.experts.down_proj", i);
  const moe_st *plain = NULL;
  moe_status st = fs->file_of(fs->ctx, gu, 0, &plain);
  o->mx = !plain;
  moe__lm_reader rd = {o, shard_of, NULL};
  const conv gate = {i, 1, 0}, down = {i, 2, 0};
  size_t bytes = 0, floats = (size_t)(D * 2 * H);
  if (st == MOE_OK) st = plain_view(o, c, "gate_up_proj_bias", 2 * H, 0, &o->gub);
  if (st == MOE_OK) st = plain_view(o, c, "down_proj_bias", D, 0, &o->dnb);
  if (st == MOE_OK && o->mx) {
    st = mx_open(&rd, c, &gate, gu, &o->mgu);
    if (st == MOE_OK) st = mx_open(&rd, c, &down, dn, &o->mdn);
    if (st == MOE_OK) bytes = (size_t)(o->mgu.R * o->mgu.G + o->mdn.R * o->mdn.G) * 17;
  } else if (st == MOE_OK) {
    st = plain_view(o, c, "gate_up_proj", D, 2 * H, &o->gu);
    if (st == MOE_OK) st = plain_view(o, c, "down_proj", H, D, &o->dn);
    if (st == MOE_OK) bytes = (size_t)(3 * H * D) * moe_dtype_size(o->gu.v.dtype);
  }
  if (st == MOE_OK && !(o->slab = malloc(floats * 4)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert reader: out of memory for an expert of '%s'", gu);
  if (st != MOE_OK) {
    oss_free(o);
    return st;
  }
  bytes += (size_t)(2 * H) * moe_dtype_size(o->gub.v.dtype) + (size_t)D * moe_dtype_size(o->dnb.v.dtype);
  *r = (moe__expert_reader){.ctx = o, .read = oss_read, .free = oss_free, .file_bytes = bytes};
  return MOE_OK;
}
