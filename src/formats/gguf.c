/* The GGUF reader: the file is mapped read-only and checked whole before any of it is handed out
 * (every length and count against the bytes left, every type id, the alignment, the tensors' extents),
 * so the accessors below can trust it. Strings are copied out once, NUL-terminated; numbers and
 * tensor data are read from the mapping (little-endian, byte by byte: values sit unaligned). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/pread_all.h"
#include "formats/gguf.h"
#include "internal.h"

#define BAD(...) moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, __VA_ARGS__)
#define MAX_DEPTH 4          /* arrays of arrays nested deeper than this are refused */
#define MIN_KV_BYTES 14      /* key length, a 1-byte key, the type, a 1-byte value */
#define MIN_TENSOR_BYTES 33  /* name length, a 1-byte name, n_dims, one dim, type, offset */

typedef struct {
  char *key;
  moe_gguf_vtype type, elem;
  uint64_t n;
  uint64_t val;  /* offset of the value (of an array: of its first element) */
  uint64_t raw;  /* offset of the type id, and the end of the entry: the bytes copy_kv copies */
  uint64_t end;
  uint64_t str0; /* the first of its strings in the string table */
} kv_entry;

typedef struct {
  uint64_t off, len; /* in the mapping while parsing; then in strbuf */
} str_ref;

struct moe_gguf {
  char *path;
  const uint8_t *map; /* the file's bytes: mapped, or (copied) read into anonymous memory */
  size_t size;
  int copied;
  uint32_t alignment;
  uint64_t data_off;
  kv_entry *kv;
  int64_t nkv;
  int64_t *kv_sorted; /* indices by key */
  str_ref *str;
  uint64_t nstr, str_cap;
  char *strbuf;
  moe_gguf_tensor *t;
  char (*names)[MOE__GGUF_MAX_NAME + 1];
  int64_t nt;
  int64_t *t_sorted; /* indices by name */
};

