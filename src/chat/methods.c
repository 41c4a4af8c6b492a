/* The methods of strings (upper, strip, split, replace, ...) and objects (get, items, ...), and the
 * globals (namespace, range, raise_exception, strftime_now, true/false/none), as @huggingface/jinja
 * defines them: strip() and its kin take no argument and strip all whitespace, as there. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "chat.h"

static cj_val *method(cj_ctx *c, cj_val *self, const char *name) {
  cj_val *f = cj_new(c, V_FUNC);
  f->fn.kind = F_METHOD;
  f->fn.name = name;
  f->fn.self = self;
  return f;
}

cj_val *cj_builtin_member(cj_ctx *c, cj_val *obj, cj_str name) {
  static const char *const STR[] = {"upper", "lower", "strip", "title", "capitalize", "rstrip", "lstrip",
                                    "startswith", "endswith", "split", "replace", NULL};
  static const char *const OBJ[] = {"get", "items", "keys", "values", "dictsort", NULL};
  const char *const *names = obj->t == V_STR ? STR : cj_is_object(obj) ? OBJ : NULL;
  if ((obj->t == V_STR || cj_is_array(obj)) && cj_str_eq(name, "length"))
    return cj_num(c, V_INT, obj->t == V_STR ? (double)cj_utf16_len(obj->str.s, obj->str.n) : (double)obj->arr.n);
  for (; names && *names; names++)
    if (cj_str_eq(name, *names)) return method(c, obj, *names);
  return NULL;
}

static int has_prefix(cj_str s, cj_str p, int at_end) {
  return p.n <= s.n && !memcmp(s.s + (at_end ? s.n - p.n : 0), p.s, p.n);
}

static size_t find(cj_str s, size_t from, cj_str needle) {
  const char *p = from <= s.n ? memmem(s.s + from, s.n - from, needle.s, needle.n) : NULL;
  return p ? (size_t)(p - s.s) : SIZE_MAX;
}

static void push(cj_ctx *c, cj_val ***list, size_t *n, size_t *cap, cj_val *v) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 8;
    if (*cap > c->lim.max_items) cj_fail(c, SIZE_MAX, "a list of more than %zu items", c->lim.max_items);
    cj_val **nv = cj_alloc(c, *cap * sizeof *nv);
    if (*n) memcpy(nv, *list, *n * sizeof *nv);
    *list = nv;
  }
  (*list)[(*n)++] = v;
}

static cj_val *list_of(cj_ctx *c, cj_val **items, size_t n) {
  cj_val *a = cj_array(c, V_ARRAY, n);
  if (n) memcpy(a->arr.v, items, n * sizeof *items);
  return a;
}

/* Python's str.split as runtime.ts writes it. */
static cj_val *split(cj_ctx *c, cj_str s, cj_val **args, size_t n, size_t pos) {
  cj_val *sep = n > 0 ? args[0] : NULL, *maxv = n > 1 ? args[1] : NULL;
  if (sep && sep->t != V_STR && sep->t != V_NULL) cj_fail(c, pos, "split: the separator must be a string or none");
  if (maxv && maxv->t != V_INT) cj_fail(c, pos, "split: maxsplit must be an integer");
  double maxsplit = maxv ? maxv->num : -1;
  cj_val **items = NULL;
  size_t k = 0, cap = 0, len;
  if (!sep || sep->t == V_NULL) {
    cj_str t = cj_trim(s, 1, 0);
    for (size_t i = 0; i < t.n;) {
      if (cj_js_space(cj_utf8_next(t.s, t.n, i, &len))) {
        i += len;
        continue;
      }
      size_t j = i;
      while (j < t.n && !cj_js_space(cj_utf8_next(t.s, t.n, j, &len))) j += len;
      if (maxsplit != -1 && (double)k >= maxsplit) {
        push(c, &items, &k, &cap, cj_string(c, t.s + i, t.n - i));
        break;
      }
      push(c, &items, &k, &cap, cj_string(c, t.s + i, j - i));
      i = j;
    }
    return list_of(c, items, k);
  }
  cj_str d = sep->str;
  if (!d.n) cj_fail(c, pos, "split: empty separator");
  size_t *starts = NULL, nparts = 0, pcap = 0;
  for (size_t i = 0;;) {
    size_t j = find(s, i, d);
    if (nparts == pcap) {
      pcap = pcap ? 2 * pcap : 8;
      if (pcap / 2 > c->lim.max_items) cj_fail(c, pos, "split: more than %zu parts", c->lim.max_items);
      size_t *ns = cj_alloc(c, pcap * 2 * sizeof *ns);
      if (nparts) memcpy(ns, starts, nparts * 2 * sizeof *ns);
      starts = ns;
    }
    starts[2 * nparts] = i;
    starts[2 * nparts + 1] = j == SIZE_MAX ? s.n : j;
    nparts++;
    if (j == SIZE_MAX) break;
    i = j + d.n;
  }
  size_t keep = nparts; /* splice(maxsplit): a negative one counts from the end */
  if (maxsplit != -1 && (double)nparts > maxsplit)
    keep = maxsplit < 0 ? (size_t)fmax((double)nparts + maxsplit, 0) : (size_t)maxsplit;
  for (size_t p = 0; p < keep; p++) push(c, &items, &k, &cap, cj_string(c, s.s + starts[2 * p], starts[2 * p + 1] - starts[2 * p]));
  if (keep < nparts) push(c, &items, &k, &cap, cj_string(c, s.s + starts[2 * keep], s.n - starts[2 * keep]));
  return list_of(c, items, k);
}

