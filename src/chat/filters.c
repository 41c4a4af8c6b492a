/* The filters (`x | name` and `x | name(args)`) and tests (`x is name`) of @huggingface/jinja, with
 * the types each accepts: anything else is an error naming the filter and the value's type. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

static cj_val *to_json(cj_ctx *c, const cj_val *v, const cj_json_opts *o, size_t pos) {
  cj_buf b = {0};
  cj_put_json(c, &b, v, o, 0, pos);
  return cj_buf_string(c, &b);
}

/* JavaScript's parseInt(s, 10) and parseFloat(s); NaN when no number starts the string. */
static double parse_number(cj_str s, int integer) {
  s = cj_trim(s, 1, 0);
  size_t i = 0;
  char buf[512];
  if (i < s.n && (s.s[i] == '+' || s.s[i] == '-')) i++;
  size_t d0 = i;
  if (!integer && s.n - i >= 8 && !memcmp(s.s + i, "Infinity", 8)) return s.s[0] == '-' ? -INFINITY : INFINITY;
  while (i < s.n && s.s[i] >= '0' && s.s[i] <= '9') i++;
  size_t intd = i - d0, fracd = 0;
  if (!integer && i < s.n && s.s[i] == '.') {
    size_t j = i + 1;
    while (j < s.n && s.s[j] >= '0' && s.s[j] <= '9') j++;
    fracd = j - i - 1;
    if (intd || fracd) i = j;
  }
  if (!intd && !fracd) return NAN;
  if (!integer && i < s.n && (s.s[i] == 'e' || s.s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.n && (s.s[j] == '+' || s.s[j] == '-')) j++;
    size_t e0 = j;
    while (j < s.n && s.s[j] >= '0' && s.s[j] <= '9') j++;
    if (j > e0) i = j;
  }
  if (i >= sizeof buf) i = sizeof buf - 1;
  memcpy(buf, s.s, i);
  buf[i] = 0;
  return strtod(buf, NULL);
}

/* compareRuntimeValues: numbers (and booleans) with numbers, strings with strings. */
static int compare(cj_ctx *c, const cj_val *a, const cj_val *b, int case_sensitive, size_t pos) {
  int an = a->t == V_INT || a->t == V_FLOAT || a->t == V_BOOL, bn = b->t == V_INT || b->t == V_FLOAT || b->t == V_BOOL;
  if ((a->t == V_NULL && b->t == V_NULL) || (a->t == V_UNDEF && b->t == V_UNDEF)) return 0;
  if (an && bn) {
    double x = a->t == V_BOOL ? a->b : a->num, y = b->t == V_BOOL ? b->b : b->num;
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a->t != b->t || a->t != V_STR) cj_fail(c, pos, "cannot compare a %s with a %s", cj_type_name(a->t), cj_type_name(b->t));
  cj_str x = a->str, y = b->str;
  if (!case_sensitive) x = cj_recase(c, x, CJ_LOWER)->str, y = cj_recase(c, y, CJ_LOWER)->str;
  size_t n = x.n < y.n ? x.n : y.n;
  int r = n ? memcmp(x.s, y.s, n) : 0;
  return r ? (r < 0 ? -1 : 1) : x.n < y.n ? -1 : x.n > y.n ? 1 : 0;
}

typedef struct {
  int reverse, case_sensitive, by; /* by: the pair's element sorted on, or -1 the item */
  cj_str attr;
  int has_attr;
  size_t pos;
} sort_opts;

static cj_val *attribute(cj_ctx *c, cj_val *item, cj_str path);

static int sort_cmp(cj_ctx *c, cj_val *a, cj_val *b, const sort_opts *o) {
  cj_step(c, o->pos);
  if (o->has_attr) a = attribute(c, a, o->attr), b = attribute(c, b, o->attr);
  if (o->by >= 0) a = a->arr.v[o->by], b = b->arr.v[o->by];
  int r = compare(c, a, b, o->case_sensitive, o->pos);
  return o->reverse ? -r : r;
}

/* A stable merge sort (Array.prototype.sort is stable). */
static void sort(cj_ctx *c, cj_val **v, size_t n, const sort_opts *o) {
  if (n < 2) return;
  size_t h = n / 2;
  sort(c, v, h, o);
  sort(c, v + h, n - h, o);
  cj_val **t = cj_alloc(c, n * sizeof *t);
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n) t[k++] = sort_cmp(c, v[j], v[i], o) < 0 ? v[j++] : v[i++];
  while (i < h) t[k++] = v[i++];
  while (j < n) t[k++] = v[j++];
  memcpy(v, t, n * sizeof *v);
}