static const char *const vnames[MOE_GGUFV_COUNT] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                                     "bool", "string", "array", "u64", "i64", "f64"};
static const uint8_t vsizes[MOE_GGUFV_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *moe_gguf_vtype_name(moe_gguf_vtype t) { return (unsigned)t < MOE_GGUFV_COUNT ? vnames[t] : "invalid"; }
size_t moe__gguf_vsize(moe_gguf_vtype t) { return (unsigned)t < MOE_GGUFV_COUNT ? vsizes[t] : 0; }

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* ---------------------------------------------------------------- parsing */

typedef struct {
  moe_gguf *g;
  uint64_t pos;
  char what[160]; /* the field being read, for messages: "metadata 3 ('general.name')" */
} cursor;

static moe_status need(cursor *c, uint64_t n, const char *field) {
  if (n <= c->g->size - c->pos) return MOE_OK;
  return BAD("%s: truncated: %s %s needs %" PRIu64 " bytes at offset %" PRIu64 " but the file has %zu", c->g->path,
             c->what, field, n, c->pos, c->g->size);
}

static moe_status rd(cursor *c, int n, uint64_t *v, const char *field) {
  MOE_CHECK(need(c, (uint64_t)n, field));
  *v = le(c->g->map + c->pos, n);
  c->pos += (uint64_t)n;
  return MOE_OK;
}

/* A string: its length (at most max) and bytes; *ref gets where it lies. */
static moe_status rd_str(cursor *c, uint64_t max, str_ref *ref, const char *field) {
  uint64_t len;
  MOE_CHECK(rd(c, 8, &len, "string length"));
  MOE_TRY(len <= max, MOE_ERR_FORMAT, "%s: %s %s length %" PRIu64 " exceeds %" PRIu64, c->g->path, c->what, field,
          len, max);
  MOE_CHECK(need(c, len, field));
  ref->off = c->pos, ref->len = len;
  c->pos += len;
  return MOE_OK;
}

static moe_status add_str(moe_gguf *g, str_ref r) {
  if (g->nstr == g->str_cap) {
    uint64_t cap = g->str_cap ? 2 * g->str_cap : 64;
    str_ref *s = realloc(g->str, cap * sizeof *s); /* nstr is bounded by the file's size / 8 */
    MOE_TRY(s, MOE_ERR_NOMEM, "%s: out of memory for %" PRIu64 " strings", g->path, cap);
    g->str = s, g->str_cap = cap;
  }
  g->str[g->nstr++] = r;
  return MOE_OK;
}

/* One value of type t (an array's elements when t is an array); strings are recorded when keep. */
static moe_status rd_value(cursor *c, moe_gguf_vtype t, int depth, int keep) {
  moe_gguf *g = c->g;
  if (t == MOE_GGUFV_STRING) {
    str_ref r;
    MOE_CHECK(rd_str(c, UINT64_MAX, &r, "string"));
    return keep ? add_str(g, r) : MOE_OK;
  }
  if (t == MOE_GGUFV_BOOL) {
    uint64_t v;
    MOE_CHECK(rd(c, 1, &v, "bool"));
    MOE_TRY(v <= 1, MOE_ERR_FORMAT, "%s: %s: bool value %" PRIu64 " at offset %" PRIu64 " (want 0 or 1)", g->path,
            c->what, v, c->pos - 1);
    return MOE_OK;
  }
  if (t != MOE_GGUFV_ARRAY) {
    MOE_CHECK(need(c, vsizes[t], vnames[t]));
    c->pos += vsizes[t];
    return MOE_OK;
  }
  uint64_t et, n;
  MOE_CHECK(rd(c, 4, &et, "array type"));
  MOE_TRY(et < MOE_GGUFV_COUNT, MOE_ERR_FORMAT, "%s: %s: unknown array element type %" PRIu64 " at offset %" PRIu64,
          g->path, c->what, et, c->pos - 4);
  MOE_TRY(depth < MAX_DEPTH, MOE_ERR_FORMAT, "%s: %s: arrays nested deeper than %d", g->path, c->what, MAX_DEPTH);
  MOE_CHECK(rd(c, 8, &n, "array length"));
  /* each element takes at least this many bytes: an absurd count fails here, before any loop */
  uint64_t least = et == MOE_GGUFV_STRING ? 8 : et == MOE_GGUFV_ARRAY ? 12 : vsizes[et];
  MOE_TRY(n <= (g->size - c->pos) / least, MOE_ERR_FORMAT,
          "%s: truncated: %s array of %" PRIu64 " %s at offset %" PRIu64 " needs at least %" PRIu64
          " bytes per element, more than the %" PRIu64 " left",
          g->path, c->what, n, vnames[et], c->pos, least, g->size - c->pos);
  if (et != MOE_GGUFV_STRING && et != MOE_GGUFV_ARRAY && et != MOE_GGUFV_BOOL) {
    c->pos += n * least;
    return MOE_OK;
  }
  /* the strings of an array of arrays are checked, not kept: its values are not accessible */
  for (uint64_t i = 0; i < n; i++) MOE_CHECK(rd_value(c, (moe_gguf_vtype)et, depth + 1, keep && depth == 0));
  return MOE_OK;
}

static int key_ok(const uint8_t *p, uint64_t n) {
  for (uint64_t i = 0; i < n; i++)
    if (p[i] < 0x20 || p[i] > 0x7e) return 0;
  return n > 0;
}

static moe_status rd_kv(cursor *c, int64_t i) {
  moe_gguf *g = c->g;
  kv_entry *e = &g->kv[i];
  snprintf(c->what, sizeof c->what, "metadata %" PRId64, i);
  str_ref k;
  MOE_CHECK(rd_str(c, MOE__GGUF_MAX_KEY, &k, "key"));
  MOE_TRY(key_ok(g->map + k.off, k.len), MOE_ERR_FORMAT,
          "%s: metadata %" PRId64 " at offset %" PRIu64 ": key is empty or not printable ASCII", g->path, i, k.off);
  e->key = malloc(k.len + 1);
  MOE_TRY(e->key, MOE_ERR_NOMEM, "%s: out of memory", g->path);
  memcpy(e->key, g->map + k.off, k.len);
  e->key[k.len] = 0;
  snprintf(c->what, sizeof c->what, "metadata %" PRId64 " ('%.100s')", i, e->key);
  uint64_t t;
  e->raw = c->pos;
  MOE_CHECK(rd(c, 4, &t, "value type"));
  MOE_TRY(t < MOE_GGUFV_COUNT, MOE_ERR_FORMAT, "%s: %s: unknown value type %" PRIu64, g->path, c->what, t);
  e->type = e->elem = (moe_gguf_vtype)t;
  e->n = 1;
  e->str0 = g->nstr;
  if (t == MOE_GGUFV_ARRAY) { /* peek at the element type and count, then read it all */
    MOE_CHECK(need(c, 12, "array header"));
    e->elem = (moe_gguf_vtype)le(g->map + c->pos, 4);
    e->n = le(g->map + c->pos + 4, 8);
    e->val = c->pos + 12;
  } else {
    e->val = t == MOE_GGUFV_STRING ? c->pos + 8 : c->pos;
  }
  MOE_CHECK(rd_value(c, e->type, 0, 1));
  e->end = c->pos;
  return MOE_OK;
}

static int cmp_key(const void *a, const void *b, void *ctx) {
  const moe_gguf *g = ctx;
  return strcmp(g->kv[*(const int64_t *)a].key, g->kv[*(const int64_t *)b].key);
}
static int cmp_name(const void *a, const void *b, void *ctx) {
  const moe_gguf *g = ctx;
  return strcmp(g->t[*(const int64_t *)a].name, g->t[*(const int64_t *)b].name);
}
static int cmp_off(const void *a, const void *b, void *ctx) {
  const moe_gguf *g = ctx;
  const moe_gguf_tensor *x = &g->t[*(const int64_t *)a], *y = &g->t[*(const int64_t *)b];
  return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

static moe_status sorted(moe_gguf *g, int64_t n, int64_t **out, int (*cmp)(const void *, const void *, void *)) {
  *out = malloc((size_t)(n ? n : 1) * sizeof **out);
  MOE_TRY(*out, MOE_ERR_NOMEM, "%s: out of memory", g->path);
  for (int64_t i = 0; i < n; i++) (*out)[i] = i;
  qsort_r(*out, (size_t)n, sizeof **out, cmp, g);
  return MOE_OK;
}

static moe_status rd_alignment(moe_gguf *g) {
  g->alignment = MOE__GGUF_ALIGNMENT;
  int64_t i = moe_gguf_find_key(g, "general.alignment");
  if (i < 0) return MOE_OK;
  const kv_entry *e = &g->kv[i];
  MOE_TRY(e->type == MOE_GGUFV_U32, MOE_ERR_FORMAT, "%s: general.alignment is a %s, want u32", g->path,
          vnames[e->type]);
  uint32_t a = (uint32_t)le(g->map + e->val, 4);
  MOE_TRY(a && !(a & (a - 1)), MOE_ERR_FORMAT, "%s: general.alignment %" PRIu32 " is not a power of two", g->path, a);
  g->alignment = a;
  return MOE_OK;
}

static moe_status rd_tensor(cursor *c, int64_t i) {
  moe_gguf *g = c->g;
  moe_gguf_tensor *t = &g->t[i];
  snprintf(c->what, sizeof c->what, "tensor info %" PRId64, i);
  str_ref nm;
  MOE_CHECK(rd_str(c, MOE__GGUF_MAX_NAME, &nm, "name"));
  MOE_TRY(nm.len > 0 && !memchr(g->map + nm.off, 0, nm.len), MOE_ERR_FORMAT,
          "%s: tensor info %" PRId64 ": name is empty or holds a NUL byte", g->path, i);
  memcpy(g->names[i], g->map + nm.off, nm.len);
  g->names[i][nm.len] = 0;
  t->name = g->names[i];
  const char *p = g->path, *n = t->name;
  snprintf(c->what, sizeof c->what, "tensor '%s'", n);
  uint64_t nd, ty, off;
  MOE_CHECK(rd(c, 4, &nd, "n_dimensions"));
  MOE_TRY(nd >= 1 && nd <= MOE__GGUF_MAX_DIMS, MOE_ERR_FORMAT, "%s: tensor '%s': n_dimensions %" PRIu64 " (want 1-%d)",
          p, n, nd, MOE__GGUF_MAX_DIMS);
  t->ndim = (int)nd;
  /* the product of the non-zero dims must fit, so that nrows does even when ne[0] is 0 */
  uint64_t nonzero = 1;
  int empty = 0;
  for (int d = 0; d < 4; d++) {
    uint64_t v = 1;
    if (d < t->ndim) MOE_CHECK(rd(c, 8, &v, "dimension"));
    MOE_TRY(v <= (uint64_t)INT64_MAX && (v == 0 || nonzero <= (uint64_t)INT64_MAX / v), MOE_ERR_FORMAT,
            "%s: tensor '%s': dimension %d = %" PRIu64 " makes the element count overflow", p, n, d, v);
    if (v) nonzero *= v;
    else empty = 1;
    t->ne[d] = (int64_t)v;
  }
  uint64_t count = empty ? 0 : nonzero;
  t->nrows = t->ne[1] * t->ne[2] * t->ne[3];
  MOE_CHECK(rd(c, 4, &ty, "type"));
  t->type = (moe_gguf_type)(ty <= INT32_MAX ? ty : 0);
  MOE_TRY(ty <= INT32_MAX && moe_gguf_type_name(t->type), MOE_ERR_DTYPE, "%s: tensor '%s': unknown type %" PRIu64, p, n, ty);
  int blk = moe_gguf_type_block(t->type);
  MOE_TRY(t->ne[0] % blk == 0, MOE_ERR_FORMAT, "%s: tensor '%s': row length ne[0] = %" PRId64
          " is not a multiple of %s's block of %d", p, n, t->ne[0], moe_gguf_type_name(t->type), blk);
  uint64_t blocks = count / (uint64_t)blk, bb = moe_gguf_type_block_bytes(t->type);
  MOE_TRY(blocks <= (uint64_t)SIZE_MAX / bb, MOE_ERR_FORMAT, "%s: tensor '%s': size overflows", p, n);
  t->nbytes = (size_t)(blocks * bb);
  MOE_CHECK(rd(c, 8, &off, "offset"));
  MOE_TRY(off % g->alignment == 0, MOE_ERR_FORMAT, "%s: tensor '%s': offset %" PRIu64
          " is not a multiple of the alignment %" PRIu32, p, n, off, g->alignment);
  t->file_offset = off; /* relative to the data section until it is known */
  return MOE_OK;
}

/* Where the data section starts, and each tensor inside it, not overlapping another. */
static moe_status place_tensors(moe_gguf *g, uint64_t end_of_infos) {
  uint64_t a = g->alignment, start = end_of_infos + (a - end_of_infos % a) % a;
  MOE_TRY(g->nt == 0 || start <= g->size, MOE_ERR_FORMAT,
          "%s: truncated: the tensor data section starts at offset %" PRIu64 " but the file has %zu bytes", g->path,
          start, g->size);
  g->data_off = start;
  uint64_t room = g->nt ? g->size - start : 0;
  for (int64_t i = 0; i < g->nt; i++) {
    moe_gguf_tensor *t = &g->t[i];
    MOE_TRY(t->file_offset <= room && t->nbytes <= room - t->file_offset, MOE_ERR_FORMAT,
            "%s: tensor '%s': data at offset %" PRIu64 " + %zu bytes runs past the end of the %" PRIu64
            "-byte data section (truncated file?)",
            g->path, t->name, t->file_offset, t->nbytes, room);
    t->file_offset += start;
    t->data = g->map + t->file_offset;
  }
  int64_t *by_off;
  MOE_CHECK(sorted(g, g->nt, &by_off, cmp_off));
  moe_status st = MOE_OK;
  for (int64_t i = 1; i < g->nt && st == MOE_OK; i++) {
    const moe_gguf_tensor *x = &g->t[by_off[i - 1]], *y = &g->t[by_off[i]];
    if (x->nbytes && y->nbytes && x->file_offset + x->nbytes > y->file_offset)
      st = BAD("%s: tensors '%s' and '%s' overlap: data offsets %" PRIu64 " + %zu bytes and %" PRIu64, g->path,
               x->name, y->name, x->file_offset - start, x->nbytes, y->file_offset - start);
  }
  free(by_off);
  return st;
}

/* The strings, copied out NUL-terminated (their total is bounded by the file's size). */
static moe_status copy_strings(moe_gguf *g) {
  uint64_t total = 0;
  for (uint64_t i = 0; i < g->nstr; i++) total += g->str[i].len + 1;
  g->strbuf = malloc(total ? total : 1);
  MOE_TRY(g->strbuf, MOE_ERR_NOMEM, "%s: out of memory for %" PRIu64 " bytes of strings", g->path, total);
  uint64_t at = 0;
  for (uint64_t i = 0; i < g->nstr; i++) {
    memcpy(g->strbuf + at, g->map + g->str[i].off, g->str[i].len);
    g->strbuf[at + g->str[i].len] = 0;
    g->str[i].off = at;
    at += g->str[i].len + 1;
  }
  return MOE_OK;
}

static moe_status parse(moe_gguf *g) {
  const char *p = g->path;
  MOE_TRY(g->size >= 24, MOE_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 24-byte GGUF header", p, g->size);
  MOE_TRY(!memcmp(g->map, "GGUF", 4), MOE_ERR_FORMAT,
          "%s: magic is %02x %02x %02x %02x, not \"GGUF\" (47 47 55 46): not a GGUF file", p, g->map[0], g->map[1],
          g->map[2], g->map[3]);
  uint32_t version = (uint32_t)le(g->map + 4, 4);
  MOE_TRY(version == 2 || version == 3, MOE_ERR_FORMAT, "%s: version %" PRIu32 " (want 3, or 2 which reads the same)%s",
          p, version, version > 0xffff ? ": a big-endian file?" : "");
  uint64_t nt = le(g->map + 8, 8), nkv = le(g->map + 16, 8);
  MOE_TRY(nkv <= (g->size - 24) / MIN_KV_BYTES, MOE_ERR_FORMAT,
          "%s: metadata_kv_count %" PRIu64 " cannot fit in the file's %zu bytes (truncated or corrupt)", p, nkv, g->size);
  MOE_TRY(nt <= (g->size - 24) / MIN_TENSOR_BYTES, MOE_ERR_FORMAT,
          "%s: tensor_count %" PRIu64 " cannot fit in the file's %zu bytes (truncated or corrupt)", p, nt, g->size);
  g->kv = calloc(nkv ? nkv : 1, sizeof *g->kv);
  MOE_TRY(g->kv, MOE_ERR_NOMEM, "%s: out of memory for %" PRIu64 " metadata entries", p, nkv);
  cursor c = {.g = g, .pos = 24};
  for (g->nkv = 0; g->nkv < (int64_t)nkv;) {
    moe_status st = rd_kv(&c, g->nkv);
    g->nkv++; /* its key, if any, is freed with the rest */
    MOE_CHECK(st);
  }
  MOE_CHECK(sorted(g, g->nkv, &g->kv_sorted, cmp_key));
  for (int64_t i = 1; i < g->nkv; i++)
    MOE_TRY(strcmp(g->kv[g->kv_sorted[i - 1]].key, g->kv[g->kv_sorted[i]].key), MOE_ERR_FORMAT,
            "%s: duplicate metadata key '%s'", p, g->kv[g->kv_sorted[i]].key);
  MOE_CHECK(rd_alignment(g));
  MOE_CHECK(copy_strings(g));

  MOE_TRY(nt <= (g->size - c.pos) / MIN_TENSOR_BYTES, MOE_ERR_FORMAT,
          "%s: tensor_count %" PRIu64 " cannot fit in the %zu bytes after the metadata (truncated or corrupt)", p, nt, g->size - c.pos);
  g->t = calloc(nt ? nt : 1, sizeof *g->t);
  g->names = calloc(nt ? nt : 1, sizeof *g->names);
  MOE_TRY(g->t && g->names, MOE_ERR_NOMEM, "%s: out of memory for %" PRIu64 " tensors", p, nt);
  g->nt = (int64_t)nt;
  for (int64_t i = 0; i < g->nt; i++) MOE_CHECK(rd_tensor(&c, i));
  MOE_CHECK(sorted(g, g->nt, &g->t_sorted, cmp_name));
  for (int64_t i = 1; i < g->nt; i++)
    MOE_TRY(strcmp(g->t[g->t_sorted[i - 1]].name, g->t[g->t_sorted[i]].name), MOE_ERR_FORMAT,
            "%s: duplicate tensor name '%s'", p, g->t[g->t_sorted[i]].name);
  return place_tensors(g, c.pos);
}

/* moe_gguf_open, the bytes mapped or (copy) read. */
static moe_status open_file(moe_gguf **out, const char *path, int copy) {
  MOE_TRY(out && path, MOE_ERR_ARG, "moe_gguf_open: NULL %s", out ? "path" : "out");
  *out = NULL;
  moe_gguf *g = calloc(1, sizeof *g);
  MOE_TRY(g, MOE_ERR_NOMEM, "%s: out of memory", path);
  g->path = strdup(path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  moe_status st = !g->path ? moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path)
                  : fd < 0 ? moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: cannot open: %s", path, strerror(errno))
                  : fstat(fd, &sb) ? moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: stat: %s", path, strerror(errno))
                  : !S_ISREG(sb.st_mode) ? moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: not a regular file", path)
                                         : MOE_OK;
  if (st == MOE_OK && sb.st_size > 0) {
    g->size = (size_t)sb.st_size;
    if (copy) {
      uint8_t *b = moe__map_alloc(g->size, 0);
      st = b ? moe__pread_all(fd, path, "the file", 0, b, g->size)
             : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory for its %zu bytes", path, g->size);
      if (b) g->map = b, g->copied = 1;
    } else {
      void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) st = moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: mmap: %s", path, strerror(errno));
      else g->map = m;
    }
  }
  if (fd >= 0) close(fd);
  if (st == MOE_OK) st = parse(g);
  if (st != MOE_OK) {
    moe_gguf_close(g);
    return st;
  }
  *out = g;
  return MOE_OK;
}

moe_status moe_gguf_open(moe_gguf **out, const char *path) { return open_file(out, path, 0); }
moe_status moe__gguf_open_copy(moe_gguf **out, const char *path) { return open_file(out, path, 1); }
int moe__gguf_copied(const moe_gguf *g) { return g->copied; }
size_t moe__gguf_size(const moe_gguf *g) { return g->size; }

void moe_gguf_close(moe_gguf *g) {
  if (!g) return;
  if (g->copied) moe__map_free((void *)g->map, g->size, 0);
  else if (g->map) munmap((void *)g->map, g->size);
  for (int64_t i = 0; i < g->nkv; i++) free(g->kv[i].key);
  free(g->kv), free(g->kv_sorted), free(g->str), free(g->strbuf), free(g->t), free(g->names), free(g->t_sorted);
  free(g->path), free(g);
}

/* ---------------------------------------------------------------- accessors */

const char *moe_gguf_path(const moe_gguf *g) { return g->path; }
uint32_t moe_gguf_alignment(const moe_gguf *g) { return g->alignment; }
uint64_t moe_gguf_data_offset(const moe_gguf *g) { return g->data_off; }
int64_t moe_gguf_kv_count(const moe_gguf *g) { return g->nkv; }
int64_t moe_gguf_tensor_count(const moe_gguf *g) { return g->nt; }

void moe__gguf_kv_raw(const moe_gguf *g, int64_t i, const void **p, size_t *n) {
  *p = g->map + g->kv[i].raw;
  *n = (size_t)(g->kv[i].end - g->kv[i].raw);
}

moe_status moe_gguf_kv_at(const moe_gguf *g, int64_t i, moe_gguf_kv *kv) {
  MOE_TRY(i >= 0 && i < g->nkv, MOE_ERR_ARG, "%s: metadata index %" PRId64 " out of [0, %" PRId64 ")", g->path, i,
          g->nkv);
  const kv_entry *e = &g->kv[i];
  *kv = (moe_gguf_kv){e->key, e->type, e->elem, e->n};
  return MOE_OK;
}

int64_t moe_gguf_find_key(const moe_gguf *g, const char *key) {
  int64_t lo = 0, hi = g->nkv;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    int c = strcmp(g->kv[g->kv_sorted[mid]].key, key);
    if (!c) return g->kv_sorted[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

/* Element j of entry i: its type and where its bytes are; MOE_ERR_ARG for j out of range. */
static moe_status element(const moe_gguf *g, int64_t i, uint64_t j, moe_gguf_vtype *t, const uint8_t **p) {
  MOE_TRY(i >= 0 && i < g->nkv, MOE_ERR_ARG, "%s: metadata index %" PRId64 " out of [0, %" PRId64 ")", g->path, i,
          g->nkv);
  const kv_entry *e = &g->kv[i];
  MOE_TRY(j < e->n, MOE_ERR_ARG, "%s: '%s': element %" PRIu64 " of %" PRIu64, g->path, e->key, j, e->n);
  *t = e->elem;
  *p = vsizes[e->elem] ? g->map + e->val + j * vsizes[e->elem] : NULL;
  return MOE_OK;
}

static int is_int(moe_gguf_vtype t) {
  return t != MOE_GGUFV_F32 && t != MOE_GGUFV_F64 && t != MOE_GGUFV_STRING && t != MOE_GGUFV_ARRAY;
}

static moe_status wrong_type(const moe_gguf *g, int64_t i, const char *want) {
  const kv_entry *e = &g->kv[i];
  return moe__error(MOE_ERR_DTYPE, __FILE__, __LINE__, "%s: '%s' is %s%s%s, want %s", g->path, e->key,
                    e->type == MOE_GGUFV_ARRAY ? "an array of " : "a ", vnames[e->elem],
                    e->type == MOE_GGUFV_ARRAY ? "" : " value", want);
}

/* An integer element as unsigned magnitude and sign. */
static void int_at(moe_gguf_vtype t, const uint8_t *p, uint64_t *mag, int *neg) {
  int n = vsizes[t];
  uint64_t u = le(p, n);
  int sgn = t == MOE_GGUFV_I8 || t == MOE_GGUFV_I16 || t == MOE_GGUFV_I32 || t == MOE_GGUFV_I64;
  *neg = sgn && (u >> (8 * n - 1)) & 1;
  *mag = *neg ? (n == 8 ? ~u + 1 : (UINT64_C(1) << (8 * n)) - u) : u;
}

moe_status moe_gguf_kv_int(const moe_gguf *g, int64_t i, uint64_t j, int64_t *out) {
  moe_gguf_vtype t;
  const uint8_t *p;
  MOE_CHECK(element(g, i, j, &t, &p));
  if (!is_int(t)) return wrong_type(g, i, "an integer");
  uint64_t m;
  int neg;
  int_at(t, p, &m, &neg);
  MOE_TRY(neg ? m <= (uint64_t)INT64_MAX + 1 : m <= (uint64_t)INT64_MAX, MOE_ERR_VALUE,
          "%s: '%s' = %" PRIu64 " does not fit an int64", g->path, g->kv[i].key, m);
  *out = neg ? (int64_t)(0 - m) : (int64_t)m;
  return MOE_OK;
}

moe_status moe_gguf_kv_float(const moe_gguf *g, int64_t i, uint64_t j, double *out) {
  moe_gguf_vtype t;
  const uint8_t *p;
  MOE_CHECK(element(g, i, j, &t, &p));
  if (t == MOE_GGUFV_F32 || t == MOE_GGUFV_F64) {
    if (t == MOE_GGUFV_F32) {
      uint32_t u = (uint32_t)le(p, 4);
      float f;
      memcpy(&f, &u, 4);
      *out = f;
    } else {
      uint64_t u = le(p, 8);
      memcpy(out, &u, 8);
    }
    return MOE_OK;
  }
  if (!is_int(t)) return wrong_type(g, i, "a number");
  uint64_t m;
  int neg;
  int_at(t, p, &m, &neg);
  *out = neg ? -(double)m : (double)m;
  return MOE_OK;
}

moe_status moe_gguf_kv_str(const moe_gguf *g, int64_t i, uint64_t j, const char **s, size_t *len) {
  moe_gguf_vtype t;
  const uint8_t *p;
  MOE_CHECK(element(g, i, j, &t, &p));
  if (t != MOE_GGUFV_STRING) return wrong_type(g, i, "a string");
  const str_ref *r = &g->str[g->kv[i].str0 + j];
  *s = g->strbuf + r->off;
  if (len) *len = (size_t)r->len;
  return MOE_OK;
}

/* The scalar entry `key` of an allowed kind. */
static moe_status scalar(const moe_gguf *g, const char *key, int64_t *i, int want_int, const char *want) {
  *i = moe_gguf_find_key(g, key);
  MOE_TRY(*i >= 0, MOE_ERR_MISSING, "%s: no metadata key '%s'", g->path, key);
  const kv_entry *e = &g->kv[*i];
  int ok = e->type != MOE_GGUFV_ARRAY && (want_int ? is_int(e->type) && e->type != MOE_GGUFV_BOOL : 1);
  return ok ? MOE_OK : wrong_type(g, *i, want);
}

static moe_status get_int(const moe_gguf *g, const char *key, int64_t lo, uint64_t hi, const char *want,
                          uint64_t *mag, int *neg) {
  int64_t i;
  MOE_CHECK(scalar(g, key, &i, 1, want));
  int_at(g->kv[i].type, g->map + g->kv[i].val, mag, neg);
  MOE_TRY(*neg ? lo < 0 && *mag <= (uint64_t)(-(lo + 1)) + 1 : *mag <= hi, MOE_ERR_VALUE,
          "%s: '%s' = %s%" PRIu64 " does not fit %s", g->path, key, *neg ? "-" : "", *mag, want);
  return MOE_OK;
}

moe_status moe_gguf_get_u32(const moe_gguf *g, const char *key, uint32_t *out) {
  uint64_t m;
  int neg;
  MOE_CHECK(get_int(g, key, 0, UINT32_MAX, "a u32", &m, &neg));
  *out = (uint32_t)m;
  return MOE_OK;
}

moe_status moe_gguf_get_i32(const moe_gguf *g, const char *key, int32_t *out) {
  uint64_t m;
  int neg;
  MOE_CHECK(get_int(g, key, INT32_MIN, INT32_MAX, "an i32", &m, &neg));
  *out = neg ? (int32_t)(0 - (int64_t)m) : (int32_t)m;
  return MOE_OK;
}

moe_status moe_gguf_get_u64(const moe_gguf *g, const char *key, uint64_t *out) {
  uint64_t m;
  int neg;
  MOE_CHECK(get_int(g, key, 0, UINT64_MAX, "a u64", &m, &neg));
  *out = m;
  return MOE_OK;
}

moe_status moe_gguf_get_f32(const moe_gguf *g, const char *key, float *out) {
  int64_t i;
  MOE_CHECK(scalar(g, key, &i, 0, "an f32"));
  moe_gguf_vtype t = g->kv[i].type;
  if (t != MOE_GGUFV_F32 && t != MOE_GGUFV_F64) return wrong_type(g, i, "an f32");
  double d;
  MOE_CHECK(moe_gguf_kv_float(g, i, 0, &d));
  *out = (float)d;
  return MOE_OK;
}

moe_status moe_gguf_get_bool(const moe_gguf *g, const char *key, int *out) {
  int64_t i;
  MOE_CHECK(scalar(g, key, &i, 0, "a bool"));
  if (g->kv[i].type != MOE_GGUFV_BOOL) return wrong_type(g, i, "a bool");
  *out = g->map[g->kv[i].val];
  return MOE_OK;
}

moe_status moe_gguf_get_str(const moe_gguf *g, const char *key, const char **out) {
  int64_t i;
  MOE_CHECK(scalar(g, key, &i, 0, "a string"));
  return moe_gguf_kv_str(g, i, 0, out, NULL);
}

static moe_status array(const moe_gguf *g, const char *key, int64_t *i) {
  *i = moe_gguf_find_key(g, key);
  MOE_TRY(*i >= 0, MOE_ERR_MISSING, "%s: no metadata key '%s'", g->path, key);
  return g->kv[*i].type == MOE_GGUFV_ARRAY ? MOE_OK : wrong_type(g, *i, "an array");
}

moe_status moe_gguf_get_arr(const moe_gguf *g, const char *key, moe_gguf_vtype *elem_type, uint64_t *n) {
  int64_t i;
  MOE_CHECK(array(g, key, &i));
  *elem_type = g->kv[i].elem, *n = g->kv[i].n;
  return MOE_OK;
}

moe_status moe_gguf_get_arr_str(const moe_gguf *g, const char *key, uint64_t j, const char **s, size_t *len) {
  int64_t i;
  MOE_CHECK(array(g, key, &i));
  return moe_gguf_kv_str(g, i, j, s, len);
}

moe_status moe_gguf_get_arr_int(const moe_gguf *g, const char *key, int64_t *dst, uint64_t n) {
  int64_t i;
  MOE_CHECK(array(g, key, &i));
  MOE_TRY(n == g->kv[i].n, MOE_ERR_SHAPE, "%s: '%s' has %" PRIu64 " elements, not %" PRIu64, g->path, key,
          g->kv[i].n, n);
  if (!is_int(g->kv[i].elem)) return wrong_type(g, i, "an array of integers");
  for (uint64_t j = 0; j < n; j++) MOE_CHECK(moe_gguf_kv_int(g, i, j, &dst[j]));
  return MOE_OK;
}

moe_status moe_gguf_get_arr_f32(const moe_gguf *g, const char *key, float *dst, uint64_t n) {
  int64_t i;
  MOE_CHECK(array(g, key, &i));
  MOE_TRY(n == g->kv[i].n, MOE_ERR_SHAPE, "%s: '%s' has %" PRIu64 " elements, not %" PRIu64, g->path, key,
          g->kv[i].n, n);
  moe_gguf_vtype t = g->kv[i].elem;
  if (t != MOE_GGUFV_F32 && t != MOE_GGUFV_F64) return wrong_type(g, i, "an array of f32");
  for (uint64_t j = 0; j < n; j++) {
    double d;
    MOE_CHECK(moe_gguf_kv_float(g, i, j, &d));
    dst[j] = (float)d;
  }
  return MOE_OK;
}

moe_status moe_gguf_tensor_at(const moe_gguf *g, int64_t i, moe_gguf_tensor *t) {
  MOE_TRY(i >= 0 && i < g->nt, MOE_ERR_ARG, "%s: tensor index %" PRId64 " out of [0, %" PRId64 ")", g->path, i, g->nt);
  *t = g->t[i];
  return MOE_OK;
}

static int64_t find_tensor(const moe_gguf *g, const char *name) {
  int64_t lo = 0, hi = g->nt;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    int c = strcmp(g->t[g->t_sorted[mid]].name, name);
    if (!c) return g->t_sorted[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

int moe_gguf_has_tensor(const moe_gguf *g, const char *name) { return find_tensor(g, name) >= 0; }

moe_status moe_gguf_tensor_get(const moe_gguf *g, const char *name, moe_gguf_tensor *t) {
  int64_t i = find_tensor(g, name);
  MOE_TRY(i >= 0, MOE_ERR_MISSING, "%s: no tensor '%s'", g->path, name);
  *t = g->t[i];
  return MOE_OK;
}

moe_status moe_gguf_tensor_row_f32(const moe_gguf *g, const moe_gguf_tensor *t, int64_t r, float *dst) {
  MOE_TRY(r >= 0 && r < t->nrows, MOE_ERR_ARG, "%s: tensor '%s': row %" PRId64 " of %" PRId64, g->path, t->name, r,
          t->nrows);
  MOE_TRY(moe_gguf_type_supported(t->type), MOE_ERR_DTYPE, "%s: tensor '%s': type %s cannot be read as floats here",
          g->path, t->name, moe_gguf_type_name(t->type));
  size_t row = (size_t)(t->ne[0] / moe_gguf_type_block(t->type)) * moe_gguf_type_block_bytes(t->type);
  return moe_gguf_dequantize(t->type, (const uint8_t *)t->data + (size_t)r * row, dst, t->ne[0]);
}