/* Python's str.replace(old, new, count) as utils.ts writes it (an empty old: between characters). */
static cj_val *replace(cj_ctx *c, cj_str s, cj_val **args, size_t n, size_t pos) {
  if (n < 2) cj_fail(c, pos, "replace takes two arguments at least");
  if (args[0]->t != V_STR || args[1]->t != V_STR) cj_fail(c, pos, "replace: its arguments must be strings");
  const cj_val *count = NULL;
  if (n > 2) count = args[2]->t == V_KWARGS ? cj_map_get(args[2]->map, "count", 5) : args[2];
  if (count && count->t != V_INT && count->t != V_NULL) cj_fail(c, pos, "replace: count must be an integer or none");
  double left = !count || count->t == V_NULL || count->num < 0 ? INFINITY : count->num;
  cj_str old = args[0]->str, new = args[1]->str;
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  size_t len;
  if (!old.n) {
    for (size_t i = 0;; i += len) {
      if (left > 0) {
        cj_puts(c, &b, new);
        left--;
      }
      if (i >= s.n) break;
      cj_utf8_next(s.s, s.n, i, &len);
      cj_put(c, &b, s.s + i, len);
    }
    return cj_buf_string(c, &b);
  }
  size_t i = 0;
  while (left > 0) {
    size_t j = find(s, i, old);
    if (j == SIZE_MAX) break;
    cj_put(c, &b, s.s + i, j - i);
    cj_puts(c, &b, new);
    i = j + old.n;
    left--;
  }
  cj_put(c, &b, s.s + i, s.n - i);
  return cj_buf_string(c, &b);
}

static cj_val *affix(cj_ctx *c, cj_str s, cj_val **args, size_t n, int end, size_t pos) {
  const char *what = end ? "endswith" : "startswith";
  if (!n) cj_fail(c, pos, "%s takes an argument", what);
  if (args[0]->t == V_STR) return cj_bool(c, has_prefix(s, args[0]->str, end));
  if (!cj_is_array(args[0])) cj_fail(c, pos, "%s takes a string or a list of strings", what);
  for (size_t i = 0; i < args[0]->arr.n; i++) {
    if (args[0]->arr.v[i]->t != V_STR) cj_fail(c, pos, "%s: the list must hold strings", what);
    if (has_prefix(s, args[0]->arr.v[i]->str, end)) return cj_bool(c, 1);
  }
  return cj_bool(c, 0);
}

