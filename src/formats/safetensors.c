/* Safetensors reading and writing. The reader loads a whole file into memory and validates it
 * strictly (bounded header, known dtypes, shapes matching byte counts, offsets aligned to the dtype,
 * tensors covering the data region exactly once, no duplicate names, string-only __metadata__), so
 * the rest of the library can trust every view it hands out. The writer collects copies of tensors (or fill callbacks, made a chunk at a time into one buffer at save)
 * and writes them atomically (temp file, fsync, rename). A lazily opened file reads through its
 * descriptor (moe_st_read), which the language model's loader also maps tensors from (lm_map.h). Not
 * supported: dtypes other than those in moe_dtype, and files whose tensors are not aligned to their
 * element size (the current HuggingFace writer always aligns them). */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "base/pread_all.h"
#include "formats/atomic_file.h"
#include "internal.h"
#include "formats/json.h"

#define ST_MAX_HEADER (100u << 20) /* bound what a hostile header length can make us allocate */
#define ST_MAX_INT (UINT64_C(1) << 53) /* JSON numbers are doubles; above this they are inexact */

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Bytes of a tensor; *ok = 0 when that overflows size_t. */
static uint64_t shape_bytes(const int64_t *shape, int ndim, size_t elsize, int *ok) {
  uint64_t n = 1;
  *ok = 1;
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return 0; /* a zero dim wins over any overflow of the others */
  for (int i = 0; i < ndim; i++) {
    if (n > UINT64_MAX / (uint64_t)shape[i]) { *ok = 0; return 0; }
    n *= (uint64_t)shape[i];
  }
  if (n > SIZE_MAX / elsize) { *ok = 0; return 0; }
  return n * elsize;
}

/* ---------------------------------------------------------------- reader */

typedef struct {
  const char *name; /* owned by the cJSON tree */
  moe_dtype dt;
  int ndim;
  int64_t shape[MOE_MAX_DIMS];
  uint64_t begin, end;
} st_entry;

struct moe_st {
  char *path;
  char *hdr;         /* raw header text, freed once parsed */
  cJSON *root;       /* kept: owns tensor names and metadata strings */
  const cJSON *meta; /* the __metadata__ object or NULL */
  st_entry *t;       /* sorted by data offset */
  const st_entry **byname; /* sorted by name, for lookup */
  int n;
  unsigned char *data; /* the data region, 64-byte aligned; NULL when lazy */
  size_t data_size;
  uint64_t data_start;  /* file offset of the data region */
  int fd;               /* lazy: open for pread, else -1 */
};

void moe_st_close(moe_st *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  cJSON_Delete(f->root);
  free(f->path), free(f->hdr), free(f->t), free(f->byname), free(f->data), free(f);
}

static moe_status read_exact(const moe_st *f, FILE *fp, void *buf, size_t n, const char *what) {
  if (n == 0 || fread(buf, 1, n, fp) == n) return MOE_OK;
  if (ferror(fp))
    return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: reading %s: %s", f->path, what, strerror(errno));
  return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: unexpected end of file reading %s (file changed?)",
                    f->path, what);
}

