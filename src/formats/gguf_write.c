/* The GGUF writer: metadata entries are kept encoded as the file stores them (type id, then the value),
 * tensors as pointers to the caller's data or as fill callbacks; save lays out the header, the entries,
 * the tensor infos (every size follows from shape and type) and the data, each tensor at an offset
 * aligned to general.alignment and padded with zeros, and writes it all atomically. A filled tensor's
 * bytes are made at save, a chunk at a time, into one buffer reused for every chunk of every tensor:
 * a file of any size is written holding the largest chunk. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "formats/atomic_file.h"
#include "formats/gguf.h"
#include "internal.h"

typedef struct {
  char *key;
  uint8_t *val; /* type id, then the value */
  size_t n;
} wkv;

typedef struct {
  char *name;
  moe_gguf_type type;
  int ndim;
  int64_t ne[4];
  const void *data;
  size_t nbytes;
  moe_fill_fn fill; /* or NULL: data */
  void *ctx;
  size_t chunk;          /* bytes a fill call makes (the last may be fewer) */
} wtensor;

struct moe_gguf_writer {
  wkv *kv;
  int64_t nkv, kv_cap;
  wtensor *t;
  int64_t nt, t_cap;
  size_t chunk; /* the largest chunk of a filled tensor: the buffer save makes them in */
};

moe_status moe_gguf_writer_new(moe_gguf_writer **out) {
  MOE_TRY(out, MOE_ERR_ARG, "moe_gguf_writer_new: NULL out");
  *out = calloc(1, sizeof **out);
  MOE_TRY(*out, MOE_ERR_NOMEM, "moe_gguf_writer_new: out of memory");
  return MOE_OK;
}

void moe_gguf_writer_free(moe_gguf_writer *w) {
  if (!w) return;
  for (int64_t i = 0; i < w->nkv; i++) free(w->kv[i].key), free(w->kv[i].val);
  for (int64_t i = 0; i < w->nt; i++) free(w->t[i].name);
  free(w->kv), free(w->t), free(w);
}

/* A growing byte buffer for encoding values. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
  int failed;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->failed) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p, b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void put_le(buf *b, uint64_t v, int n) {
  uint8_t x[8];
  for (int i = 0; i < n; i++) x[i] = (uint8_t)(v >> (8 * i));
  put(b, x, (size_t)n);
}

static void put_str(buf *b, const char *s) {
  size_t n = strlen(s);
  put_le(b, n, 8);
  put(b, s, n);
}

static moe_status check_key(const char *key) {
  MOE_TRY(key && *key, MOE_ERR_ARG, "GGUF writer: empty or NULL metadata key");
  size_t n = strlen(key);
  MOE_TRY(n <= MOE__GGUF_MAX_KEY, MOE_ERR_ARG, "GGUF writer: metadata key of %zu bytes (at most %d)", n,
          MOE__GGUF_MAX_KEY);
  for (size_t i = 0; i < n; i++)
    MOE_TRY(key[i] >= 0x20 && key[i] <= 0x7e, MOE_ERR_ARG, "GGUF writer: metadata key '%s' is not printable ASCII",
            key);
  return MOE_OK;
}

/* Sets key to the encoded value (taking b's bytes): replacing its value in place when it is there. */
static moe_status set(moe_gguf_writer *w, const char *key, buf *b) {
  moe_status st = check_key(key);
  if (st == MOE_OK && b->failed) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "'%s': out of memory", key);
  int64_t i = 0;
  while (st == MOE_OK && i < w->nkv && strcmp(w->kv[i].key, key)) i++;
  if (st == MOE_OK && i == w->nkv) {
    if (w->nkv == w->kv_cap) {
      int64_t cap = w->kv_cap ? 2 * w->kv_cap : 16;
      wkv *kv = realloc(w->kv, (size_t)cap * sizeof *kv);
      if (!kv) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "'%s': out of memory", key);
      else w->kv = kv, w->kv_cap = cap;
    }
    char *k = st == MOE_OK ? strdup(key) : NULL;
    if (st == MOE_OK && !k) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "'%s': out of memory", key);
    if (st == MOE_OK) w->kv[w->nkv++] = (wkv){k, NULL, 0};
  }
  if (st != MOE_OK) {
    free(b->p);
    return st;
  }
  free(w->kv[i].val);
  w->kv[i].val = b->p, w->kv[i].n = b->n;
  return MOE_OK;
}

