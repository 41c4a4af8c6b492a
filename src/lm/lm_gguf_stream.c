/* A GGUF file's routed experts read one expert at a time for an expert cache (cache_reader.h;
 * moe_lm_load_streaming): expert e's rows of the stacked blk.<i>.ffn_{gate,down,up}_exps.weight (its
 * slice of each is contiguous: the expert is the outermost dimension) are read with pread from one
 * descriptor every layer's reader shares (moe__lm_gguf_fd: a 48-layer model holds one, not 48), never
 * through the mapping (a file cut short is an error, not a SIGBUS), and dequantized, all its rows in one call, with
 * the codec the resident loader uses (moe_gguf_dequantize), so the slots hold its values bit for bit;
 * each projection in its own stored type. With moe.expert_type > 0 (the experts compute in their stored
 * types, as the resident model binds them) the slots hold the file's bytes as they are, and a read
 * checks the blocks' fp16 scales (Q8_0, Q4_0: d; Q4_K, Q5_K: d and dmin; Q6_K: d) or every F16 and BF16
 * value for a NaN or Inf; MXFP4's e8m0 scales have no non-finite value to check. gpt-oss's expert biases
 * (ffn_{gate,down,up}_exps.bias, one row per expert) are read into fp32 either way, checked finite. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/pread_all.h"
#include "internal.h"
#include "lm_gguf.h"

struct moe__lm_gguf_fd {
  int fd;
  int refs; /* its opener's and each reader's; taken and dropped on the loading thread only */
  char path[];
};

