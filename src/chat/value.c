/* The render's arena and errors, and the values: JavaScript's (numbers are doubles, strings are
 * counted in UTF-16 units), printed as @huggingface/jinja prints them. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat.h"

struct cj_chunk {
  cj_chunk *next;
  size_t cap, used;
  max_align_t data[];
};

void cj_fail(cj_ctx *c, size_t pos, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (pos == SIZE_MAX || pos > c->tmpl_len) {
    moe__error(c->status, __FILE__, __LINE__, "chat template: %s", msg);
  } else {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos; i++) {
      if (c->tmpl[i] == '\n') line++, col = 1;
      else if (((unsigned char)c->tmpl[i] & 0xC0) != 0x80) col++; /* columns count characters */
    }
    moe__error(c->status, __FILE__, __LINE__, "chat template: %s at %zu:%zu", msg, line, col);
  }
  longjmp(c->fail, 1);
}

void *cj_alloc(cj_ctx *c, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n > c->lim.max_bytes || c->used + n > c->lim.max_bytes)
    cj_fail(c, SIZE_MAX, "the render needs more than %zu bytes of memory", c->lim.max_bytes);
  cj_chunk *k = c->chunks;
  if (!k || k->cap - k->used < n) {
    size_t cap = n > (64u << 10) ? n : (64u << 10);
    k = malloc(sizeof *k + cap);
    if (!k) cj_fail(c, SIZE_MAX, "out of memory (%zu bytes)", cap);
    k->cap = cap;
    k->used = 0;
    k->next = c->chunks;
    c->chunks = k;
  }
  void *p = (char *)k->data + k->used;
  k->used += n;
  c->used += n;
  memset(p, 0, n);
  return p;
}

void cj_free_all(cj_ctx *c) {
  while (c->chunks) {
    cj_chunk *k = c->chunks;
    c->chunks = k->next;
    free(k);
  }
  c->used = 0;
}

cj_str cj_cstr(const char *s) { return (cj_str){s, strlen(s)}; }
int cj_str_eq(cj_str a, const char *b) { return strlen(b) == a.n && !memcmp(a.s, b, a.n); }

cj_val *cj_new(cj_ctx *c, cj_vtype t) {
  cj_val *v = cj_alloc(c, sizeof *v);
  v->t = t;
  return v;
}
cj_val *cj_bool(cj_ctx *c, int b) {
  cj_val *v = cj_new(c, V_BOOL);
  v->b = !!b;
  return v;
}
cj_val *cj_num(cj_ctx *c, cj_vtype t, double x) {
  cj_val *v = cj_new(c, t);
  v->num = x;
  return v;
}
cj_val *cj_string(cj_ctx *c, const char *s, size_t n) {
  cj_val *v = cj_new(c, V_STR);
  char *p = cj_alloc(c, n + 1);
  if (n) memcpy(p, s, n);
  v->str = (cj_str){p, n};
  return v;
}
cj_val *cj_array(cj_ctx *c, cj_vtype t, size_t n) {
  if (n > c->lim.max_items) cj_fail(c, SIZE_MAX, "a list of %zu items (more than %zu)", n, c->lim.max_items);
  cj_val *v = cj_new(c, t);
  v->arr.v = cj_alloc(c, (n ? n : 1) * sizeof *v->arr.v); /* never NULL: lists compare by identity */
  v->arr.n = n;
  return v;
}
cj_val *cj_object(cj_ctx *c, cj_vtype t) {
  cj_val *v = cj_new(c, t);
  v->map = cj_alloc(c, sizeof *v->map);
  return v;
}

cj_val *cj_map_get(const cj_map *m, const char *k, size_t n) {
  for (size_t i = 0; i < m->n; i++)
    if (m->keys[i].n == n && !memcmp(m->keys[i].s, k, n)) return m->vals[i];
  return NULL;
}

void cj_map_reserve(cj_ctx *c, cj_map *m, size_t cap) {
  if (cap <= m->cap) return;
  cj_str *keys = cj_alloc(c, cap * sizeof *keys);
  cj_val **vals = cj_alloc(c, cap * sizeof *vals);
  if (m->n) {
    memcpy(keys, m->keys, m->n * sizeof *keys);
    memcpy(vals, m->vals, m->n * sizeof *vals);
  }
  m->keys = keys;
  m->vals = vals;
  m->cap = cap;
}