static moe_status set_scalar(moe_gguf_writer *w, const char *key, moe_gguf_vtype t, uint64_t bits) {
  buf b = {0};
  put_le(&b, t, 4);
  put_le(&b, bits, (int)moe__gguf_vsize(t));
  return set(w, key, &b);
}

moe_status moe_gguf_writer_set_u32(moe_gguf_writer *w, const char *key, uint32_t v) {
  return set_scalar(w, key, MOE_GGUFV_U32, v);
}
moe_status moe_gguf_writer_set_i32(moe_gguf_writer *w, const char *key, int32_t v) {
  return set_scalar(w, key, MOE_GGUFV_I32, (uint32_t)v);
}
moe_status moe_gguf_writer_set_u64(moe_gguf_writer *w, const char *key, uint64_t v) {
  return set_scalar(w, key, MOE_GGUFV_U64, v);
}
moe_status moe_gguf_writer_set_f32(moe_gguf_writer *w, const char *key, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return set_scalar(w, key, MOE_GGUFV_F32, u);
}
moe_status moe_gguf_writer_set_bool(moe_gguf_writer *w, const char *key, int v) {
  return set_scalar(w, key, MOE_GGUFV_BOOL, v != 0);
}

moe_status moe_gguf_writer_set_str(moe_gguf_writer *w, const char *key, const char *v) {
  MOE_TRY(v, MOE_ERR_ARG, "GGUF writer: '%s': NULL string", key ? key : "(NULL)");
  buf b = {0};
  put_le(&b, MOE_GGUFV_STRING, 4);
  put_str(&b, v);
  return set(w, key, &b);
}

static void arr_head(buf *b, moe_gguf_vtype elem, uint64_t n) {
  put_le(b, MOE_GGUFV_ARRAY, 4);
  put_le(b, elem, 4);
  put_le(b, n, 8);
}

moe_status moe_gguf_writer_set_arr_str(moe_gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
  buf b = {0};
  arr_head(&b, MOE_GGUFV_STRING, n);
  for (uint64_t i = 0; i < n; i++) {
    if (!v[i]) {
      free(b.p);
      return moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "GGUF writer: '%s': string %" PRIu64 " is NULL", key, i);
    }
    put_str(&b, v[i]);
  }
  return set(w, key, &b);
}

moe_status moe_gguf_writer_set_arr_i32(moe_gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
  buf b = {0};
  arr_head(&b, MOE_GGUFV_I32, n);
  for (uint64_t i = 0; i < n; i++) put_le(&b, (uint32_t)v[i], 4);
  return set(w, key, &b);
}

moe_status moe_gguf_writer_set_arr_f32(moe_gguf_writer *w, const char *key, const float *v, uint64_t n) {
  buf b = {0};
  arr_head(&b, MOE_GGUFV_F32, n);
  for (uint64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &v[i], 4);
    put_le(&b, u, 4);
  }
  return set(w, key, &b);
}

moe_status moe_gguf_writer_copy_kv(moe_gguf_writer *w, const moe_gguf *g, int64_t i) {
  moe_gguf_kv kv;
  MOE_CHECK(moe_gguf_kv_at(g, i, &kv));
  const void *p;
  size_t n;
  moe__gguf_kv_raw(g, i, &p, &n);
  buf b = {0};
  put(&b, p, n);
  return set(w, kv.key, &b);
}

