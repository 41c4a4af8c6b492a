/* A GGUF file's routed experts read one expert at a time for an expert cache (cache_reader.h;
 * moe_lm_load_streaming): expert e's rows of the stacked blk.<i>.ffn_{gate,down,up}_exps.weight (its
 * slice of each is contiguous: the expert is the outermost dimension) are read with pread, never
 * through the mapping (a file cut short is an error, not a SIGBUS), and dequantized, all its rows in one call, with
 * the codec the resident loader uses (moe_gguf_dequantize), so the slots hold its values bit for bit;
 * each projection in its own stored type. With moe.expert_type > 0 (the experts compute in their stored
 * types, as the resident model binds them) the slots hold the file's bytes as they are, and a read
 * checks the blocks' fp16 scales (Q8_0, Q4_0: d; Q4_K, Q5_K: d and dmin; Q6_K: d) or every F16 and BF16
 * value for a NaN or Inf; MXFP4's e8m0 scales have no non-finite value to check. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "lm_gguf.h"

typedef struct {
  int fd;
  char path[4096];
  char name[3][64];        /* fc1 (gate), fc2 (down), fc3 (up) */
  moe_gguf_type type[3];
  int64_t rows[3], cols[3];
  uint64_t offset[3];      /* the tensor's data in the file */
  size_t slice[3], row[3]; /* bytes of one expert's rows, of one row */
  uint8_t *buf;            /* the largest slice (dequantized slots) */
  int stored;              /* slots of the file's bytes */
} gguf_reader;