static cj_val *string_method(cj_ctx *c, const char *m, cj_str s, cj_val **args, size_t n, size_t pos) {
  if (!strcmp(m, "upper")) return cj_recase(c, s, CJ_UPPER);
  if (!strcmp(m, "lower")) return cj_recase(c, s, CJ_LOWER);
  if (!strcmp(m, "title")) return cj_recase(c, s, CJ_TITLE);
  if (!strcmp(m, "capitalize")) return cj_recase(c, s, CJ_CAPITALIZE);
  if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
    cj_str t = cj_trim(s, m[0] != 'r', m[0] != 'l');
    return cj_string(c, t.s, t.n);
  }
  if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) return affix(c, s, args, n, m[0] == 'e', pos);
  if (!strcmp(m, "split")) return split(c, s, args, n, pos);
  return replace(c, s, args, n, pos);
}

static cj_val *pairs(cj_ctx *c, const cj_map *m, int which) { /* 0 items, 1 keys, 2 values */
  cj_val *a = cj_array(c, V_ARRAY, m->n);
  for (size_t i = 0; i < m->n; i++) {
    cj_val *k = cj_string(c, m->keys[i].s, m->keys[i].n);
    if (which == 1) {
      a->arr.v[i] = k;
    } else if (which == 2) {
      a->arr.v[i] = m->vals[i];
    } else {
      cj_val *p = cj_array(c, V_ARRAY, 2);
      p->arr.v[0] = k;
      p->arr.v[1] = m->vals[i];
      a->arr.v[i] = p;
    }
  }
  return a;
}

static cj_val *namespace(cj_ctx *c, cj_val **args, size_t n, size_t pos) {
  const cj_map *kw = n && args[n - 1]->t == V_KWARGS ? args[--n]->map : NULL;
  if (n > 1) cj_fail(c, pos, "namespace takes at most one positional argument, given %zu", n);
  cj_val *ns = cj_object(c, V_NS);
  if (n == 1) {
    const cj_val *src = args[0];
    if (cj_is_object(src)) {
      for (size_t i = 0; i < src->map->n; i++) cj_map_set(c, ns->map, src->map->keys[i], src->map->vals[i]);
    } else if (cj_is_array(src)) {
      for (size_t i = 0; i < src->arr.n; i++) {
        const cj_val *p = src->arr.v[i];
        if (!cj_is_array(p) || p->arr.n != 2 || p->arr.v[0]->t != V_STR)
          cj_fail(c, pos, "namespace takes a mapping or a list of [key, value] pairs");
        cj_map_set(c, ns->map, p->arr.v[0]->str, p->arr.v[1]);
      }
    } else {
      cj_fail(c, pos, "namespace takes a mapping or a list of pairs, not a %s", cj_type_name(src->t));
    }
  }
  for (size_t i = 0; kw && i < kw->n; i++) cj_map_set(c, ns->map, kw->keys[i], kw->vals[i]);
  return ns;
}

static double number_arg(cj_ctx *c, const cj_val *v, size_t pos) {
  if (v->t != V_INT && v->t != V_FLOAT) cj_fail(c, pos, "range takes numbers, not a %s", cj_type_name(v->t));
  return v->num;
}

static cj_val *range(cj_ctx *c, cj_val **args, size_t n, size_t pos) {
  if (n < 1 || n > 3) cj_fail(c, pos, "range takes 1 to 3 numbers, given %zu", n);
  double start = number_arg(c, args[0], pos), stop, step = 1;
  if (n == 1) stop = start, start = 0;
  else stop = number_arg(c, args[1], pos);
  if (n == 3) step = number_arg(c, args[2], pos);
  if (step == 0) cj_fail(c, pos, "range: step must not be zero");
  double count = (step > 0 ? stop > start : stop < start) ? ceil((stop - start) / step) : 0;
  if (!(count <= (double)c->lim.max_items)) cj_fail(c, pos, "range of more than %zu numbers", c->lim.max_items);
  cj_val *a = cj_array(c, V_ARRAY, (size_t)count);
  double x = start;
  for (size_t i = 0; i < (size_t)count; i++, x += step) a->arr.v[i] = cj_num(c, x == floor(x) ? V_INT : V_FLOAT, x);
  return a;
}

/* Python's strftime as utils.ts writes it: %Y %m %d %b %B %H %M %% (English month names); other
 * directives stay as written. */