/* Checks a tensor's name, type and shape, and appends it (its data not set): its bytes into *nbytes. */
static moe_status add(moe_gguf_writer *w, const char *name, moe_gguf_type type, int ndim, const int64_t *ne,
                      wtensor **out, uint64_t *nbytes) {
  MOE_TRY(name && *name, MOE_ERR_ARG, "GGUF writer: empty or NULL tensor name");
  /* at most 63 bytes: what llama.cpp loads */
  MOE_TRY(strlen(name) < MOE__GGUF_MAX_NAME, MOE_ERR_ARG, "GGUF writer: tensor name '%s' is longer than %d bytes",
          name, MOE__GGUF_MAX_NAME - 1);
  MOE_TRY(moe_gguf_type_name(type), MOE_ERR_ARG, "GGUF writer: tensor '%s': unknown type %d", name, (int)type);
  MOE_TRY(ndim >= 1 && ndim <= MOE__GGUF_MAX_DIMS, MOE_ERR_ARG, "GGUF writer: tensor '%s': %d dims (want 1-4)", name,
          ndim);
  int64_t nonzero = 1, count; /* the product of the non-zero dims must fit, as the reader wants */
  int empty = 0;
  for (int d = 0; d < ndim; d++) {
    MOE_TRY(ne[d] >= 0 && (ne[d] == 0 || nonzero <= INT64_MAX / ne[d]), MOE_ERR_ARG,
            "GGUF writer: tensor '%s': bad dimension %d = %" PRId64, name, d, ne[d]);
    if (ne[d]) nonzero *= ne[d];
    else empty = 1;
  }
  count = empty ? 0 : nonzero;
  int blk = moe_gguf_type_block(type);
  MOE_TRY(ne[0] % blk == 0, MOE_ERR_SHAPE, "GGUF writer: tensor '%s': row length %" PRId64
          " is not a multiple of %s's block of %d", name, ne[0], moe_gguf_type_name(type), blk);
  *nbytes = (uint64_t)(count / blk) * moe_gguf_type_block_bytes(type);
  for (int64_t i = 0; i < w->nt; i++)
    MOE_TRY(strcmp(w->t[i].name, name), MOE_ERR_ARG, "GGUF writer: duplicate tensor name '%s'", name);
  if (w->nt == w->t_cap) {
    int64_t cap = w->t_cap ? 2 * w->t_cap : 16;
    wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
    MOE_TRY(t, MOE_ERR_NOMEM, "GGUF writer: out of memory");
    w->t = t, w->t_cap = cap;
  }
  wtensor *t = &w->t[w->nt];
  *t = (wtensor){.name = strdup(name), .type = type, .ndim = ndim, .nbytes = (size_t)*nbytes};
  MOE_TRY(t->name, MOE_ERR_NOMEM, "GGUF writer: out of memory");
  for (int d = 0; d < 4; d++) t->ne[d] = d < ndim ? ne[d] : 1;
  w->nt++;
  *out = t;
  return MOE_OK;
}

moe_status moe_gguf_writer_add_tensor(moe_gguf_writer *w, const char *name, moe_gguf_type type, int ndim,
                                      const int64_t *ne, const void *data, size_t nbytes) {
  wtensor *t;
  uint64_t need;
  MOE_TRY(data || !nbytes, MOE_ERR_ARG, "GGUF writer: tensor '%s': NULL data", name ? name : "(NULL)");
  MOE_CHECK(add(w, name, type, ndim, ne, &t, &need));
  if (nbytes != need) {
    w->nt--, free(t->name);
    MOE_TRY(0, MOE_ERR_SHAPE, "GGUF writer: tensor '%s': %zu bytes given, its shape as %s takes %" PRIu64, name,
            nbytes, moe_gguf_type_name(type), need);
  }
  t->data = data;
  return MOE_OK;
}

moe_status moe_gguf_writer_add_tensor_fill(moe_gguf_writer *w, const char *name, moe_gguf_type type, int ndim,
                                           const int64_t *ne, size_t chunk, moe_fill_fn fill, void *ctx) {
  wtensor *t;
  uint64_t n;
  MOE_TRY(fill, MOE_ERR_ARG, "GGUF writer: tensor '%s': NULL fill", name ? name : "(NULL)");
  MOE_CHECK(add(w, name, type, ndim, ne, &t, &n));
  t->fill = fill, t->ctx = ctx, t->chunk = chunk && chunk < t->nbytes ? chunk : t->nbytes;
  if (w->chunk < t->chunk) w->chunk = t->chunk;
  return MOE_OK;
}

/* general.alignment when set: a u32 power of two. */
static moe_status alignment(const moe_gguf_writer *w, uint64_t *a) {
  *a = MOE__GGUF_ALIGNMENT;
  for (int64_t i = 0; i < w->nkv; i++) {
    if (strcmp(w->kv[i].key, "general.alignment")) continue;
    const uint8_t *v = w->kv[i].val;
    MOE_TRY(w->kv[i].n == 8 && v[0] == MOE_GGUFV_U32 && !v[1] && !v[2] && !v[3], MOE_ERR_ARG,
            "GGUF writer: general.alignment must be a u32");
    *a = (uint64_t)v[4] | (uint64_t)v[5] << 8 | (uint64_t)v[6] << 16 | (uint64_t)v[7] << 24;
    MOE_TRY(*a && !(*a & (*a - 1)), MOE_ERR_ARG, "GGUF writer: general.alignment %" PRIu64 " is not a power of two",
            *a);
  }
  return MOE_OK;
}

typedef struct {
  const moe_gguf_writer *w;
  buf head; /* everything before the data section, padding included */
  uint64_t align;
  void *chunk;          /* the filled tensors' buffer */
  moe_status fill_st;   /* a fill's error, and its message */
  char fill_msg[512];
} save_ctx;