static void reader_free(void *ctx) {
  gguf_reader *r = ctx;
  if (!r) return;
  if (r->fd >= 0) close(r->fd);
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

/* Projection j's bytes b of expert e: its blocks' scales (or values) finite, else an error naming the row. */
static moe_status check_stored(const gguf_reader *r, int j, int e, const uint8_t *b) {
  size_t off[2], bb = moe_gguf_type_block_bytes(r->type[j]), n = r->slice[j] / bb;
  int bf16, k = checked_halves(r->type[j], off, &bf16);
  uint16_t inf = bf16 ? 0x7f80 : 0x7c00; /* the exponent all ones */
  for (size_t i = 0; i < n; i++)
    for (int f = 0; f < k; f++) {
      const uint8_t *p = b + i * bb + off[f];
      uint16_t h = (uint16_t)(p[0] | p[1] << 8);
      MOE_TRY((h & inf) != inf, MOE_ERR_VALUE, "%s: tensor '%s' (%s) has a non-finite %s at row %lld, block %lld",
              r->path, r->name[j], moe_gguf_type_name(r->type[j]), bb == 2 ? "value" : "scale",
              (long long)(e * r->rows[j] + (int64_t)(i * bb / r->row[j])), (long long)(i % (r->row[j] / bb)));
    }
  return MOE_OK;
}

/* Projection j of expert e into out: its bytes as stored (checked), or rows x cols floats, every value finite. */
static moe_status read_slice(gguf_reader *r, int j, int e, float *out, int drop) {
  off_t at = (off_t)(r->offset[j] + (uint64_t)e * r->slice[j]);
  uint8_t *dst = r->stored ? (uint8_t *)(void *)out : r->buf;
  for (size_t done = 0; done < r->slice[j];) { /* pread may return short counts */
    ssize_t n = pread(r->fd, dst + done, r->slice[j] - done, at + (off_t)done);
    if (n < 0 && errno == EINTR) continue;
    MOE_TRY(n > 0, MOE_ERR_IO, "%s: reading tensor '%s': %s", r->path, r->name[j], n < 0 ? strerror(errno) : "file shrank");
    done += (size_t)n;
  }
  if (drop) posix_fadvise(r->fd, at, (off_t)r->slice[j], POSIX_FADV_DONTNEED);
  if (r->stored) return check_stored(r, j, e, dst);
  /* the rows at once: blocks never straddle rows, and one call splits them over threads */
  MOE_CHECK(moe_gguf_dequantize(r->type[j], r->buf, out, r->rows[j] * r->cols[j]));
  for (int64_t i = 0; i < r->rows[j] * r->cols[j]; i++)
    MOE_TRY(isfinite(out[i]), MOE_ERR_VALUE, "%s: tensor '%s' has a non-finite value, %g, at row %lld column %lld",
            r->path, r->name[j], (double)out[i], (long long)(e * r->rows[j] + i / r->cols[j]), (long long)(i % r->cols[j]));
  return MOE_OK;
}

static moe_status reader_read(void *ctx, int e, float *const out[6], int drop) {
  for (int j = 0; j < 3; j++)
    if (out[2 * j]) MOE_CHECK(read_slice(ctx, j, e, out[2 * j], drop));
  return MOE_OK;
}

moe_status moe__lm_gguf_expert_reader(const char *path, const moe_lm_config *c, int layer, moe__expert_reader *out) {
  MOE_TRY(!c->moe.expert_bias, MOE_ERR_ARG, "%s: streamed GGUF experts have no biases here", path);
  gguf_reader *r = calloc(1, sizeof *r);
  MOE_TRY(r, MOE_ERR_NOMEM, "%s: out of memory", path);
  r->fd = -1;
  r->stored = c->moe.expert_type > 0;
  snprintf(r->path, sizeof r->path, "%s", path);
  moe_gguf *g = NULL;
  moe_status st = moe_gguf_open(&g, path);
  static const char *const stacks[3] = {"gate", "down", "up"};
  int64_t D = c->moe.D, H = c->moe.H, E = c->moe.E, most = 0;
  for (int j = 0; j < 3 && st == MOE_OK; j++) {
    moe_gguf_tensor t;
    snprintf(r->name[j], sizeof r->name[j], "blk.%d.ffn_%s_exps.weight", layer, stacks[j]);
    st = moe_gguf_tensor_get(g, r->name[j], &t);
    int64_t cols = j == 1 ? H : D, rows = j == 1 ? D : H;
    if (st == MOE_OK && (t.ndim != 3 || t.ne[0] != cols || t.ne[1] != rows || t.ne[2] != E))
      st = moe__error(MOE_ERR_SHAPE, __FILE__, __LINE__, "%s: tensor '%s' is [%lld, %lld, %lld], want [%lld, %lld, %lld]",
                      path, r->name[j], (long long)t.ne[0], (long long)t.ne[1], (long long)t.ne[2], (long long)cols,
                      (long long)rows, (long long)E);
    if (st == MOE_OK && !moe_gguf_type_supported(t.type))
      st = moe__error(MOE_ERR_DTYPE, __FILE__, __LINE__, "%s: tensor '%s': type %s cannot be read as floats here", path,
                      r->name[j], moe_gguf_type_name(t.type));
    if (st != MOE_OK) break;
    r->type[j] = t.type, r->rows[j] = rows, r->cols[j] = cols, r->offset[j] = t.file_offset;
    r->row[j] = (size_t)(cols / moe_gguf_type_block(t.type)) * moe_gguf_type_block_bytes(t.type);
    r->slice[j] = (size_t)rows * r->row[j];
    most = (int64_t)r->slice[j] > most ? (int64_t)r->slice[j] : most;
  }
  moe_gguf_close(g);
  if (st == MOE_OK && (r->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
    st = moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: %s", path, strerror(errno));
  if (st == MOE_OK && !r->stored && !(r->buf = malloc((size_t)most)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory for an expert's rows", path);
  if (st != MOE_OK) {
    reader_free(r);
    return st;
  }
  *out = (moe__expert_reader){.ctx = r, .read = reader_read, .free = reader_free,
                              .file_bytes = r->slice[0] + r->slice[1] + r->slice[2]};
  for (int j = 0; j < 3 && r->stored; j++) out->type[j] = r->type[j];
  return MOE_OK;
}