void cj_map_set(cj_ctx *c, cj_map *m, cj_str k, cj_val *v) {
  for (size_t i = 0; i < m->n; i++)
    if (m->keys[i].n == k.n && !memcmp(m->keys[i].s, k.s, k.n)) {
      m->vals[i] = v;
      return;
    }
  if (m->n == m->cap) cj_map_reserve(c, m, m->cap ? 2 * m->cap : 4);
  m->keys[m->n] = k;
  m->vals[m->n++] = v;
}

/* An array index as JavaScript orders an object's own keys: those come first, ascending. */
static int array_index(const char *k, double *out) {
  size_t n = strlen(k);
  if (!n || n > 10 || (n > 1 && k[0] == '0')) return 0;
  double x = 0;
  for (size_t i = 0; i < n; i++) {
    if (k[i] < '0' || k[i] > '9') return 0;
    x = x * 10 + (k[i] - '0');
  }
  *out = x;
  return x < 4294967295.0;
}

cj_val *cj_from_json(cj_ctx *c, const void *json) {
  const cJSON *j = json;
  if (cJSON_IsNull(j)) return cj_new(c, V_NULL);
  if (cJSON_IsBool(j)) return cj_bool(c, cJSON_IsTrue(j));
  if (cJSON_IsNumber(j)) {
    double x = j->valuedouble;
    return cj_num(c, isfinite(x) && x == floor(x) ? V_INT : V_FLOAT, x);
  }
  if (cJSON_IsString(j)) return cj_string(c, j->valuestring, strlen(j->valuestring));
  if (cJSON_IsArray(j)) {
    cj_val *v = cj_array(c, V_ARRAY, (size_t)cJSON_GetArraySize(j));
    size_t i = 0;
    for (const cJSON *e = j->child; e; e = e->next) v->arr.v[i++] = cj_from_json(c, e);
    return v;
  }
  if (cJSON_IsObject(j)) {
    cj_val *v = cj_object(c, V_OBJECT);
    double lo = -1, x;
    /* Object.entries order: the array-index keys ascending, then the others as written. */
    for (;;) {
      double best = INFINITY;
      for (const cJSON *e = j->child; e; e = e->next)
        if (array_index(e->string, &x) && x > lo && x < best) best = x;
      if (best == INFINITY) break;
      for (const cJSON *e = j->child; e; e = e->next)
        if (array_index(e->string, &x) && x == best)
          cj_map_set(c, v->map, cj_cstr(e->string), cj_from_json(c, e));
      lo = best;
    }
    for (const cJSON *e = j->child; e; e = e->next)
      if (!array_index(e->string, &x)) cj_map_set(c, v->map, cj_cstr(e->string), cj_from_json(c, e));
    return v;
  }
  cj_fail(c, SIZE_MAX, "unreadable JSON value");
}

int cj_is_object(const cj_val *v) { return v->t == V_OBJECT || v->t == V_KWARGS; }
int cj_is_array(const cj_val *v) { return v->t == V_ARRAY || v->t == V_TUPLE; }

int cj_truthy(const cj_val *v) {
  switch (v->t) {
    case V_UNDEF: case V_NULL: return 0;
    case V_BOOL: return v->b;
    case V_INT: case V_FLOAT: return v->num != 0 && !isnan(v->num);
    case V_STR: return v->str.n > 0;
    case V_ARRAY: case V_TUPLE: return v->arr.n > 0;
    case V_OBJECT: case V_KWARGS: return v->map->n > 0;
    default: return 1; /* a namespace (a JavaScript Map) and a function are always true */
  }
}

const char *cj_type_name(cj_vtype t) {
  static const char *names[] = {"undefined", "none", "boolean", "integer", "float", "string", "list",
                                "tuple", "object", "keyword arguments", "namespace", "function"};
  return names[t];
}

void cj_put(cj_ctx *c, cj_buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = cj_alloc(c, cap);
    if (b->n) memcpy(p, b->s, b->n);
    b->s = p;
    b->cap = cap;
  }
  if (n) memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}

cj_val *cj_buf_string(cj_ctx *c, const cj_buf *b) {
  cj_val *v = cj_new(c, V_STR);
  v->str = b->s ? (cj_str){b->s, b->n} : (cj_str){"", 0};
  return v;
}