static int write_zeros(FILE *fp, uint64_t n) {
  static const uint8_t z[256];
  for (; n; n -= n < sizeof z ? n : sizeof z)
    if (fwrite(z, 1, n < sizeof z ? n : sizeof z, fp) != (n < sizeof z ? n : sizeof z)) return 0;
  return 1;
}

/* t's bytes, from its data or chunk by chunk from its fill (an error kept in c). */
static int write_tensor(FILE *fp, save_ctx *c, const wtensor *t) {
  if (!t->fill) return !t->nbytes || fwrite(t->data, 1, t->nbytes, fp) == t->nbytes;
  for (size_t off = 0; off < t->nbytes; off += t->chunk) {
    size_t n = t->nbytes - off < t->chunk ? t->nbytes - off : t->chunk;
    if ((c->fill_st = t->fill(t->ctx, off, c->chunk, n)) != MOE_OK) {
      snprintf(c->fill_msg, sizeof c->fill_msg, "%s", moe_last_error());
      return 0;
    }
    if (fwrite(c->chunk, 1, n, fp) != n) return 0;
  }
  return 1;
}

static int write_file(FILE *fp, void *ctx, char *msg, size_t n) {
  (void)msg, (void)n;
  save_ctx *c = ctx;
  if (fwrite(c->head.p, 1, c->head.n, fp) != c->head.n) return 0;
  for (int64_t i = 0; i < c->w->nt; i++) {
    const wtensor *t = &c->w->t[i];
    uint64_t pad = (c->align - t->nbytes % c->align) % c->align;
    if (!write_tensor(fp, c, t) || !write_zeros(fp, pad)) return 0;
  }
  return 1;
}

moe_status moe_gguf_writer_save(moe_gguf_writer *w, const char *path) {
  MOE_TRY(w && path, MOE_ERR_ARG, "moe_gguf_writer_save: NULL %s", w ? "path" : "writer");
  save_ctx c = {.w = w};
  MOE_CHECK(alignment(w, &c.align));
  buf *h = &c.head;
  put(h, "GGUF", 4);
  put_le(h, MOE__GGUF_VERSION, 4);
  put_le(h, (uint64_t)w->nt, 8);
  put_le(h, (uint64_t)w->nkv, 8);
  for (int64_t i = 0; i < w->nkv; i++) {
    put_str(h, w->kv[i].key);
    put(h, w->kv[i].val, w->kv[i].n);
  }
  uint64_t off = 0;
  for (int64_t i = 0; i < w->nt; i++) {
    const wtensor *t = &w->t[i];
    put_str(h, t->name);
    put_le(h, (uint64_t)t->ndim, 4);
    for (int d = 0; d < t->ndim; d++) put_le(h, (uint64_t)t->ne[d], 8);
    put_le(h, (uint64_t)t->type, 4);
    put_le(h, off, 8);
    off += t->nbytes + (c.align - t->nbytes % c.align) % c.align;
  }
  static const uint8_t zeros[1 << 12];
  uint64_t pad = (c.align - h->n % c.align) % c.align;
  for (; pad; pad -= pad < sizeof zeros ? pad : sizeof zeros) put(h, zeros, pad < sizeof zeros ? pad : sizeof zeros);
  c.chunk = w->chunk ? malloc(w->chunk) : NULL;
  moe_status st = h->failed || (w->chunk && !c.chunk)
                      ? moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory for the header or a chunk of %zu bytes",
                                   path, w->chunk)
                      : moe__save_atomic(path, write_file, &c);
  if (c.fill_st != MOE_OK) /* the file is not written: the fill's own error, not a write's */
    st = moe__error(c.fill_st, __FILE__, __LINE__, "%s", c.fill_msg);
  free(h->p), free(c.chunk);
  return st;
}

int moe_gguf_file_type(moe_gguf_type t) {
  switch (t) {
    case MOE_GGUF_F32: return 0;
    case MOE_GGUF_F16: return 1;
    case MOE_GGUF_Q4_0: return 2;
    case MOE_GGUF_Q8_0: return 7;
    case MOE_GGUF_Q4_K: return 14; /* MOSTLY_Q4_K_S: all Q4_K */
    case MOE_GGUF_Q5_K: return 16; /* MOSTLY_Q5_K_S */
    case MOE_GGUF_Q6_K: return 18;
    case MOE_GGUF_BF16: return 32;
    case MOE_GGUF_MXFP4: return 38; /* MOSTLY_MXFP4_MOE */
  }
  return -1;
}