static cj_val *strftime_now(cj_ctx *c, cj_val **args, size_t n, size_t pos) {
  static const char *const MONTHS[] = {"January", "February", "March", "April", "May", "June", "July",
                                       "August", "September", "October", "November", "December"};
  if (!n || args[0]->t != V_STR) cj_fail(c, pos, "strftime_now takes a format string");
  struct tm tm;
  time_t t = c->now >= 0 ? (time_t)c->now : time(NULL);
  if (c->now >= 0) gmtime_r(&t, &tm);
  else localtime_r(&t, &tm);
  cj_str f = args[0]->str;
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  char num[32];
  for (size_t i = 0; i < f.n; i++) {
    char d = i + 1 < f.n && f.s[i] == '%' ? f.s[i + 1] : 0;
    if (!d || !strchr("YmdbBHM%", d)) {
      cj_put(c, &b, f.s + i, 1);
      continue;
    }
    i++;
    int v = d == 'Y' ? tm.tm_year + 1900 : d == 'm' ? tm.tm_mon + 1 : d == 'd' ? tm.tm_mday : d == 'H' ? tm.tm_hour : tm.tm_min;
    if (d == '%') cj_put(c, &b, "%", 1);
    else if (d == 'B') cj_put(c, &b, MONTHS[tm.tm_mon], strlen(MONTHS[tm.tm_mon]));
    else if (d == 'b') cj_put(c, &b, MONTHS[tm.tm_mon], 3);
    else cj_put(c, &b, num, (size_t)snprintf(num, sizeof num, d == 'Y' ? "%d" : "%02d", v));
  }
  return cj_buf_string(c, &b);
}

cj_val *cj_call_builtin(cj_ctx *c, cj_val *fn, cj_val **args, size_t n, cj_env *env, size_t pos) {
  (void)env;
  const char *m = fn->fn.name;
  cj_val *self = fn->fn.self;
  if (fn->fn.kind == F_METHOD && self->t == V_STR) return string_method(c, m, self->str, args, n, pos);
  if (fn->fn.kind == F_METHOD) {
    if (!strcmp(m, "get")) {
      if (!n || args[0]->t != V_STR) cj_fail(c, pos, "get takes a string key");
      cj_val *v = cj_map_get(self->map, args[0]->str.s, args[0]->str.n);
      return v ? v : n > 1 ? args[1] : cj_new(c, V_NULL);
    }
    if (!strcmp(m, "dictsort")) return cj_dictsort(c, self, args, n, pos);
    return pairs(c, self->map, !strcmp(m, "items") ? 0 : !strcmp(m, "keys") ? 1 : 2);
  }
  if (!strcmp(m, "namespace")) return namespace(c, args, n, pos);
  if (!strcmp(m, "range")) return range(c, args, n, pos);
  if (!strcmp(m, "strftime_now")) return strftime_now(c, args, n, pos);
  /* raise_exception: the template's own error, its message as the template wrote it */
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  if (n) cj_put_raw(c, &b, args[0], pos);
  cj_fail(c, pos, "raise_exception: %s", b.s);
}

void cj_set_globals(cj_ctx *c, cj_env *env) {
  static const char *const FUNCS[] = {"raise_exception", "range", "strftime_now"};
  for (size_t i = 0; i < 3; i++) {
    cj_val *f = cj_new(c, V_FUNC);
    f->fn.kind = F_BUILTIN;
    f->fn.name = FUNCS[i];
    cj_env_set(c, env, cj_cstr(FUNCS[i]), f);
  }
  cj_env_set(c, env, cj_cstr("true"), cj_bool(c, 1));
  cj_env_set(c, env, cj_cstr("false"), cj_bool(c, 0));
  cj_env_set(c, env, cj_cstr("none"), cj_new(c, V_NULL));
  cj_env_set(c, env, cj_cstr("True"), cj_bool(c, 1));
  cj_env_set(c, env, cj_cstr("False"), cj_bool(c, 0));
  cj_env_set(c, env, cj_cstr("None"), cj_new(c, V_NULL));
}