/* Reads the header text into f->hdr and, unless lazy, the data region into f->data. */
static moe_status st_read(moe_st *f, FILE *fp, size_t *hlen, int lazy) {
  struct stat sb;
  MOE_TRY(fstat(fileno(fp), &sb) == 0, MOE_ERR_IO, "%s: stat: %s", f->path, strerror(errno));
  MOE_TRY(S_ISREG(sb.st_mode), MOE_ERR_IO, "%s: not a regular file", f->path);
  uint64_t size = (uint64_t)sb.st_size;
  MOE_TRY(size >= 8, MOE_ERR_FORMAT, "%s: file is %" PRIu64 " bytes, shorter than the 8-byte header length",
          f->path, size);
  unsigned char lb[8];
  MOE_CHECK(read_exact(f, fp, lb, 8, "the header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | lb[i];
  MOE_TRY(n > 0, MOE_ERR_FORMAT, "%s: header length is 0", f->path);
  MOE_TRY(n <= ST_MAX_HEADER, MOE_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the limit of %u bytes",
          f->path, n, ST_MAX_HEADER);
  MOE_TRY(n <= size - 8, MOE_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the file size %" PRIu64,
          f->path, n, size);
  MOE_TRY(size - 8 - n <= SIZE_MAX - 64, MOE_ERR_NOMEM, "%s: data region too large", f->path);
  f->data_size = (size_t)(size - 8 - n);
  *hlen = (size_t)n;
  f->hdr = malloc(*hlen + 1);
  MOE_TRY(f->hdr, MOE_ERR_NOMEM, "%s: out of memory for a %zu-byte header", f->path, *hlen);
  MOE_CHECK(read_exact(f, fp, f->hdr, *hlen, "the header"));
  f->hdr[*hlen] = '\0';
  f->data_start = 8 + n;
  if (lazy) return MOE_OK;
  /* Copy the data region to an aligned buffer so that aligned offsets give aligned pointers. */
  f->data = aligned_alloc(64, (f->data_size + 64) / 64 * 64);
  MOE_TRY(f->data, MOE_ERR_NOMEM, "%s: out of memory for %zu bytes of tensor data", f->path, f->data_size);
  return read_exact(f, fp, f->data, f->data_size, "tensor data");
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static int json_u64(const cJSON *x, uint64_t *out) {
  if (!cJSON_IsNumber(x)) return 0;
  double d = x->valuedouble;
  if (!(d >= 0 && d <= (double)ST_MAX_INT) || (double)(uint64_t)d != d) return 0;
  *out = (uint64_t)d;
  return 1;
}

static const char *json_desc(const cJSON *x, char *buf, size_t n) {
  if (cJSON_IsNumber(x)) snprintf(buf, n, "%.17g", x->valuedouble);
  else if (cJSON_IsString(x)) snprintf(buf, n, "\"%.40s\"", x->valuestring);
  else snprintf(buf, n, "%s", cJSON_IsArray(x) ? "an array" : cJSON_IsObject(x) ? "an object" : "null/bool");
  return buf;
}

#define BAD(...) moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, __VA_ARGS__)

static moe_status parse_entry(moe_st *f, const cJSON *it, st_entry *e) {
  const char *p = f->path, *nm = it->string;
  char vb[64];
  e->name = nm;
  if (!nm[0]) return BAD("%s: empty tensor name", p);
  if (!cJSON_IsObject(it)) return BAD("%s: tensor '%s': entry is %s, not an object", p, nm, json_desc(it, vb, 64));
  const cJSON *dt = NULL, *sh = NULL, *off = NULL, *k;
  cJSON_ArrayForEach(k, it) {
    const cJSON **slot = !strcmp(k->string, "dtype") ? &dt : !strcmp(k->string, "shape") ? &sh
                       : !strcmp(k->string, "data_offsets") ? &off : NULL;
    if (!slot) return BAD("%s: tensor '%s': unknown key '%s'", p, nm, k->string);
    if (*slot) return BAD("%s: tensor '%s': duplicate key '%s'", p, nm, k->string);
    *slot = k;
  }
  if (!dt || !sh || !off)
    return BAD("%s: tensor '%s': missing '%s'", p, nm, !dt ? "dtype" : !sh ? "shape" : "data_offsets");
  if (!cJSON_IsString(dt)) return BAD("%s: tensor '%s': dtype is %s, not a string", p, nm, json_desc(dt, vb, 64));
  int d = 0;
  while (d < MOE_DT_COUNT && strcmp(dt->valuestring, moe_dtype_name(d))) d++;
  MOE_TRY(d < MOE_DT_COUNT, MOE_ERR_DTYPE, "%s: tensor '%s': unknown dtype '%s'", p, nm, dt->valuestring);
  e->dt = (moe_dtype)d;
  if (!cJSON_IsArray(sh)) return BAD("%s: tensor '%s': shape is %s, not an array", p, nm, json_desc(sh, vb, 64));
  int nd = cJSON_GetArraySize(sh);
  if (nd > MOE_MAX_DIMS) return BAD("%s: tensor '%s': shape has %d dims, more than %d", p, nm, nd, MOE_MAX_DIMS);
  e->ndim = nd;
  for (int i = 0; i < nd; i++) {
    const cJSON *x = cJSON_GetArrayItem(sh, i);
    uint64_t v;
    if (!json_u64(x, &v))
      return BAD("%s: tensor '%s': shape[%d] = %s is not a non-negative integer", p, nm, i, json_desc(x, vb, 64));
    e->shape[i] = (int64_t)v;
  }
  int ok;
  uint64_t nbytes = shape_bytes(e->shape, nd, moe_dtype_size(d), &ok);
  if (!ok) return BAD("%s: tensor '%s': element count of the shape overflows", p, nm);
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
    return BAD("%s: tensor '%s': data_offsets is %s, not [begin, end]", p, nm, json_desc(off, vb, 64));
  for (int i = 0; i < 2; i++) {
    const cJSON *x = cJSON_GetArrayItem(off, i);
    if (!json_u64(x, i ? &e->end : &e->begin))
      return BAD("%s: tensor '%s': data_offsets[%d] = %s is not a non-negative integer", p, nm, i,
                 json_desc(x, vb, 64));
  }
  if (e->begin > e->end)
    return BAD("%s: tensor '%s': data_offsets begin %" PRIu64 " > end %" PRIu64, p, nm, e->begin, e->end);
  if (e->end > f->data_size)
    return BAD("%s: tensor '%s': data_offsets end %" PRIu64 " is beyond the data region of %zu bytes", p, nm,
               e->end, f->data_size);
  if (e->end - e->begin != nbytes)
    return BAD("%s: tensor '%s': data_offsets span %" PRIu64 " bytes but shape and dtype %s need %" PRIu64, p,
               nm, e->end - e->begin, moe_dtype_name(d), nbytes);
  if (e->begin % moe_dtype_size(d))
    return BAD("%s: tensor '%s': data offset %" PRIu64 " is misaligned for %s", p, nm, e->begin, moe_dtype_name(d));
  return MOE_OK;
}

static int cmp_offset(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1; /* empty tensors before the one they start */
  return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static moe_status check_meta(moe_st *f, const cJSON *m) {
  char vb[64];
  if (!cJSON_IsObject(m)) return BAD("%s: __metadata__ is %s, not an object", f->path, json_desc(m, vb, 64));
  int n = cJSON_GetArraySize(m), i = 0;
  const cJSON *k;
  cJSON_ArrayForEach(k, m) if (!cJSON_IsString(k))
    return BAD("%s: __metadata__ '%s' is %s, not a string", f->path, k->string, json_desc(k, vb, 64));
  const char **keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
  MOE_TRY(keys, MOE_ERR_NOMEM, "%s: out of memory", f->path);
  cJSON_ArrayForEach(k, m) keys[i++] = k->string;
  qsort(keys, (size_t)n, sizeof *keys, cmp_str);
  for (i = 1; i < n; i++)
    if (!strcmp(keys[i - 1], keys[i])) break;
  moe_status st = i < n ? BAD("%s: duplicate __metadata__ key '%s'", f->path, keys[i]) : MOE_OK;
  free(keys);
  return st;
}

static moe_status st_parse(moe_st *f, size_t hlen) {
  const char *p = f->path;
  MOE_CHECK(moe__json_parse(p, "header", f->hdr, hlen, &f->root)); /* padding after it: whitespace only */
  if (!cJSON_IsObject(f->root)) return BAD("%s: header is not a JSON object", p);
  free(f->hdr);
  f->hdr = NULL;

  int n = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, f->root) {
    if (strcmp(it->string, "__metadata__")) { n++; continue; }
    if (f->meta) return BAD("%s: duplicate key '__metadata__'", p);
    MOE_CHECK(check_meta(f, it));
    f->meta = it;
  }
  f->t = calloc((size_t)(n ? n : 1), sizeof *f->t);
  f->byname = malloc((size_t)(n ? n : 1) * sizeof *f->byname);
  MOE_TRY(f->t && f->byname, MOE_ERR_NOMEM, "%s: out of memory for %d tensor entries", p, n);
  cJSON_ArrayForEach(it, f->root) if (it != f->meta) MOE_CHECK(parse_entry(f, it, &f->t[f->n++]));

  qsort(f->t, (size_t)n, sizeof *f->t, cmp_offset);
  for (int i = 0; i < n; i++) f->byname[i] = &f->t[i];
  qsort(f->byname, (size_t)n, sizeof *f->byname, cmp_name);
  for (int i = 1; i < n; i++)
    if (!strcmp(f->byname[i - 1]->name, f->byname[i]->name))
      return BAD("%s: duplicate tensor name '%s'", p, f->byname[i]->name);
  /* Sorted by offset, each tensor must start exactly where the previous one ended. */
  uint64_t pos = 0;
  for (int i = 0; i < n; i++) {
    const st_entry *e = &f->t[i];
    if (e->begin < pos)
      return BAD("%s: tensors '%s' and '%s' overlap (offset %" PRIu64 " < %" PRIu64 ")", p, f->t[i - 1].name,
                 e->name, e->begin, pos);
    if (e->begin > pos)
      return BAD("%s: hole in the data region: bytes [%" PRIu64 ", %" PRIu64 ") before tensor '%s' belong to no tensor",
                 p, pos, e->begin, e->name);
    pos = e->end;
  }
  if (pos != f->data_size)
    return BAD("%s: %" PRIu64 " trailing bytes after the last tensor (data region is %zu bytes)", p,
               (uint64_t)f->data_size - pos, f->data_size);
  return MOE_OK;
}

static moe_status st_open(moe_st **out, const char *path, int lazy) {
  MOE_TRY(out && path, MOE_ERR_ARG, "moe_st_open: NULL %s", out ? "path" : "out");
  *out = NULL;
  moe_st *f = calloc(1, sizeof *f);
  if (!f || !(f->path = dup_str(path))) free(f), f = NULL;
  MOE_TRY(f, MOE_ERR_NOMEM, "%s: out of memory", path);
  f->fd = -1;
  size_t hlen = 0;
  FILE *fp = fopen(path, "rb");
  moe_status st = fp ? st_read(f, fp, &hlen, lazy)
                     : moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: cannot open: %s", path, strerror(errno));
  if (fp && st == MOE_OK && lazy) {
    f->fd = fcntl(fileno(fp), F_DUPFD_CLOEXEC, 0); /* kept for pread: the data stays in the file */
    if (f->fd < 0) st = moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: dup: %s", path, strerror(errno));
  }
  if (fp) fclose(fp);
  if (st == MOE_OK) st = st_parse(f, hlen);
  if (st == MOE_OK) *out = f;
  else moe_st_close(f);
  return st;
}

const char *moe_st_path(const moe_st *f) { return f ? f->path : NULL; }
int moe__st_fd(const moe_st *f) { return f->fd; }
int moe_st_count(const moe_st *f) { return f ? f->n : 0; }

moe_status moe_st_open(moe_st **out, const char *path) { return st_open(out, path, 0); }
moe_status moe_st_open_lazy(moe_st **out, const char *path) { return st_open(out, path, 1); }

moe_status moe_st_read(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n, void *dst) {
  MOE_TRY(f && v && (dst || !n), MOE_ERR_ARG, "moe_st_read: NULL argument");
  MOE_TRY(off <= v->nbytes && n <= v->nbytes - off, MOE_ERR_ARG, "%s: read of %zu bytes at %zu past tensor '%s' (%zu bytes)",
          f->path, n, off, v->name, v->nbytes);
  if (f->data) {
    MOE_TRY(v->data, MOE_ERR_ARG, "%s: the view of '%s' is not from this file", f->path, v->name);
    memcpy(dst, (const unsigned char *)v->data + off, n);
    return MOE_OK;
  }
  char what[320];
  snprintf(what, sizeof what, "tensor '%s'", v->name);
  return moe__pread_all(f->fd, f->path, what, (off_t)(v->file_offset + off), dst, n);
}

static void fill_view(const moe_st *f, const st_entry *e, moe_tensor_view *v) {
  *v = (moe_tensor_view){.name = e->name, .dtype = e->dt, .ndim = e->ndim,
                         .data = f->data ? f->data + e->begin : NULL, .nbytes = (size_t)(e->end - e->begin),
                         .file_offset = f->data_start + e->begin};
  memcpy(v->shape, e->shape, sizeof v->shape);
}

moe_status moe_st_at(const moe_st *f, int i, moe_tensor_view *v) {
  MOE_TRY(f && v, MOE_ERR_ARG, "moe_st_at: NULL argument");
  MOE_TRY(i >= 0 && i < f->n, MOE_ERR_ARG, "%s: tensor index %d out of range [0, %d)", f->path, i, f->n);
  fill_view(f, &f->t[i], v);
  return MOE_OK;
}

static const st_entry *find(const moe_st *f, const char *name) {
  if (!f || !name || f->n == 0) return NULL;
  st_entry key = {.name = name};
  const st_entry *kp = &key, **hit = bsearch(&kp, f->byname, (size_t)f->n, sizeof *f->byname, cmp_name);
  return hit ? *hit : NULL;
}

moe_status moe_st_get(const moe_st *f, const char *name, moe_tensor_view *v) {
  MOE_TRY(f && name && v, MOE_ERR_ARG, "moe_st_get: NULL argument");
  const st_entry *e = find(f, name);
  MOE_TRY(e, MOE_ERR_MISSING, "%s: no tensor '%s'", f->path, name);
  fill_view(f, e, v);
  return MOE_OK;
}

int moe_st_has(const moe_st *f, const char *name) { return find(f, name) != NULL; }

/* "(a, b, c)" of n dims into buf. */
static void shape_str(char *buf, size_t size, const int64_t *shape, int n) {
  int w = snprintf(buf, size, "(");
  for (int d = 0; d < n && w < (int)size - 24; d++) w += snprintf(buf + w, size - w, "%s%lld", d ? ", " : "", (long long)shape[d]);
  snprintf(buf + w, size - w, ")");
}

moe_status moe__st_expect_shape(const moe_st *f, const moe_tensor_view *v, const char *name, int ndim,
                                const int64_t *shape) {
  int same = v->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = v->shape[d] == shape[d];
  if (same) return MOE_OK;
  char want[96], got[96];
  shape_str(want, sizeof want, shape, ndim);
  shape_str(got, sizeof got, v->shape, v->ndim);
  return moe__error(MOE_ERR_SHAPE, __FILE__, __LINE__, "%s: tensor '%s' has shape %s, want %s", moe_st_path(f), name,
                    got, want);
}

/* The error of a non-finite value at flat index off + i of v, whose value is x. */
static moe_status not_finite(const moe_st *f, const moe_tensor_view *v, size_t off, size_t i, double x) {
  int64_t at[MOE_MAX_DIMS];
  uint64_t flat = off + i;
  for (int d = v->ndim - 1; d >= 0; d--) {
    at[d] = v->shape[d] ? (int64_t)(flat % (uint64_t)v->shape[d]) : 0;
    flat = v->shape[d] ? flat / (uint64_t)v->shape[d] : 0;
  }
  char where[96];
  shape_str(where, sizeof where, at, v->ndim);
  return moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "%s: tensor '%s' has a non-finite value, %g, at index %s (the first)",
                    f->path, v->name, x, where);
}

size_t moe__first_nonfinite(const float *x, size_t n) {
  for (size_t b = 0; b < n; b += 4096) { /* a block without an early exit vectorizes */
    size_t e = n - b < 4096 ? n : b + 4096;
    int bad = 0;
#pragma omp simd reduction(| : bad)
    for (size_t i = b; i < e; i++) bad |= !(x[i] - x[i] == 0.0f); /* Inf - Inf and NaN - NaN are NaN */
    for (size_t i = b; bad && i < e; i++)
      if (!isfinite(x[i])) return i;
  }
  return n;
}

moe_status moe__st_expect_finite(const moe_st *f, const moe_tensor_view *v, size_t off, const float *x, size_t n) {
  size_t i = moe__first_nonfinite(x, n);
  return i == n ? MOE_OK : not_finite(f, v, off, i, (double)x[i]);
}

moe_status moe__st_expect_finite_bf16(const moe_st *f, const moe_tensor_view *v, size_t off, const uint16_t *x,
                                      size_t n) {
  size_t i = 0;
  while (i < n && (x[i] & 0x7f80) != 0x7f80) i++; /* exponent all ones: Inf or NaN */
  return i == n ? MOE_OK : not_finite(f, v, off, i, (x[i] & 0x7f) ? NAN : (x[i] >> 15) ? -INFINITY : INFINITY);
}

void moe__st_drop_pages(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n) {
  if (f && f->fd >= 0) posix_fadvise(f->fd, (off_t)(v->file_offset + off), (off_t)n, POSIX_FADV_DONTNEED);
}

moe_status moe__st_scan_finite(const moe_st *f, const moe_tensor_view *v) {
  MOE_TRY(v->dtype == MOE_DT_F32 || v->dtype == MOE_DT_BF16, MOE_ERR_DTYPE,
          "%s: tensor '%s' has dtype %s, want F32 or BF16", f->path, v->name, moe_dtype_name(v->dtype));
  size_t n = v->nbytes / moe_dtype_size(v->dtype), chunk = n < 65536 ? n : 65536;
  float *buf = malloc(chunk * sizeof *buf + 4);
  MOE_TRY(buf, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", f->path, v->name);
  moe_status st = MOE_OK;
  for (size_t off = 0; off < n && st == MOE_OK; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    st = moe_st_view_f32(f, v, off, k, buf);
    if (st == MOE_OK) st = moe__st_expect_finite(f, v, off, buf, k);
  }
  free(buf);
  return st;
}

moe_status moe_st_view_f32(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n, float *dst) {
  MOE_TRY(v->dtype == MOE_DT_F32 || v->dtype == MOE_DT_BF16, MOE_ERR_DTYPE,
          "%s: tensor '%s' has dtype %s, want F32 or BF16", f->path, v->name, moe_dtype_name(v->dtype));
  size_t es = moe_dtype_size(v->dtype);
  MOE_TRY((off + n) * es <= v->nbytes, MOE_ERR_ARG, "%s: tensor '%s': values [%zu, %zu) out of range", f->path,
          v->name, off, off + n);
  if (v->dtype == MOE_DT_F32) return moe_st_read(f, v, off * 4, n * 4, dst); /* from memory, or the file */
  if (v->data) {
    moe_bf16_to_f32(dst, (const uint16_t *)v->data + off, n);
    return MOE_OK;
  }
  uint16_t *b = malloc(n * 2 + 2); /* lazy: the bf16 bytes from the file, then widened */
  MOE_TRY(b, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", f->path, v->name);
  moe_status st = moe_st_read(f, v, off * 2, n * 2, b);
  if (st == MOE_OK) moe_bf16_to_f32(dst, b, n);
  free(b);
  return st;
}

moe_status moe_st_get_f32(const moe_st *f, const char *name, float *dst, size_t n) {
  moe_tensor_view v;
  MOE_CHECK(moe_st_get(f, name, &v));
  size_t have = v.nbytes / moe_dtype_size(v.dtype);
  MOE_TRY(have == n, MOE_ERR_SHAPE, "%s: tensor '%s' has %zu values, want %zu", f->path, name, have, n);
  return moe_st_view_f32(f, &v, 0, n, dst);
}

const char *moe_st_meta(const moe_st *f, const char *key) {
  if (!f || !f->meta || !key) return NULL;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
  return v ? v->valuestring : NULL;
}

/* ---------------------------------------------------------------- writer */

typedef struct {
  char *name;
  moe_dtype dt;
  int ndim;
  int64_t shape[MOE_MAX_DIMS];
  void *data;            /* a copy, or NULL: fill */
  size_t nbytes;
  moe_fill_fn fill;
  void *ctx;
  size_t chunk;          /* bytes a fill call makes (the last may be fewer) */
  uint64_t off; /* in the data region, set when saving */
} wr_tensor;

struct moe_st_writer {
  wr_tensor *t;
  int n, cap;
  struct { char *k, *v; } *m; /* metadata, in insertion order */
  int nm, capm;
  size_t chunk; /* the largest chunk of a filled tensor: the buffer save makes them in */
};

/* Makes room for element n of a growable array: the (maybe moved) array, or NULL if out of memory. */
static void *grow(void *p, int *cap, int n, size_t elsize) {
  if (n < *cap) return p;
  int c = *cap ? 2 * *cap : 16;
  void *q = realloc(p, (size_t)c * elsize);
  if (q) *cap = c;
  return q;
}

moe_status moe_st_writer_new(moe_st_writer **out) {
  MOE_TRY(out, MOE_ERR_ARG, "moe_st_writer_new: NULL out");
  *out = calloc(1, sizeof **out);
  MOE_TRY(*out, MOE_ERR_NOMEM, "moe_st_writer_new: out of memory");
  return MOE_OK;
}

void moe_st_writer_free(moe_st_writer *w) {
  if (!w) return;
  for (int i = 0; i < w->n; i++) free(w->t[i].name), free(w->t[i].data);
  for (int i = 0; i < w->nm; i++) free(w->m[i].k), free(w->m[i].v);
  free(w->t), free(w->m), free(w);
}

/* Checks a tensor's name, dtype and shape and appends it, its data not set (*out; its bytes in *nbytes). */
static moe_status add_entry(moe_st_writer *w, const char *name, moe_dtype dt, int ndim, const int64_t *shape,
                            wr_tensor **out, uint64_t *nbytes) {
  MOE_TRY(w && name, MOE_ERR_ARG, "moe_st_writer_add: NULL %s", w ? "name" : "writer");
  MOE_TRY(name[0] && strcmp(name, "__metadata__"), MOE_ERR_ARG, "moe_st_writer_add: invalid tensor name '%s'", name);
  MOE_TRY((unsigned)dt < MOE_DT_COUNT, MOE_ERR_ARG, "tensor '%s': invalid dtype %d", name, (int)dt);
  MOE_TRY(ndim >= 0 && ndim <= MOE_MAX_DIMS, MOE_ERR_ARG, "tensor '%s': ndim %d not in [0, %d]", name, ndim,
          MOE_MAX_DIMS);
  MOE_TRY(shape || ndim == 0, MOE_ERR_ARG, "tensor '%s': NULL shape", name);
  for (int i = 0; i < ndim; i++)
    MOE_TRY(shape[i] >= 0, MOE_ERR_ARG, "tensor '%s': shape[%d] = %" PRId64 " is negative", name, i, shape[i]);
  for (int i = 0; i < w->n; i++)
    MOE_TRY(strcmp(w->t[i].name, name), MOE_ERR_ARG, "tensor '%s' added twice", name);
  int ok;
  *nbytes = shape_bytes(shape, ndim, moe_dtype_size(dt), &ok);
  MOE_TRY(ok, MOE_ERR_ARG, "tensor '%s': element count overflows", name);
  wr_tensor *t = grow(w->t, &w->cap, w->n, sizeof *t);
  MOE_TRY(t, MOE_ERR_NOMEM, "tensor '%s': out of memory", name);
  w->t = t;
  char *nm = dup_str(name);
  MOE_TRY(nm, MOE_ERR_NOMEM, "tensor '%s': out of memory", name);
  *out = &t[w->n++];
  **out = (wr_tensor){.name = nm, .dt = dt, .ndim = ndim, .nbytes = (size_t)*nbytes};
  if (ndim) memcpy((*out)->shape, shape, (size_t)ndim * sizeof *shape);
  return MOE_OK;
}

moe_status moe_st_writer_add(moe_st_writer *w, const char *name, moe_dtype dt, int ndim,
                             const int64_t *shape, const void *data) {
  wr_tensor *e;
  uint64_t nbytes;
  MOE_CHECK(add_entry(w, name, dt, ndim, shape, &e, &nbytes));
  e->data = data || !nbytes ? malloc(nbytes ? (size_t)nbytes : 1) : NULL;
  if (!e->data) {
    free(e->name), w->n--;
    MOE_TRY(data, MOE_ERR_ARG, "tensor '%s': NULL data", name);
    MOE_TRY(0, MOE_ERR_NOMEM, "tensor '%s': out of memory for %" PRIu64 " bytes", name, nbytes);
  }
  if (nbytes) memcpy(e->data, data, (size_t)nbytes);
  return MOE_OK;
}

moe_status moe_st_writer_add_fill(moe_st_writer *w, const char *name, moe_dtype dt, int ndim, const int64_t *shape,
                                  size_t chunk, moe_fill_fn fill, void *ctx) {
  MOE_TRY(fill, MOE_ERR_ARG, "tensor '%s': NULL fill", name ? name : "(NULL)");
  wr_tensor *e;
  uint64_t nbytes;
  MOE_CHECK(add_entry(w, name, dt, ndim, shape, &e, &nbytes));
  e->fill = fill, e->ctx = ctx, e->chunk = chunk && chunk < e->nbytes ? chunk : e->nbytes;
  if (w->chunk < e->chunk) w->chunk = e->chunk;
  return MOE_OK;
}

moe_status moe_st_writer_add_f32(moe_st_writer *w, const char *name, moe_dtype dt, int ndim, const int64_t *shape,
                                 const float *data) {
  MOE_TRY(dt == MOE_DT_F32 || dt == MOE_DT_BF16, MOE_ERR_ARG, "tensor '%s': float data stored as %s (want F32 or BF16)",
          name, moe_dtype_name(dt));
  if (dt == MOE_DT_F32) return moe_st_writer_add(w, name, dt, ndim, shape, data);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i] > 0 ? (size_t)shape[i] : 0;
  uint16_t *b = malloc(n ? n * 2 : 1);
  MOE_TRY(b, MOE_ERR_NOMEM, "tensor '%s': out of memory for %zu bf16 values", name, n);
  moe_bf16_from_f32(b, data, n);
  moe_status st = moe_st_writer_add(w, name, MOE_DT_BF16, ndim, shape, b);
  free(b);
  return st;
}

moe_status moe_st_writer_meta(moe_st_writer *w, const char *key, const char *value) {
  MOE_TRY(w && key && value, MOE_ERR_ARG, "moe_st_writer_meta: NULL argument");
  int i = 0;
  while (i < w->nm && strcmp(w->m[i].k, key)) i++;
  char *k = i < w->nm ? NULL : dup_str(key), *v = dup_str(value);
  void *m = i < w->nm || !k ? w->m : grow(w->m, &w->capm, w->nm, sizeof *w->m);
  if (m) w->m = m;
  int ok = v && (i < w->nm || (k && m));
  if (!ok) free(k), free(v);
  MOE_TRY(ok, MOE_ERR_NOMEM, "metadata '%s': out of memory", key);
  if (i < w->nm) free(w->m[i].v); /* replacing */
  else w->m[w->nm++].k = k;
  w->m[i].v = v;
  return MOE_OK;
}

static int add_u64(cJSON *arr, uint64_t x) {
  char b[24];
  snprintf(b, sizeof b, "%" PRIu64, x); /* raw: cJSON would print large doubles as 1e+15 */
  cJSON *r = cJSON_CreateRaw(b);
  if (r && cJSON_AddItemToArray(arr, r)) return 1;
  cJSON_Delete(r);
  return 0;
}

/* The header JSON. Data is ordered by decreasing dtype size (insertion order within a size) so every
 * tensor is aligned to its element size with no gaps; the JSON keys keep insertion order. */
static char *build_header(moe_st_writer *w) {
  cJSON *root = cJSON_CreateObject();
  int ok = root != NULL;
  if (ok && w->nm) {
    cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
    ok = m != NULL;
    for (int i = 0; ok && i < w->nm; i++) ok = cJSON_AddStringToObject(m, w->m[i].k, w->m[i].v) != NULL;
  }
  uint64_t pos = 0;
  for (size_t sz = 8; sz >= 1; sz /= 2)
    for (int i = 0; i < w->n; i++)
      if (moe_dtype_size(w->t[i].dt) == sz) w->t[i].off = pos, pos += w->t[i].nbytes;
  for (int i = 0; ok && i < w->n; i++) {
    const wr_tensor *e = &w->t[i];
    cJSON *o = cJSON_AddObjectToObject(root, e->name), *sh = NULL, *off = NULL;
    ok = o && cJSON_AddStringToObject(o, "dtype", moe_dtype_name(e->dt)) && (sh = cJSON_AddArrayToObject(o, "shape"));
    for (int d = 0; ok && d < e->ndim; d++) ok = add_u64(sh, (uint64_t)e->shape[d]);
    ok = ok && (off = cJSON_AddArrayToObject(o, "data_offsets")) && add_u64(off, e->off) &&
         add_u64(off, e->off + e->nbytes);
  }
  char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return s;
}

typedef struct {
  const moe_st_writer *w;
  char *hdr;
  void *chunk;        /* the filled tensors' buffer */
  moe_status fill_st; /* a fill's error, and its message */
  char fill_msg[512];
} file_ctx;

/* e's bytes, copied or chunk by chunk from its fill (an error kept in c). */
static int write_tensor(FILE *fp, file_ctx *c, const wr_tensor *e) {
  if (!e->fill) return !e->nbytes || fwrite(e->data, 1, e->nbytes, fp) == e->nbytes;
  for (size_t off = 0; off < e->nbytes; off += e->chunk) {
    size_t n = e->nbytes - off < e->chunk ? e->nbytes - off : e->chunk;
    if ((c->fill_st = e->fill(e->ctx, off, c->chunk, n)) != MOE_OK) {
      snprintf(c->fill_msg, sizeof c->fill_msg, "%s", moe_last_error());
      return 0;
    }
    if (fwrite(c->chunk, 1, n, fp) != n) return 0;
  }
  return 1;
}

static int write_file(FILE *fp, void *ctx, char *msg, size_t n) {
  (void)msg, (void)n;
  file_ctx *c = ctx;
  const moe_st_writer *w = c->w;
  size_t len = strlen(c->hdr), pad = (8 - len % 8) % 8; /* data region starts at a multiple of 8 */
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)(len + pad) >> (8 * i));
  if (fwrite(lb, 1, 8, fp) != 8 || fwrite(c->hdr, 1, len, fp) != len) return 0;
  for (size_t i = 0; i < pad; i++)
    if (fputc(' ', fp) == EOF) return 0;
  for (size_t sz = 8; sz >= 1; sz /= 2) /* the order build_header assigned the offsets in */
    for (int i = 0; i < w->n; i++)
      if (moe_dtype_size(w->t[i].dt) == sz && !write_tensor(fp, c, &w->t[i])) return 0;
  return 1;
}

moe_status moe_st_writer_save(moe_st_writer *w, const char *path) {
  MOE_TRY(w && path, MOE_ERR_ARG, "moe_st_writer_save: NULL %s", w ? "path" : "writer");
  file_ctx c = {.w = w, .hdr = build_header(w), .chunk = w->chunk ? malloc(w->chunk) : NULL};
  moe_status st = !c.hdr || (w->chunk && !c.chunk)
                      ? moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory for the header or a chunk of %zu bytes",
                                   path, w->chunk)
                      : moe__save_atomic(path, write_file, &c);
  if (c.fill_st != MOE_OK) /* the file is not written: the fill's own error, not a write's */
    st = moe__error(c.fill_st, __FILE__, __LINE__, "%s", c.fill_msg);
  free(c.hdr), free(c.chunk);
  return st;
}