static cj_val *sorted_copy(cj_ctx *c, const cj_val *a, const sort_opts *o) {
  cj_val *r = cj_array(c, V_ARRAY, a->arr.n);
  if (a->arr.n) memcpy(r->arr.v, a->arr.v, a->arr.n * sizeof *r->arr.v);
  sort(c, r->arr.v, r->arr.n, o);
  return r;
}

cj_val *cj_dictsort(cj_ctx *c, const cj_val *obj, cj_val **args, size_t n, size_t pos) {
  const cj_map *kw = n && args[n - 1]->t == V_KWARGS ? args[--n]->map : NULL;
  static const char *names[] = {"case_sensitive", "by", "reverse"};
  cj_val *opt[3] = {0};
  for (int k = 0; k < 3; k++) {
    opt[k] = (size_t)k < n ? args[k] : kw ? cj_map_get(kw, names[k], strlen(names[k])) : NULL;
    if (opt[k] && (k == 1 ? opt[k]->t != V_STR : opt[k]->t != V_BOOL))
      cj_fail(c, pos, "dictsort: %s must be a %s", names[k], k == 1 ? "string" : "boolean");
  }
  if (opt[1] && !cj_str_eq(opt[1]->str, "key") && !cj_str_eq(opt[1]->str, "value"))
    cj_fail(c, pos, "dictsort: by must be 'key' or 'value'");
  cj_val *pairs = cj_array(c, V_ARRAY, obj->map->n);
  for (size_t i = 0; i < obj->map->n; i++) {
    cj_val *p = cj_array(c, V_ARRAY, 2);
    p->arr.v[0] = cj_string(c, obj->map->keys[i].s, obj->map->keys[i].n);
    p->arr.v[1] = obj->map->vals[i];
    pairs->arr.v[i] = p;
  }
  sort_opts o = {opt[2] && opt[2]->b, opt[0] && opt[0]->b, opt[1] && cj_str_eq(opt[1]->str, "value"), {0}, 0, pos};
  sort(c, pairs->arr.v, pairs->arr.n, &o);
  return pairs;
}

/* getAttributeValue: a dotted path through objects and list indices. */
static cj_val *attribute(cj_ctx *c, cj_val *item, cj_str path) {
  cj_val *v = item;
  size_t i = 0;
  for (;;) {
    size_t j = i;
    while (j < path.n && path.s[j] != '.') j++;
    cj_str part = {path.s + i, j - i};
    if (cj_is_object(v) || v->t == V_NS) {
      v = cj_map_get(v->map, part.s, part.n);
      if (!v) v = cj_new(c, V_UNDEF);
    } else if (cj_is_array(v)) {
      char buf[32];
      size_t n = part.n < sizeof buf - 1 ? part.n : sizeof buf - 1;
      memcpy(buf, part.s, n);
      buf[n] = 0;
      double x = parse_number((cj_str){buf, n}, 1);
      if (isnan(x) || x < 0 || x >= (double)v->arr.n) return cj_new(c, V_UNDEF);
      v = v->arr.v[(size_t)x];
    } else {
      return cj_new(c, V_UNDEF);
    }
    if (j >= path.n) return v;
    i = j + 1;
  }
}

/* Array.prototype.join of the elements' JavaScript values. */
static cj_val *join(cj_ctx *c, const cj_val *a, cj_str sep, size_t pos) {
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  for (size_t i = 0; i < a->arr.n; i++) {
    if (i) cj_puts(c, &b, sep);
    if (a->arr.v[i]->t != V_NULL && a->arr.v[i]->t != V_UNDEF) cj_put_raw(c, &b, a->arr.v[i], pos);
  }
  return cj_buf_string(c, &b);
}

static cj_val *indent(cj_ctx *c, cj_str s, double width, int first, int blank) {
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  for (size_t i = 0, line = 0;; line++) {
    size_t j = i;
    while (j < s.n && s.s[j] != '\n') j++;
    if ((first || line) && (blank || j > i))
      for (double k = 0; k < width; k++) cj_put(c, &b, " ", 1);
    cj_put(c, &b, s.s + i, j - i);
    if (j >= s.n) break;
    cj_put(c, &b, "\n", 1);
    i = j + 1;
  }
  return cj_buf_string(c, &b);
}