void cj_put_number(cj_ctx *c, cj_buf *b, double x) {
  char digits[40], out[16];
  if (isnan(x)) return cj_put(c, b, "NaN", 3);
  if (isinf(x)) return x < 0 ? cj_put(c, b, "-Infinity", 9) : cj_put(c, b, "Infinity", 8);
  if (x == 0) return cj_put(c, b, "0", 1);
  if (x < 0) {
    cj_put(c, b, "-", 1);
    x = -x;
  }
  /* The shortest digits that read back as x, and the decimal exponent n: x = 0.DIGITS * 10^n. */
  char e[40];
  int p = 1;
  for (; p <= 17; p++) {
    snprintf(e, sizeof e, "%.*e", p - 1, x);
    if (strtod(e, NULL) == x) break;
  }
  size_t k = 0;
  const char *q = e;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[k++] = *q;
  while (k > 1 && digits[k - 1] == '0') k--;
  digits[k] = 0;
  int n = atoi(q + 1) + 1, nk = (int)k;
  static const char zeros[] = "000000000000000000000";
  if (nk <= n && n <= 21) {
    cj_put(c, b, digits, k);
    cj_put(c, b, zeros, (size_t)(n - nk));
  } else if (0 < n && n <= 21) {
    cj_put(c, b, digits, (size_t)n);
    cj_put(c, b, ".", 1);
    cj_put(c, b, digits + n, k - (size_t)n);
  } else if (-6 < n && n <= 0) {
    cj_put(c, b, "0.", 2);
    cj_put(c, b, zeros, (size_t)-n);
    cj_put(c, b, digits, k);
  } else {
    cj_put(c, b, digits, 1);
    if (k > 1) {
      cj_put(c, b, ".", 1);
      cj_put(c, b, digits + 1, k - 1);
    }
    int len = snprintf(out, sizeof out, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
    cj_put(c, b, out, (size_t)len);
  }
}

static void put_float(cj_ctx *c, cj_buf *b, double x) {
  if (x == 0 && signbit(x)) return cj_put(c, b, "-0.0", 4);
  if (isfinite(x) && x == floor(x) && fabs(x) < 1e21) { /* toFixed(1) */
    char out[400];
    int len = snprintf(out, sizeof out, "%.1f", x);
    return cj_put(c, b, out, (size_t)len);
  }
  cj_put_number(c, b, x);
}

void cj_put_value(cj_ctx *c, cj_buf *b, const cj_val *v, size_t pos) {
  static const cj_json_opts plain = {0, 0, 0, NULL, NULL, 0};
  switch (v->t) {
    case V_UNDEF: return cj_put(c, b, "undefined", 9);
    case V_NULL: return cj_put(c, b, "null", 4);
    case V_BOOL: return v->b ? cj_put(c, b, "true", 4) : cj_put(c, b, "false", 5);
    case V_INT: return cj_put_number(c, b, v->num);
    case V_FLOAT: return put_float(c, b, v->num);
    case V_STR: return cj_puts(c, b, v->str);
    case V_FUNC: cj_fail(c, pos, "cannot print a function");
    default: return cj_put_json(c, b, v, &plain, 0, pos);
  }
}

void cj_put_raw(cj_ctx *c, cj_buf *b, const cj_val *v, size_t pos) {
  switch (v->t) {
    case V_INT: case V_FLOAT: return cj_put_number(c, b, v->num);
    case V_ARRAY: case V_TUPLE: /* Array.prototype.toString: the elements' toString joined by commas */
      for (size_t i = 0; i < v->arr.n; i++) {
        if (i) cj_put(c, b, ",", 1);
        cj_put_value(c, b, v->arr.v[i], pos);
      }
      return;
    case V_OBJECT: case V_KWARGS: case V_NS: return cj_put(c, b, "[object Map]", 12);
    default: return cj_put_value(c, b, v, pos);
  }
}

/* JSON.stringify of a string, then (ensure_ascii) every UTF-16 unit from 0x7f as \uXXXX. */
static void put_json_string(cj_ctx *c, cj_buf *b, cj_str s, int ascii) {
  char esc[16];
  cj_put(c, b, "\"", 1);
  for (size_t i = 0; i < s.n;) {
    size_t len;
    uint32_t cp = cj_utf8_next(s.s, s.n, i, &len);
    unsigned char ch = (unsigned char)s.s[i];
    if (cp == '"' || cp == '\\') {
      esc[0] = '\\', esc[1] = (char)cp;
      cj_put(c, b, esc, 2);
    } else if (cp < 0x20) {
      const char *named = cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : cp == '\t' ? "\\t" : NULL;
      if (named) cj_put(c, b, named, 2);
      else cj_put(c, b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", cp));
    } else if (ascii && cp >= 0x7f) {
      if (cp >= 0x10000)
        cj_put(c, b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                                           0xDC00 + ((cp - 0x10000) & 0x3FF)));
      else cj_put(c, b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", cp));
    } else if (cp == 0xFFFD && len == 1 && ch >= 0x80) {
      cj_put(c, b, "\xEF\xBF\xBD", 3); /* a byte that is not UTF-8 */
    } else {
      cj_put(c, b, s.s + i, len);
    }
    i += len;
  }
  cj_put(c, b, "\"", 1);
}

/* localeCompare's order, roughly: letters case-blind first, lower case before upper on a tie. */
static int key_cmp(cj_str a, cj_str b) {
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < a.n && i < b.n; i++) {
      int x = (unsigned char)a.s[i], y = (unsigned char)b.s[i];
      if (!pass) {
        x = x >= 'A' && x <= 'Z' ? x + 32 : x;
        y = y >= 'A' && y <= 'Z' ? y + 32 : y;
      } else {
        x = x >= 'a' && x <= 'z' ? x - 64 : x; /* lower sorts first */
        y = y >= 'a' && y <= 'z' ? y - 64 : y;
      }
      if (x != y) return x - y;
    }
    if (a.n != b.n) return a.n < b.n ? -1 : 1;
  }
  return 0;
}