moe_status moe__lm_gguf_fd_open(moe__lm_gguf_fd **out, const char *path) {
  moe__lm_gguf_fd *f = malloc(sizeof *f + strlen(path) + 1);
  MOE_TRY(f, MOE_ERR_NOMEM, "%s: out of memory", path);
  strcpy(f->path, path);
  f->refs = 1;
  if ((f->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
    free(f);
    return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: %s", path, strerror(errno));
  }
  *out = f;
  return MOE_OK;
}

void moe__lm_gguf_fd_release(moe__lm_gguf_fd *f) {
  if (!f || --f->refs) return;
  close(f->fd);
  free(f);
}

/* Tensors by the cache's order (cache_reader.h): t = 2 j the projection j's weights fc1 (gate), fc2
 * (down), fc3 (up), t = 2 j + 1 its biases (gpt-oss), one row per expert. */
typedef struct {
  moe__lm_gguf_fd *file;   /* shared with the other layers' readers */
  int have[6];             /* the layer has tensor t */
  char name[6][64];
  moe_gguf_type type[6];
  int64_t rows[6], cols[6];
  uint64_t offset[6];      /* the tensor's data in the file */
  size_t slice[6], row[6]; /* bytes of one expert's rows, of one row */
  uint8_t *buf;            /* the largest slice read as floats (all of them; stored types: the biases) */
  int stored;              /* the weights' slots hold the file's bytes */
} gguf_reader;

static void reader_free(void *ctx) {
  gguf_reader *r = ctx;
  if (!r) return;
  moe__lm_gguf_fd_release(r->file);
  free(r->buf), free(r);
}

/* The half-precision fields of a block of type t that must be finite: at bytes off[0..n) of each
 * block, bf16 (else fp16); 0 fields: nothing to check. */
static int checked_halves(moe_gguf_type t, size_t off[2], int *bf16) {
  *bf16 = t == MOE_GGUF_BF16;
  off[0] = t == MOE_GGUF_Q6_K ? 208 : 0, off[1] = 2;
  switch (t) {
    case MOE_GGUF_Q8_0: case MOE_GGUF_Q4_0: case MOE_GGUF_Q6_K: case MOE_GGUF_F16: case MOE_GGUF_BF16: return 1;
    case MOE_GGUF_Q4_K: case MOE_GGUF_Q5_K: return 2;
    default: return 0;
  }
}

/* Tensor j's bytes b of expert e: its blocks' scales (or values) finite, else an error naming the row. */
static moe_status check_stored(const gguf_reader *r, int j, int e, const uint8_t *b) {
  size_t off[2], bb = moe_gguf_type_block_bytes(r->type[j]), n = r->slice[j] / bb;
  int bf16, k = checked_halves(r->type[j], off, &bf16);
  uint16_t inf = bf16 ? 0x7f80 : 0x7c00; /* the exponent all ones */
  for (size_t i = 0; i < n; i++)
    for (int f = 0; f < k; f++) {
      const uint8_t *p = b + i * bb + off[f];
      uint16_t h = (uint16_t)(p[0] | p[1] << 8);
      MOE_TRY((h & inf) != inf, MOE_ERR_VALUE, "%s: tensor '%s' (%s) has a non-finite %s at row %lld, block %lld",
              r->file->path, r->name[j], moe_gguf_type_name(r->type[j]), bb == 2 ? "value" : "scale",
              (long long)(e * r->rows[j] + (int64_t)(i * bb / r->row[j])), (long long)(i % (r->row[j] / bb)));
    }
  return MOE_OK;
}

/* Tensor j of expert e into out: a weight's bytes as stored (checked), or rows x cols floats, every value
 * finite. */
static moe_status read_slice(gguf_reader *r, int j, int e, float *out, int drop) {
  off_t at = (off_t)(r->offset[j] + (uint64_t)e * r->slice[j]);
  int raw = r->stored && !(j % 2);
  uint8_t *dst = raw ? (uint8_t *)(void *)out : r->buf;
  char what[96];
  snprintf(what, sizeof what, "tensor '%s'", r->name[j]);
  MOE_CHECK(moe__pread_all(r->file->fd, r->file->path, what, at, dst, r->slice[j]));
  if (drop) posix_fadvise(r->file->fd, at, (off_t)r->slice[j], POSIX_FADV_DONTNEED);
  if (raw) return check_stored(r, j, e, dst);
  /* the rows at once: blocks never straddle rows, and one call splits them over threads */
  MOE_CHECK(moe_gguf_dequantize(r->type[j], r->buf, out, r->rows[j] * r->cols[j]));
  for (int64_t i = 0; i < r->rows[j] * r->cols[j]; i++)
    MOE_TRY(isfinite(out[i]), MOE_ERR_VALUE, "%s: tensor '%s' has a non-finite value, %g, at row %lld column %lld",
            r->file->path, r->name[j], (double)out[i], (long long)(e * r->rows[j] + i / r->cols[j]), (long long)(i % r->cols[j]));
  return MOE_OK;
}

static moe_status reader_read(void *ctx, int e, float *const out[6], int drop) {
  gguf_reader *r = ctx;
  for (int j = 0; j < 6; j++) {
    MOE_TRY(!out[j] || r->have[j], MOE_ERR_STATE, "%s: the cache asks for a tensor the layer's reader has not (%d)",
            r->file->path, j);
    if (out[j]) MOE_CHECK(read_slice(r, j, e, out[j], drop));
  }
  return MOE_OK;
}

/* Tensor j of layer `layer` (j as in gguf_reader) into r: its place, type and shape checked against
 * the config's; *most: the largest slice read as floats so far. */
static moe_status find_tensor(const moe_gguf *g, gguf_reader *r, const moe_lm_config *c, int layer, int j, size_t *most) {
  static const char *const stacks[3] = {"gate", "down", "up"};
  const char *path = r->file->path;
  int64_t D = c->moe.D, H = c->moe.H, E = c->moe.E, n = j / 2 == 1 ? D : H;
  int bias = j % 2;
  int64_t cols = bias ? n : j == 2 ? H : D, rows = bias ? 1 : n;
  snprintf(r->name[j], sizeof r->name[j], "blk.%d.ffn_%s_exps.%s", layer, stacks[j / 2], bias ? "bias" : "weight");
  moe_gguf_tensor t;
  MOE_CHECK(moe_gguf_tensor_get(g, r->name[j], &t));
  int nd = bias ? 2 : 3;
  const int64_t want[3] = {cols, bias ? E : rows, E};
  int fits = t.ndim == nd;
  for (int k = 0; k < nd && fits; k++) fits = t.ne[k] == want[k];
  char w[80];
  snprintf(w, sizeof w, bias ? "%lld, %lld" : "%lld, %lld, %lld", (long long)want[0], (long long)want[1], (long long)E);
  MOE_TRY(fits, MOE_ERR_SHAPE, "%s: tensor '%s' is [%lld, %lld, %lld] (%d dims), want [%s]", path, r->name[j],
          (long long)t.ne[0], (long long)t.ne[1], (long long)t.ne[2], t.ndim, w);
  MOE_TRY(moe_gguf_type_supported(t.type) && cols % moe_gguf_type_block(t.type) == 0, MOE_ERR_DTYPE,
          "%s: tensor '%s': type %s cannot be read as floats here", path, r->name[j], moe_gguf_type_name(t.type));
  r->have[j] = 1, r->type[j] = t.type, r->rows[j] = rows, r->cols[j] = cols, r->offset[j] = t.file_offset;
  r->row[j] = (size_t)(cols / moe_gguf_type_block(t.type)) * moe_gguf_type_block_bytes(t.type);
  r->slice[j] = (size_t)rows * r->row[j];
  if ((bias || !r->stored) && r->slice[j] > *most) *most = r->slice[j];
  return MOE_OK;
}

moe_status moe__lm_gguf_expert_reader(const moe_gguf *g, moe__lm_gguf_fd *f, const moe_lm_config *c, int layer,
                                      moe__expert_reader *out) {
  gguf_reader *r = calloc(1, sizeof *r);
  MOE_TRY(r, MOE_ERR_NOMEM, "%s: out of memory", f->path);
  r->file = f;
  f->refs++;
  r->stored = c->moe.expert_type > 0;
  moe_status st = MOE_OK;
  size_t most = 0, read = 0;
  for (int j = 0; j < 6 && st == MOE_OK; j++)
    if (!(j % 2) || c->moe.expert_bias) st = find_tensor(g, r, c, layer, j, &most), read += r->slice[j];
  if (st == MOE_OK && most && !(r->buf = malloc(most)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory for an expert's rows", f->path);
  if (st != MOE_OK) {
    reader_free(r);
    return st;
  }
  *out = (moe__expert_reader){.ctx = r, .read = reader_read, .free = reader_free, .file_bytes = read};
  for (int j = 0; j < 3 && r->stored; j++) out->type[j] = r->type[2 * j];
  return MOE_OK;
}