static _Noreturn void unknown(cj_ctx *c, cj_str name, const cj_val *v, size_t pos) {
  cj_fail(c, pos, "unknown filter '%.*s' for a %s", (int)name.n, name.s, cj_type_name(v->t));
}

/* The value of a named argument: positional index k, else the keyword, else NULL. */
static cj_val *arg(cj_val **args, size_t n, const cj_map *kw, size_t k, const char *name) {
  if (k < n) return args[k];
  return name ? cj_map_get(kw, name, strlen(name)) : NULL;
}

static cj_val *filter_plain(cj_ctx *c, cj_val *v, cj_str name, cj_env *env, size_t pos) {
  if (cj_str_eq(name, "safe")) return v;
  if (cj_str_eq(name, "tojson")) return to_json(c, v, &(cj_json_opts){0, 0, 0, NULL, NULL, 1}, pos);
  if (cj_is_array(v)) {
    if (cj_str_eq(name, "list")) return v;
    if (cj_str_eq(name, "first") || cj_str_eq(name, "last")) {
      if (!v->arr.n) cj_fail(c, pos, "'%.*s' of an empty list", (int)name.n, name.s);
      return v->arr.v[name.s[0] == 'f' ? 0 : v->arr.n - 1];
    }
    if (cj_str_eq(name, "length")) return cj_num(c, V_INT, (double)v->arr.n);
    if (cj_str_eq(name, "reverse")) {
      cj_val *r = cj_array(c, V_ARRAY, v->arr.n);
      for (size_t i = 0; i < v->arr.n; i++) r->arr.v[i] = v->arr.v[v->arr.n - 1 - i];
      return r;
    }
    if (cj_str_eq(name, "sort")) return sorted_copy(c, v, &(sort_opts){0, 0, -1, {0}, 0, pos});
    if (cj_str_eq(name, "join")) return join(c, v, (cj_str){"", 0}, pos);
    if (cj_str_eq(name, "string")) return to_json(c, v, &(cj_json_opts){0, 0, 0, NULL, NULL, 0}, pos);
    if (cj_str_eq(name, "unique")) {
      cj_val *r = cj_array(c, V_ARRAY, v->arr.n);
      size_t k = 0;
      for (size_t i = 0; i < v->arr.n; i++) {
        int seen = 0;
        const cj_val *x = v->arr.v[i];
        for (size_t j = 0; j < k && !seen; j++) {
          cj_step(c, pos);
          const cj_val *y = r->arr.v[j];
          int nan = (x->t == V_INT || x->t == V_FLOAT) && (y->t == V_INT || y->t == V_FLOAT) && isnan(x->num) && isnan(y->num);
          seen = nan || cj_strict_eq(x, y);
        }
        if (!seen) r->arr.v[k++] = v->arr.v[i];
      }
      r->arr.n = k;
      return r;
    }
    unknown(c, name, v, pos);
  }
  if (v->t == V_STR) {
    static const char *methods[] = {"length", "upper", "lower", "title", "capitalize"};
    for (size_t k = 0; k < sizeof methods / sizeof *methods; k++)
      if (cj_str_eq(name, methods[k])) {
        cj_val *m = cj_builtin_member(c, v, name);
        return m->t == V_FUNC ? cj_call_builtin(c, m, NULL, 0, env, pos) : m;
      }
    if (cj_str_eq(name, "trim")) return cj_string(c, cj_trim(v->str, 1, 1).s, cj_trim(v->str, 1, 1).n);
    if (cj_str_eq(name, "indent")) return indent(c, v->str, 4, 0, 0);
    if (cj_str_eq(name, "join") || cj_str_eq(name, "string")) return v;
    if (cj_str_eq(name, "int") || cj_str_eq(name, "float")) {
      double x = parse_number(v->str, name.s[0] == 'i');
      return cj_num(c, name.s[0] == 'i' ? V_INT : V_FLOAT, isnan(x) ? 0 : x);
    }
    unknown(c, name, v, pos);
  }
  if (v->t == V_INT || v->t == V_FLOAT) {
    if (cj_str_eq(name, "abs")) return cj_num(c, v->t, fabs(v->num));
    if (cj_str_eq(name, "int")) return cj_num(c, V_INT, floor(v->num));
    if (cj_str_eq(name, "float")) return cj_num(c, V_FLOAT, v->num);
    if (cj_str_eq(name, "string")) {
      cj_buf b = {0};
      cj_put_value(c, &b, v, pos);
      return cj_buf_string(c, &b);
    }
    unknown(c, name, v, pos);
  }
  if (cj_is_object(v)) {
    if (cj_str_eq(name, "length")) return cj_num(c, V_INT, (double)v->map->n);
    cj_val *m = cj_str_eq(name, "items") || !cj_str_eq(name, "get") ? cj_builtin_member(c, v, name) : NULL;
    if (m) return m->t == V_FUNC ? cj_call_builtin(c, m, NULL, 0, env, pos) : m;
    unknown(c, name, v, pos);
  }
  if (v->t == V_BOOL) {
    if (cj_str_eq(name, "bool")) return cj_bool(c, v->b);
    if (cj_str_eq(name, "int")) return cj_num(c, V_INT, v->b);
    if (cj_str_eq(name, "float")) return cj_num(c, V_FLOAT, v->b);
    if (cj_str_eq(name, "string")) return cj_string(c, v->b ? "true" : "false", v->b ? 4 : 5);
    unknown(c, name, v, pos);
  }
  unknown(c, name, v, pos);
}