void cj_put_json(cj_ctx *c, cj_buf *b, const cj_val *v, const cj_json_opts *o, int depth, size_t pos) {
  if (depth > c->lim.max_depth) cj_fail(c, pos, "tojson: nesting deeper than %d", c->lim.max_depth);
  const char *item = o->item_sep ? o->item_sep : o->indent ? "," : ", ";
  const char *key = o->key_sep ? o->key_sep : ": ";
  switch (v->t) {
    case V_NULL: return cj_put(c, b, "null", 4);
    case V_UNDEF: return o->undefined_as_null ? cj_put(c, b, "null", 4) : cj_put(c, b, "undefined", 9);
    case V_INT: case V_FLOAT:
      if (!isfinite(v->num)) return cj_put(c, b, "null", 4);
      return cj_put_number(c, b, v->num);
    case V_BOOL: return cj_put_value(c, b, v, pos);
    case V_STR: return put_json_string(c, b, v->str, o->ensure_ascii);
    case V_ARRAY: case V_OBJECT: case V_NS: break;
    default: cj_fail(c, pos, "cannot convert a %s to JSON", cj_type_name(v->t));
  }
  size_t n = v->t == V_ARRAY ? v->arr.n : v->map->n;
  int ind = o->indent && n > 0;
  cj_put(c, b, v->t == V_ARRAY ? "[" : "{", 1);
  size_t *order = NULL;
  if (v->t != V_ARRAY && o->sort_keys && n) { /* a stable insertion sort of the keys */
    order = cj_alloc(c, n * sizeof *order);
    for (size_t i = 0; i < n; i++) {
      size_t j = i;
      for (; j > 0 && key_cmp(v->map->keys[order[j - 1]], v->map->keys[i]) > 0; j--) order[j] = order[j - 1];
      order[j] = i;
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (i) cj_put(c, b, item, strlen(item));
    if (ind) {
      cj_put(c, b, "\n", 1);
      for (int d = 0; d < (depth + 1) * o->indent; d++) cj_put(c, b, " ", 1);
    }
    if (v->t == V_ARRAY) {
      cj_put_json(c, b, v->arr.v[i], o, depth + 1, pos);
    } else {
      size_t k = order ? order[i] : i;
      put_json_string(c, b, v->map->keys[k], o->ensure_ascii);
      cj_put(c, b, key, strlen(key));
      cj_put_json(c, b, v->map->vals[k], o, depth + 1, pos);
    }
  }
  if (ind) {
    cj_put(c, b, "\n", 1);
    for (int d = 0; d < depth * o->indent; d++) cj_put(c, b, " ", 1);
  }
  cj_put(c, b, v->t == V_ARRAY ? "]" : "}", 1);
}

/* JavaScript's ToNumber of a string: blank is 0, otherwise a decimal (or Infinity) with blanks around. */
static double js_str_to_number(cj_str s) {
  s = cj_trim(s, 1, 1);
  if (!s.n) return 0;
  char buf[128];
  if (s.n >= sizeof buf) return NAN;
  memcpy(buf, s.s, s.n);
  buf[s.n] = 0;
  const char *p = buf + (buf[0] == '+' || buf[0] == '-');
  if (!strcmp(p, "Infinity")) return buf[0] == '-' ? -INFINITY : INFINITY;
  if (buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X' || buf[1] == 'o' || buf[1] == 'O' || buf[1] == 'b' || buf[1] == 'B')) {
    int base = buf[1] == 'x' || buf[1] == 'X' ? 16 : buf[1] == 'o' || buf[1] == 'O' ? 8 : 2;
    char *end;
    double x = (double)strtoull(buf + 2, &end, base);
    return *end || !buf[2] ? NAN : x;
  }
  for (const char *q = p; *q; q++)
    if (!strchr("0123456789.eE+-", *q)) return NAN; /* strtod would take hex, inf and nan */
  char *end;
  double x = strtod(buf, &end);
  return *end ? NAN : x;
}

static int primitive(const cj_val *v) { return v->t <= V_STR; }

int cj_strict_eq(const cj_val *a, const cj_val *b) {
  int an = a->t == V_INT || a->t == V_FLOAT, bn = b->t == V_INT || b->t == V_FLOAT;
  if (an || bn) return an && bn && a->num == b->num;
  if (a->t != b->t) return 0;
  switch (a->t) {
    case V_UNDEF: case V_NULL: return 1;
    case V_BOOL: return a->b == b->b;
    case V_STR: return a->str.n == b->str.n && !memcmp(a->str.s, b->str.s, a->str.n);
    case V_ARRAY: case V_TUPLE: return a->arr.v == b->arr.v;
    case V_OBJECT: case V_KWARGS: case V_NS: return a->map == b->map;
    default: return a == b;
  }
}

int cj_loose_eq(const cj_val *a, const cj_val *b) {
  int an = a->t == V_INT || a->t == V_FLOAT, bn = b->t == V_INT || b->t == V_FLOAT;
  if ((a->t <= V_NULL) || (b->t <= V_NULL)) return a->t <= V_NULL && b->t <= V_NULL;
  if (an && bn) return a->num == b->num;
  if (!primitive(a) || !primitive(b)) return cj_strict_eq(a, b); /* objects: the same one */
  if (a->t == b->t) return cj_strict_eq(a, b);
  double x = a->t == V_BOOL ? a->b : an ? a->num : js_str_to_number(a->str);
  double y = b->t == V_BOOL ? b->b : bn ? b->num : js_str_to_number(b->str);
  return x == y;
}

/* ---- UTF-8 and JavaScript's notion of characters ---- */
int cj_js_space(uint32_t cp) {
  return cp == ' ' || (cp >= 9 && cp <= 13) || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

uint32_t cj_utf8_next(const char *s, size_t n, size_t i, size_t *len) {
  const unsigned char *p = (const unsigned char *)s + i;
  size_t left = n - i;
  *len = 1;
  if (p[0] < 0x80) return p[0];
  int k = p[0] >= 0xF0 && p[0] < 0xF5 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 && p[0] < 0xE0 ? 2 : 0;
  if (!k || (size_t)k > left || (p[0] >= 0xF5)) return 0xFFFD;
  uint32_t cp = p[0] & (0x7F >> k);
  for (int j = 1; j < k; j++) {
    if ((p[j] & 0xC0) != 0x80) return 0xFFFD;
    cp = cp << 6 | (p[j] & 0x3F);
  }
  if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0xFFFD;
  *len = (size_t)k;
  return cp;
}

size_t cj_utf16_len(const char *s, size_t n) {
  size_t units = 0, len;
  for (size_t i = 0; i < n; i += len) units += cj_utf8_next(s, n, i, &len) >= 0x10000 ? 2 : 1;
  return units;
}

cj_str cj_trim(cj_str s, int start, int end) {
  size_t len;
  while (start && s.n && cj_js_space(cj_utf8_next(s.s, s.n, 0, &len))) s.s += len, s.n -= len;
  while (end && s.n) { /* back to the start of the last character */
    size_t i = s.n - 1;
    while (i > 0 && ((unsigned char)s.s[i] & 0xC0) == 0x80 && s.n - i < 4) i--;
    uint32_t cp = cj_utf8_next(s.s, s.n, i, &len);
    if (i + len != s.n) cp = 0xFFFD, i = s.n - 1;
    if (!cj_js_space(cp)) break;
    s.n = i;
  }
  return s;
}