static int all_string_literals(const cj_list *l) {
  for (size_t i = 0; i < l->n; i++)
    if (l->v[i]->t != N_STR) return 0;
  return 1;
}

static cj_val *filter_call(cj_ctx *c, cj_val *v, const cj_node *f, cj_env *env) {
  cj_str name = f->a->s;
  size_t pos = f->pos;
  cj_val **args;
  size_t n;
  cj_map kw = {0};
  if (cj_str_eq(name, "selectattr") || cj_str_eq(name, "rejectattr")) {
    if (!cj_is_array(v)) unknown(c, name, v, pos);
    for (size_t i = 0; i < v->arr.n; i++)
      if (!cj_is_object(v->arr.v[i]) && v->arr.v[i]->t != V_NS)
        cj_fail(c, pos, "%.*s applies to a list of objects only", (int)name.n, name.s);
    if (!all_string_literals(&f->l1) || !f->l1.n) cj_fail(c, pos, "%.*s takes string literals", (int)name.n, name.s);
    cj_str attr = f->l1.v[0]->s;
    cj_val *val = f->l1.n > 2 ? cj_string(c, f->l1.v[2]->s.s, f->l1.v[2]->s.n) : NULL;
    int select = name.s[0] == 's';
    cj_val *r = cj_array(c, V_ARRAY, v->arr.n);
    size_t k = 0;
    for (size_t i = 0; i < v->arr.n; i++) {
      cj_val *a = cj_map_get(v->arr.v[i]->map, attr.s, attr.n);
      int ok = !a ? 0 : f->l1.n > 1 ? cj_test(c, a, f->l1.v[1]->s, val, val != NULL, pos) : cj_truthy(a);
      if (ok == select) r->arr.v[k++] = v->arr.v[i];
    }
    r->arr.n = k;
    return r;
  }
  cj_eval_args(c, &f->l1, env, &args, &n, &kw);
  if (cj_str_eq(name, "tojson")) {
    cj_val *ind = arg(NULL, 0, &kw, 0, "indent"), *ascii = arg(NULL, 0, &kw, 0, "ensure_ascii"),
           *sortk = arg(NULL, 0, &kw, 0, "sort_keys"), *seps = arg(NULL, 0, &kw, 0, "separators");
    if (ind && ind->t != V_INT && ind->t != V_NULL) cj_fail(c, pos, "tojson: indent must be an integer");
    if (ind && ind->t == V_INT && (ind->num < 0 || ind->num > 1024)) cj_fail(c, pos, "tojson: indent %g out of range", ind->num);
    if (ascii && ascii->t != V_BOOL) cj_fail(c, pos, "tojson: ensure_ascii must be a boolean");
    if (sortk && sortk->t != V_BOOL) cj_fail(c, pos, "tojson: sort_keys must be a boolean");
    cj_json_opts o = {ind && ind->t == V_INT ? (int)ind->num : 0, ascii && ascii->b, sortk && sortk->b, NULL, NULL, 1};
    if (seps && seps->t != V_NULL) {
      if (!cj_is_array(seps) || seps->arr.n != 2 || seps->arr.v[0]->t != V_STR || seps->arr.v[1]->t != V_STR)
        cj_fail(c, pos, "tojson: separators must be two strings");
      cj_buf b0 = {0}, b1 = {0};
      cj_puts(c, &b0, seps->arr.v[0]->str);
      cj_puts(c, &b1, seps->arr.v[1]->str);
      o.item_sep = b0.s ? b0.s : "", o.key_sep = b1.s ? b1.s : "";
    }
    return to_json(c, v, &o, pos);
  }
  if (cj_str_eq(name, "join")) {
    cj_val *sep = arg(args, n, &kw, 0, "separator");
    if (sep && sep->t != V_STR) cj_fail(c, pos, "join: the separator must be a string");
    cj_str s = sep ? sep->str : (cj_str){"", 0};
    if (cj_is_array(v)) return join(c, v, s, pos);
    if (v->t != V_STR) unknown(c, name, v, pos);
    cj_buf b = {0};
    cj_put(c, &b, "", 0);
    size_t len;
    for (size_t i = 0; i < v->str.n; i += len) {
      cj_utf8_next(v->str.s, v->str.n, i, &len);
      if (i) cj_puts(c, &b, s);
      cj_put(c, &b, v->str.s + i, len);
    }
    return cj_buf_string(c, &b);
  }
  if (cj_str_eq(name, "int") || cj_str_eq(name, "float")) {
    int integer = name.s[0] == 'i';
    cj_val *def = arg(args, n, &kw, 0, "default");
    if (v->t == V_STR) {
      double x = parse_number(v->str, integer);
      return isnan(x) ? (def ? def : cj_num(c, integer ? V_INT : V_FLOAT, 0)) : cj_num(c, integer ? V_INT : V_FLOAT, x);
    }
    if (v->t == V_INT || v->t == V_FLOAT) return v;
    if (v->t == V_BOOL) return cj_num(c, integer ? V_INT : V_FLOAT, v->b);
    unknown(c, name, v, pos);
  }
  if (cj_str_eq(name, "default")) {
    cj_val *def = n > 0 ? args[0] : cj_string(c, "", 0);
    cj_val *boolean = arg(args, n, &kw, 1, "boolean");
    if (boolean && boolean->t != V_BOOL) cj_fail(c, pos, "default: its second argument must be a boolean");
    return v->t == V_UNDEF || (boolean && boolean->b && !cj_truthy(v)) ? def : v;
  }
  if (cj_is_array(v)) {
    if (cj_str_eq(name, "sort")) {
      cj_val *rev = arg(args, n, &kw, 0, "reverse"), *cs = arg(args, n, &kw, 1, "case_sensitive"),
             *at = arg(args, n, &kw, 2, "attribute");
      if ((rev && rev->t != V_BOOL) || (cs && cs->t != V_BOOL)) cj_fail(c, pos, "sort: reverse and case_sensitive are booleans");
      if (at && at->t != V_STR && at->t != V_INT && at->t != V_NULL) cj_fail(c, pos, "sort: attribute must be a string or an integer");
      sort_opts o = {rev && rev->b, cs && cs->b, -1, {0}, at && at->t != V_NULL, pos};
      if (o.has_attr) {
        cj_buf b = {0};
        if (at->t == V_INT) cj_put_number(c, &b, at->num);
        else cj_puts(c, &b, at->str);
        o.attr = (cj_str){b.s ? b.s : "", b.n};
      }
      return sorted_copy(c, v, &o);
    }
    if (cj_str_eq(name, "map")) {
      cj_val *at = cj_map_get(&kw, "attribute", 9), *def = cj_map_get(&kw, "default", 7);
      if (!at) cj_fail(c, pos, "map without attribute= is not supported");
      if (at->t != V_STR) cj_fail(c, pos, "map: attribute must be a string");
      cj_val *r = cj_array(c, V_ARRAY, v->arr.n);
      for (size_t i = 0; i < v->arr.n; i++) {
        if (!cj_is_object(v->arr.v[i]) && v->arr.v[i]->t != V_NS) cj_fail(c, pos, "map: the items must be objects");
        cj_val *x = attribute(c, v->arr.v[i], at->str);
        r->arr.v[i] = x->t == V_UNDEF && def ? def : x;
      }
      return r;
    }
    unknown(c, name, v, pos);
  }
  if (v->t == V_STR) {
    if (cj_str_eq(name, "indent")) {
      cj_val *w = arg(args, n, &kw, 0, "width"), *first = arg(args, n, &kw, 1, "first"), *blank = arg(args, n, &kw, 2, "blank");
      if (w && w->t != V_INT) cj_fail(c, pos, "indent: width must be an integer");
      if (w && (w->num < 0 || w->num > 1024)) cj_fail(c, pos, "indent: width %g out of range", w->num);
      return indent(c, v->str, w ? w->num : 4, first && cj_truthy(first), blank && cj_truthy(blank));
    }
    if (cj_str_eq(name, "replace")) {
      cj_val *m = cj_builtin_member(c, v, name);
      cj_val **all = cj_alloc(c, (n + 1) * sizeof *all);
      if (n) memcpy(all, args, n * sizeof *all);
      cj_val *k = cj_object(c, V_KWARGS);
      *k->map = kw;
      all[n] = k;
      return cj_call_builtin(c, m, all, n + 1, env, pos);
    }
    unknown(c, name, v, pos);
  }
  if (cj_is_object(v)) {
    cj_val *m = cj_builtin_member(c, v, name);
    if (!m || m->t != V_FUNC) unknown(c, name, v, pos);
    if (kw.n) {
      cj_val **all = cj_alloc(c, (n + 1) * sizeof *all);
      if (n) memcpy(all, args, n * sizeof *all);
      cj_val *k = cj_object(c, V_KWARGS);
      *k->map = kw;
      all[n++] = k;
      args = all;
    }
    return cj_call_builtin(c, m, args, n, env, pos);
  }
  unknown(c, name, v, pos);
}

cj_val *cj_apply_filter(cj_ctx *c, cj_val *v, const cj_node *f, cj_env *env) {
  cj_step(c, f->pos);
  if (f->t == N_IDENT) return filter_plain(c, v, f->s, env, f->pos);
  if (f->a->t != N_IDENT) cj_fail(c, f->pos, "a filter must be a name");
  return filter_call(c, v, f, env);
}

int cj_test(cj_ctx *c, const cj_val *v, cj_str name, const cj_val *arg, int has_arg, size_t pos) {
  cj_vtype t = v->t;
  if (cj_str_eq(name, "boolean")) return t == V_BOOL;
  if (cj_str_eq(name, "callable")) return t == V_FUNC;
  if (cj_str_eq(name, "odd") || cj_str_eq(name, "even")) {
    if (t != V_INT) cj_fail(c, pos, "test '%.*s' of a %s", (int)name.n, name.s, cj_type_name(t));
    return (fmod(v->num, 2) != 0) == (name.s[0] == 'o');
  }
  if (cj_str_eq(name, "false")) return t == V_BOOL && !v->b;
  if (cj_str_eq(name, "true")) return t == V_BOOL && v->b;
  if (cj_str_eq(name, "none")) return t == V_NULL;
  if (cj_str_eq(name, "string")) return t == V_STR;
  if (cj_str_eq(name, "number")) return t == V_INT || t == V_FLOAT;
  if (cj_str_eq(name, "integer")) return t == V_INT;
  if (cj_str_eq(name, "iterable")) return t == V_ARRAY || t == V_STR;
  if (cj_str_eq(name, "mapping")) return cj_is_object(v);
  if (cj_str_eq(name, "sequence")) return cj_is_array(v) || cj_is_object(v) || t == V_STR;
  if (cj_str_eq(name, "lower") || cj_str_eq(name, "upper")) { /* s === s.toLowerCase() */
    if (t != V_STR) return 0;
    const cj_val *m = cj_recase(c, v->str, name.s[0] == 'u' ? CJ_UPPER : CJ_LOWER);
    return m->str.n == v->str.n && !memcmp(m->str.s, v->str.s, v->str.n);
  }
  if (cj_str_eq(name, "defined")) return t != V_UNDEF;
  if (cj_str_eq(name, "undefined")) return t == V_UNDEF;
  if (cj_str_eq(name, "equalto") || cj_str_eq(name, "eq")) {
    if (!has_arg) cj_fail(c, pos, "test '%.*s' needs a value to compare with", (int)name.n, name.s);
    return cj_strict_eq(v, arg);
  }
  cj_fail(c, pos, "unknown test '%.*s'", (int)name.n, name.s);
}
