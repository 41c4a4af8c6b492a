/* The evaluator: statements and expressions as @huggingface/jinja's Interpreter (runtime.ts) runs
 * them: scopes (a for loop's own, macros seeing their caller's), loop.*, namespaces, macros and call
 * blocks, and its operators with JavaScript's semantics. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chat.h"

void cj_step(cj_ctx *c, size_t pos) {
  if (++c->steps > c->lim.max_steps) cj_fail(c, pos, "the render takes more than %zu steps", c->lim.max_steps);
}

cj_env *cj_env_new(cj_ctx *c, cj_env *parent) {
  cj_env *e = cj_alloc(c, sizeof *e);
  e->parent = parent;
  return e;
}

void cj_env_set(cj_ctx *c, cj_env *env, cj_str name, cj_val *v) { cj_map_set(c, &env->vars, name, v); }

static cj_val *lookup(cj_ctx *c, cj_env *env, cj_str name) {
  for (; env; env = env->parent) {
    cj_val *v = cj_map_get(&env->vars, name.s, name.n);
    if (v) return v;
    if (cj_str_eq(name, "namespace")) { /* every scope has its own namespace() */
      v = cj_new(c, V_FUNC);
      v->fn.kind = F_BUILTIN;
      v->fn.name = "namespace";
      return v;
    }
  }
  return cj_new(c, V_UNDEF);
}

/* ---- members and slices ---- */

/* The UTF-16 unit at index i of s (negative: from the end) as a string, or NULL. */
static cj_val *string_at(cj_ctx *c, cj_str s, double i) {
  size_t units = cj_utf16_len(s.s, s.n);
  if (i < 0) i += (double)units;
  if (i < 0 || i >= (double)units) return NULL;
  size_t want = (size_t)i, u = 0, len;
  for (size_t k = 0; k < s.n; k += len) {
    uint32_t cp = cj_utf8_next(s.s, s.n, k, &len);
    size_t w = cp >= 0x10000 ? 2 : 1;
    if (want < u + w) return w == 2 ? cj_string(c, "\xEF\xBF\xBD", 3) : cj_string(c, s.s + k, len);
    u += w;
  }
  return NULL;
}

static cj_val *slice(cj_ctx *c, cj_val *obj, const cj_node *e, cj_env *env) {
  if (!cj_is_array(obj) && obj->t != V_STR) cj_fail(c, e->pos, "cannot slice a %s", cj_type_name(obj->t));
  const cj_node *parts[3] = {e->a, e->b, e->c};
  double v[3];
  int given[3];
  for (int k = 0; k < 3; k++) {
    cj_val *x = parts[k] ? cj_eval(c, parts[k], env) : NULL;
    given[k] = x && x->t != V_UNDEF;
    if (given[k] && x->t != V_INT) cj_fail(c, e->pos, "a slice's bounds must be integers, not %s", cj_type_name(x->t));
    v[k] = given[k] ? x->num : 0;
  }
  /* The string's characters are code points (Array.from), a list's its elements. */
  size_t n = 0, len;
  size_t *off = NULL;
  if (obj->t == V_STR) {
    off = cj_alloc(c, (obj->str.n + 1) * sizeof *off);
    for (size_t k = 0; k < obj->str.n; k += len) {
      off[n++] = k;
      cj_utf8_next(obj->str.s, obj->str.n, k, &len);
    }
    off[n] = obj->str.n;
  } else {
    n = obj->arr.n;
  }
  double dn = (double)n, stepv = given[2] ? v[2] : 1, start, stop;
  int dir = stepv > 0 ? 1 : stepv < 0 ? -1 : 0;
  if (dir >= 0) {
    start = !given[0] ? 0 : v[0] < 0 ? fmax(dn + v[0], 0) : fmin(v[0], dn);
    stop = !given[1] ? dn : v[1] < 0 ? fmax(dn + v[1], 0) : fmin(v[1], dn);
  } else {
    start = !given[0] ? dn - 1 : v[0] < 0 ? fmax(dn + v[0], -1) : fmin(v[0], dn - 1);
    stop = !given[1] ? -1 : v[1] < -1 ? fmax(dn + v[1], -1) : fmin(v[1], dn - 1);
  }
  size_t count = 0;
  if (dir && dir * start < dir * stop) count = (size_t)ceil((stop - start) / stepv);
  if (obj->t == V_STR) {
    cj_buf b = {0};
    cj_put(c, &b, "", 0);
    for (size_t k = 0; k < count; k++) {
      size_t i = (size_t)(start + (double)k * stepv);
      cj_put(c, &b, obj->str.s + off[i], off[i + 1] - off[i]);
    }
    return cj_buf_string(c, &b);
  }
  cj_val *r = cj_array(c, V_ARRAY, count);
  for (size_t k = 0; k < count; k++) r->arr.v[k] = obj->arr.v[(size_t)(start + (double)k * stepv)];
  return r;
}

static cj_val *member(cj_ctx *c, const cj_node *e, cj_env *env) {
  cj_val *obj = cj_eval(c, e->a, env), *prop, *v = NULL;
  if (e->flag && e->b->t == N_SLICE) return slice(c, obj, e->b, env);
  if (e->flag) prop = cj_eval(c, e->b, env);
  else if (e->b->t == N_INT) prop = cj_num(c, V_INT, e->b->num);
  else prop = cj_string(c, e->b->s.s, e->b->s.n);
  if (cj_is_object(obj) || obj->t == V_NS) {
    if (prop->t != V_STR) cj_fail(c, e->pos, "a %s's key must be a string, not %s", cj_type_name(obj->t), cj_type_name(prop->t));
    v = cj_map_get(obj->map, prop->str.s, prop->str.n);
    if (!v && obj->t != V_NS) v = cj_builtin_member(c, obj, prop->str);
  } else if (cj_is_array(obj) || obj->t == V_STR) {
    if (prop->t == V_INT) {
      double i = trunc(prop->num);
      if (obj->t == V_STR) {
        v = string_at(c, obj->str, i);
      } else {
        if (i < 0) i += (double)obj->arr.n;
        if (i >= 0 && i < (double)obj->arr.n) v = obj->arr.v[(size_t)i];
      }
    } else if (prop->t == V_STR) {
      v = cj_builtin_member(c, obj, prop->str);
    } else {
      cj_fail(c, e->pos, "a %s's index must be an integer or a name, not %s", cj_type_name(obj->t), cj_type_name(prop->t));
    }
  } else {
    if (prop->t != V_STR) cj_fail(c, e->pos, "a %s's key must be a string, not %s", cj_type_name(obj->t), cj_type_name(prop->t));
  }
  return v ? v : cj_new(c, V_UNDEF);
}

/* ---- operators ---- */

static int is_num(const cj_val *v) { return v->t == V_INT || v->t == V_FLOAT; }
static int is_numlike(const cj_val *v) { return is_num(v) || v->t == V_BOOL; }
static double numval(const cj_val *v) { return v->t == V_BOOL ? v->b : v->num; }

static cj_val *concat_raw(cj_ctx *c, const cj_val *a, const cj_val *b, size_t pos) {
  cj_buf buf = {0};
  cj_put(c, &buf, "", 0);
  cj_put_raw(c, &buf, a, pos);
  cj_put_raw(c, &buf, b, pos);
  return cj_buf_string(c, &buf);
}

static int str_contains(cj_str hay, cj_str needle) {
  return !needle.n || memmem(hay.s, hay.n, needle.s, needle.n) != NULL; /* linear: no quadratic search */
}

static cj_val *binary(cj_ctx *c, const cj_node *e, cj_env *env) {
  cj_str op = e->s;
  cj_val *l = cj_eval(c, e->a, env);
  if (cj_str_eq(op, "and")) return cj_truthy(l) ? cj_eval(c, e->b, env) : l;
  if (cj_str_eq(op, "or")) return cj_truthy(l) ? l : cj_eval(c, e->b, env);
  cj_val *r = cj_eval(c, e->b, env);
  if (cj_str_eq(op, "==")) return cj_bool(c, cj_loose_eq(l, r));
  if (cj_str_eq(op, "!=")) return cj_bool(c, !cj_loose_eq(l, r));
  int in = cj_str_eq(op, "in"), not_in = cj_str_eq(op, "not in");
  if (l->t == V_UNDEF || r->t == V_UNDEF) {
    if (r->t == V_UNDEF && (in || not_in)) return cj_bool(c, not_in);
    cj_fail(c, e->pos, "'%.*s' on an undefined value", (int)op.n, op.s);
  }
  if (l->t == V_NULL || r->t == V_NULL) cj_fail(c, e->pos, "'%.*s' on none", (int)op.n, op.s);
  if (cj_str_eq(op, "~")) return concat_raw(c, l, r, e->pos);
  if (cj_str_eq(op, "**") && is_numlike(l) && is_numlike(r)) {
    double a = numval(l), b = numval(r);
    if (a == 0 && b < 0) cj_fail(c, e->pos, "0 to a negative power");
    double x = pow(a, b);
    if (!isfinite(x)) cj_fail(c, e->pos, "'**' gives a result that is not a finite real number");
    return cj_num(c, l->t == V_FLOAT || r->t == V_FLOAT || b < 0 ? V_FLOAT : V_INT, x);
  } else if (is_num(l) && is_num(r)) {
    double a = l->num, b = r->num;
    cj_vtype t = l->t == V_FLOAT || r->t == V_FLOAT ? V_FLOAT : V_INT;
    if (cj_str_eq(op, "+")) return cj_num(c, t, a + b);
    if (cj_str_eq(op, "-")) return cj_num(c, t, a - b);
    if (cj_str_eq(op, "*")) return cj_num(c, t, a * b);
    if (cj_str_eq(op, "/")) return cj_num(c, V_FLOAT, a / b);
    if (cj_str_eq(op, "//")) return cj_num(c, t, floor(a / b));
    if (cj_str_eq(op, "%")) return cj_num(c, t, fmod(a, b));
    if (cj_str_eq(op, "<")) return cj_bool(c, a < b);
    if (cj_str_eq(op, ">")) return cj_bool(c, a > b);
    if (cj_str_eq(op, ">=")) return cj_bool(c, a >= b);
    if (cj_str_eq(op, "<=")) return cj_bool(c, a <= b);
  } else if (cj_is_array(l) && cj_is_array(r)) {
    if (cj_str_eq(op, "+")) {
      cj_val *v = cj_array(c, V_ARRAY, l->arr.n + r->arr.n);
      if (l->arr.n) memcpy(v->arr.v, l->arr.v, l->arr.n * sizeof *v->arr.v);
      if (r->arr.n) memcpy(v->arr.v + l->arr.n, r->arr.v, r->arr.n * sizeof *v->arr.v);
      return v;
    }
  } else if (cj_is_array(r)) {
    if (in || not_in) {
      int found = 0;
      for (size_t i = 0; i < r->arr.n && !found; i++) found = cj_strict_eq(r->arr.v[i], l);
      return cj_bool(c, in ? found : !found);
    }
  }
  if ((l->t == V_STR || r->t == V_STR) && cj_str_eq(op, "+")) return concat_raw(c, l, r, e->pos);
  if (l->t == V_STR && r->t == V_STR && (in || not_in)) return cj_bool(c, str_contains(r->str, l->str) == in);
  if (l->t == V_STR && cj_is_object(r) && (in || not_in))
    return cj_bool(c, (cj_map_get(r->map, l->str.s, l->str.n) != NULL) == in);
  cj_fail(c, e->pos, "no operator '%.*s' between a %s and a %s", (int)op.n, op.s, cj_type_name(l->t), cj_type_name(r->t));
}

static cj_val *unary(cj_ctx *c, const cj_node *e, cj_env *env) {
  cj_val *v = cj_eval(c, e->a, env);
  if (cj_str_eq(e->s, "not")) return cj_bool(c, !cj_truthy(v));
  if (!is_numlike(v)) cj_fail(c, e->pos, "no operator '%.*s' for a %s", (int)e->s.n, e->s.s, cj_type_name(v->t));
  double x = (cj_str_eq(e->s, "-") ? -1 : 1) * numval(v);
  return cj_num(c, v->t == V_FLOAT ? V_FLOAT : V_INT, x);
}

/* ---- calls, macros ---- */

void cj_eval_args(cj_ctx *c, const cj_list *args, cj_env *env, cj_val ***pos_args, size_t *npos, cj_map *kw) {
  size_t n = 0;
  cj_val **v = NULL;
  size_t cap = 0;
  for (size_t i = 0; i < args->n; i++) { /* the positional part first, as Python and runtime.ts do */
    const cj_node *a = args->v[i];
    if (a->t == N_KWARG || a->t == N_KWSPREAD) continue;
    cj_val *x = cj_eval(c, a->t == N_SPREAD ? a->a : a, env);
    if (a->t == N_SPREAD && !cj_is_array(x)) cj_fail(c, a->pos, "cannot unpack a %s with *", cj_type_name(x->t));
    size_t add = a->t == N_SPREAD ? x->arr.n : 1;
    if (n + add > cap) {
      cap = (n + add) * 2;
      cj_val **nv = cj_alloc(c, cap * sizeof *nv);
      if (n) memcpy(nv, v, n * sizeof *nv);
      v = nv;
    }
    if (a->t == N_SPREAD) {
      if (add) memcpy(v + n, x->arr.v, add * sizeof *v);
      n += add;
    } else {
      v[n++] = x;
    }
  }
  for (size_t i = 0; i < args->n; i++) {
    const cj_node *a = args->v[i];
    if (a->t == N_KWARG) {
      if (cj_map_get(kw, a->s.s, a->s.n)) cj_fail(c, a->pos, "keyword argument '%.*s' twice", (int)a->s.n, a->s.s);
      cj_map_set(c, kw, a->s, cj_eval(c, a->a, env));
    } else if (a->t == N_KWSPREAD) {
      cj_val *x = cj_eval(c, a->a, env);
      if (!cj_is_object(x)) cj_fail(c, a->pos, "the argument after ** must be a mapping, not a %s", cj_type_name(x->t));
      for (size_t k = 0; k < x->map->n; k++) {
        if (cj_map_get(kw, x->map->keys[k].s, x->map->keys[k].n))
          cj_fail(c, a->pos, "keyword argument '%.*s' twice", (int)x->map->keys[k].n, x->map->keys[k].s);
        cj_map_set(c, kw, x->map->keys[k], x->map->vals[k]);
      }
    }
  }
  *pos_args = v;
  *npos = n;
}

/* Whether the statements read the name (kwargs, varargs) anywhere. */
static int reads_name(const cj_node *e, const char *name) {
  if (!e) return 0;
  if (e->t == N_IDENT && cj_str_eq(e->s, name)) return 1;
  if (reads_name(e->a, name) || reads_name(e->b, name) || reads_name(e->c, name)) return 1;
  for (size_t i = 0; i < e->l1.n; i++)
    if (reads_name(e->l1.v[i], name)) return 1;
  for (size_t i = 0; i < e->l2.n; i++)
    if (reads_name(e->l2.v[i], name)) return 1;
  return 0;
}
static int list_reads(const cj_list *l, const cj_list *params, const char *name) {
  for (size_t i = 0; i < params->n; i++)
    if (cj_str_eq(params->v[i]->s, name)) return 0;
  for (size_t i = 0; i < l->n; i++)
    if (reads_name(l->v[i], name)) return 1;
  return 0;
}

static void bind(cj_ctx *c, const char *what, const cj_list *params, const cj_list *body, cj_val **args, size_t nargs,
                 cj_env *scope, size_t pos) {
  cj_map kw = {0};
  if (nargs && args[nargs - 1]->t == V_KWARGS) {
    const cj_map *m = args[--nargs]->map;
    for (size_t i = 0; i < m->n; i++) cj_map_set(c, &kw, m->keys[i], m->vals[i]);
  }
  int *pending = cj_alloc(c, (params->n + 1) * sizeof *pending);
  for (size_t i = 0; i < params->n; i++) {
    const cj_node *p = params->v[i];
    cj_val *v = i < nargs ? args[i] : NULL;
    if (!v) {
      for (size_t k = 0; k < kw.n; k++)
        if (kw.keys[k].n == p->s.n && !memcmp(kw.keys[k].s, p->s.s, p->s.n)) {
          v = kw.vals[k];
          memmove(kw.keys + k, kw.keys + k + 1, (kw.n - k - 1) * sizeof *kw.keys);
          memmove(kw.vals + k, kw.vals + k + 1, (kw.n - k - 1) * sizeof *kw.vals);
          kw.n--;
          break;
        }
    }
    pending[i] = !v && p->t == N_KWARG;
    cj_env_set(c, scope, p->s, v ? v : cj_new(c, V_UNDEF));
  }
  if (list_reads(body, params, "kwargs")) {
    cj_val *o = cj_object(c, V_OBJECT);
    *o->map = kw;
    cj_env_set(c, scope, cj_cstr("kwargs"), o);
  } else if (kw.n) {
    cj_fail(c, pos, "%s takes no keyword argument '%.*s'", what, (int)kw.keys[0].n, kw.keys[0].s);
  }
  if (list_reads(body, params, "varargs")) {
    size_t extra = nargs > params->n ? nargs - params->n : 0;
    cj_val *a = cj_array(c, V_ARRAY, extra);
    for (size_t i = 0; i < extra; i++) a->arr.v[i] = args[params->n + i];
    cj_env_set(c, scope, cj_cstr("varargs"), a);
  } else if (nargs > params->n) {
    cj_fail(c, pos, "%s takes at most %zu argument(s), given %zu", what, params->n, nargs);
  }
  for (size_t i = 0; i < params->n; i++)
    if (pending[i]) cj_env_set(c, scope, params->v[i]->s, cj_eval(c, params->v[i]->a, scope));
}

static cj_val *run_body(cj_ctx *c, const cj_list *body, cj_env *scope) {
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  cj_exec_block(c, body, scope, &b);
  return cj_buf_string(c, &b);
}

cj_val *cj_call(cj_ctx *c, cj_val *fn, cj_val **args, size_t nargs, cj_env *env, size_t pos) {
  if (fn->t != V_FUNC) cj_fail(c, pos, "cannot call a %s", cj_type_name(fn->t));
  if (fn->fn.kind == F_BUILTIN || fn->fn.kind == F_METHOD) return cj_call_builtin(c, fn, args, nargs, env, pos);
  if (++c->depth > c->lim.max_depth) cj_fail(c, pos, "calls nested deeper than %d", c->lim.max_depth);
  const cj_node *m = fn->fn.node;
  cj_val *r;
  if (fn->fn.kind == F_MACRO) {
    char what[96];
    snprintf(what, sizeof what, "macro '%.*s'", (int)m->s.n, m->s.s);
    cj_env *scope = cj_env_new(c, env);
    bind(c, what, &m->l1, &m->l2, args, nargs, scope, pos);
    r = run_body(c, &m->l2, scope);
  } else {
    cj_env *scope = cj_env_new(c, fn->fn.env);
    bind(c, "caller", &m->l1, &m->l2, args, nargs, scope, pos);
    r = run_body(c, &m->l2, scope);
  }
  c->depth--;
  return r;
}

static cj_val *call_expr(cj_ctx *c, const cj_node *e, cj_env *env) {
  cj_val **args;
  size_t n;
  cj_map kw = {0};
  cj_eval_args(c, &e->l1, env, &args, &n, &kw);
  if (kw.n) {
    cj_val **more = cj_alloc(c, (n + 1) * sizeof *more);
    if (n) memcpy(more, args, n * sizeof *more);
    cj_val *k = cj_object(c, V_KWARGS);
    *k->map = kw;
    more[n++] = k;
    args = more;
  }
  cj_val *fn = cj_eval(c, e->a, env);
  const cj_node *f = e->a;
  if (fn->t != V_FUNC && f->t == N_MEMBER && !f->flag && f->b->t == N_IDENT)
    cj_fail(c, f->pos, "no method '%.*s' (a %s is not a function)", (int)f->b->s.n, f->b->s.s, cj_type_name(fn->t));
  if (fn->t != V_FUNC && f->t == N_IDENT)
    cj_fail(c, f->pos, "'%.*s' is not a function (a %s)", (int)f->s.n, f->s.s, cj_type_name(fn->t));
  return cj_call(c, fn, args, n, env, e->pos);
}

cj_val *cj_eval(cj_ctx *c, const cj_node *e, cj_env *env) {
  cj_step(c, e->pos);
  if (++c->depth > c->lim.max_depth) cj_fail(c, e->pos, "expressions nested deeper than %d", c->lim.max_depth);
  cj_val *v;
  switch (e->t) {
    case N_INT: case N_FLOAT: v = cj_num(c, e->t == N_INT ? V_INT : V_FLOAT, e->num); break;
    case N_STR:
      v = cj_new(c, V_STR);
      v->str = e->s;
      break;
    case N_IDENT: v = lookup(c, env, e->s); break;
    case N_ARRAY: case N_TUPLE:
      v = cj_array(c, e->t == N_ARRAY ? V_ARRAY : V_TUPLE, e->l1.n);
      for (size_t i = 0; i < e->l1.n; i++) v->arr.v[i] = cj_eval(c, e->l1.v[i], env);
      break;
    case N_OBJECT:
      v = cj_object(c, V_OBJECT);
      for (size_t i = 0; i < e->l1.n; i++) {
        cj_val *k = cj_eval(c, e->l1.v[i], env);
        if (k->t != V_STR) cj_fail(c, e->l1.v[i]->pos, "an object's keys must be strings, not %s", cj_type_name(k->t));
        cj_map_set(c, v->map, k->str, cj_eval(c, e->l2.v[i], env));
      }
      break;
    case N_MEMBER: v = member(c, e, env); break;
    case N_CALL: v = call_expr(c, e, env); break;
    case N_UNARY: v = unary(c, e, env); break;
    case N_BINARY: v = binary(c, e, env); break;
    case N_FILTER: v = cj_apply_filter(c, cj_eval(c, e->a, env), e->b, env); break;
    case N_TEST: {
      cj_val *x = cj_eval(c, e->a, env);
      v = cj_bool(c, cj_test(c, x, e->s, NULL, 0, e->pos) != e->flag);
      break;
    }
    case N_SELECT: v = cj_truthy(cj_eval(c, e->b, env)) ? cj_eval(c, e->a, env) : cj_new(c, V_UNDEF); break;
    case N_TERNARY: v = cj_eval(c, cj_truthy(cj_eval(c, e->a, env)) ? e->b : e->c, env); break;
    case N_SLICE: cj_fail(c, e->pos, "a slice outside []");
    case N_KWARG: case N_SPREAD: case N_KWSPREAD: cj_fail(c, e->pos, "an argument outside a call");
    default: cj_fail(c, e->pos, "a statement where an expression belongs");
  }
  c->depth--;
  return v;
}

/* ---- statements ---- */

static void assign(cj_ctx *c, const cj_node *target, cj_val *v, cj_env *env) {
  if (target->t == N_IDENT) return cj_env_set(c, env, target->s, v);
  if (target->t == N_TUPLE) {
    if (!cj_is_array(v)) cj_fail(c, target->pos, "cannot unpack a %s in set", cj_type_name(v->t));
    if (v->arr.n != target->l1.n) cj_fail(c, target->pos, "%zu names for %zu values in set", target->l1.n, v->arr.n);
    for (size_t i = 0; i < target->l1.n; i++) {
      if (target->l1.v[i]->t != N_IDENT) cj_fail(c, target->l1.v[i]->pos, "set unpacks into names only");
      cj_env_set(c, env, target->l1.v[i]->s, v->arr.v[i]);
    }
    return;
  }
  if (target->t == N_MEMBER) {
    cj_val *ns = cj_eval(c, target->a, env);
    if (ns->t != V_NS) cj_fail(c, target->pos, "set assigns attributes of a namespace only, not of a %s", cj_type_name(ns->t));
    if (target->flag || target->b->t != N_IDENT) cj_fail(c, target->pos, "set assigns a namespace's attribute by name only");
    return cj_map_set(c, ns->map, target->b->s, v);
  }
  cj_fail(c, target->pos, "cannot assign to this expression");
}

static void bind_loop_var(cj_ctx *c, const cj_node *var, cj_val *item, cj_env *scope) {
  if (var->t == N_IDENT) return cj_env_set(c, scope, var->s, item);
  if (item->t != V_ARRAY) cj_fail(c, var->pos, "cannot unpack a %s", cj_type_name(item->t));
  if (var->l1.n != item->arr.n) cj_fail(c, var->pos, "%zu names for %zu values", var->l1.n, item->arr.n);
  for (size_t j = 0; j < var->l1.n; j++) {
    if (var->l1.v[j]->t != N_IDENT) cj_fail(c, var->l1.v[j]->pos, "a loop unpacks into names only");
    cj_env_set(c, scope, var->l1.v[j]->s, item->arr.v[j]);
  }
}

static void set_int(cj_ctx *c, cj_map *m, const char *k, double x) { cj_map_set(c, m, cj_cstr(k), cj_num(c, V_INT, x)); }

/* Returns the break or continue that left the block, or NULL. */
static const cj_node *exec(cj_ctx *c, const cj_list *l, cj_env *env, cj_buf *out);

static const cj_node *exec_for(cj_ctx *c, const cj_node *e, cj_env *env, cj_buf *out) {
  cj_env *scope = cj_env_new(c, env);
  const cj_node *src = e->b, *test = NULL;
  if (src->t == N_SELECT) {
    test = src->b;
    src = src->a;
  }
  cj_val *it = cj_eval(c, src, scope);
  if (cj_is_object(it)) { /* a mapping iterates over its keys */
    cj_val *keys = cj_array(c, V_ARRAY, it->map->n);
    for (size_t i = 0; i < it->map->n; i++) keys->arr.v[i] = cj_string(c, it->map->keys[i].s, it->map->keys[i].n);
    it = keys;
  } else if (!cj_is_array(it)) {
    cj_fail(c, e->b->pos, "for loops over a list or a mapping, not a %s", cj_type_name(it->t));
  }
  cj_val **items = it->arr.v;
  size_t n = it->arr.n;
  if (test) {
    items = cj_alloc(c, (n ? n : 1) * sizeof *items);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      cj_env *ls = cj_env_new(c, scope);
      bind_loop_var(c, e->a, it->arr.v[i], ls);
      if (cj_truthy(cj_eval(c, test, ls))) items[k++] = it->arr.v[i];
    }
    n = k;
  }
  int none = 1;
  for (size_t i = 0; i < n; i++) {
    cj_step(c, e->pos);
    cj_val *loop = cj_object(c, V_OBJECT);
    cj_map_reserve(c, loop->map, 9);
    set_int(c, loop->map, "index", (double)i + 1);
    set_int(c, loop->map, "index0", (double)i);
    set_int(c, loop->map, "revindex", (double)(n - i));
    set_int(c, loop->map, "revindex0", (double)(n - i - 1));
    cj_map_set(c, loop->map, cj_cstr("first"), cj_bool(c, i == 0));
    cj_map_set(c, loop->map, cj_cstr("last"), cj_bool(c, i == n - 1));
    set_int(c, loop->map, "length", (double)n);
    cj_map_set(c, loop->map, cj_cstr("previtem"), i > 0 ? items[i - 1] : cj_new(c, V_UNDEF));
    cj_map_set(c, loop->map, cj_cstr("nextitem"), i + 1 < n ? items[i + 1] : cj_new(c, V_UNDEF));
    cj_env_set(c, scope, cj_cstr("loop"), loop);
    bind_loop_var(c, e->a, items[i], scope);
    size_t mark = out->n;
    const cj_node *jump = exec(c, &e->l1, scope, out);
    if (jump) { /* what the iteration printed goes, as its exception drops it in runtime.ts */
      out->n = mark;
      if (out->s) out->s[mark] = 0;
      if (jump->t == N_BREAK) break;
      continue;
    }
    none = 0;
  }
  return none ? exec(c, &e->l2, scope, out) : NULL;
}

static void put_result(cj_ctx *c, cj_buf *out, const cj_val *v, size_t pos) {
  if (v->t != V_NULL && v->t != V_UNDEF) cj_put_value(c, out, v, pos);
}

static const cj_node *exec(cj_ctx *c, const cj_list *l, cj_env *env, cj_buf *out) {
  for (size_t i = 0; i < l->n; i++) {
    const cj_node *e = l->v[i], *jump = NULL;
    cj_step(c, e->pos);
    switch (e->t) {
      case N_COMMENT: break;
      case N_SET: {
        cj_val *v;
        if (e->b) {
          v = cj_eval(c, e->b, env);
        } else {
          cj_buf b = {0};
          cj_put(c, &b, "", 0);
          if ((jump = exec(c, &e->l1, env, &b))) return jump;
          v = cj_buf_string(c, &b);
        }
        assign(c, e->a, v, env);
        break;
      }
      case N_IF: jump = exec(c, cj_truthy(cj_eval(c, e->a, env)) ? &e->l1 : &e->l2, env, out); break;
      case N_FOR: jump = exec_for(c, e, env, out); break;
      case N_MACRO: {
        cj_val *f = cj_new(c, V_FUNC);
        f->fn.kind = F_MACRO;
        f->fn.node = e;
        cj_env_set(c, env, e->s, f);
        break;
      }
      case N_CALLBLOCK: {
        cj_val *caller = cj_new(c, V_FUNC);
        caller->fn.kind = F_CALLER;
        caller->fn.node = e;
        caller->fn.env = env;
        cj_val **args;
        size_t n;
        cj_val *kw = cj_object(c, V_KWARGS);
        cj_eval_args(c, &e->a->l1, env, &args, &n, kw->map);
        cj_val **all = cj_alloc(c, (n + 1) * sizeof *all);
        if (n) memcpy(all, args, n * sizeof *all);
        all[n] = kw;
        cj_val *fn = cj_eval(c, e->a->a, env);
        cj_env *scope = cj_env_new(c, env);
        cj_env_set(c, scope, cj_cstr("caller"), caller);
        put_result(c, out, cj_call(c, fn, all, n + 1, scope, e->pos), e->pos);
        break;
      }
      case N_FILTERBLOCK: {
        cj_buf b = {0};
        cj_put(c, &b, "", 0);
        if ((jump = exec(c, &e->l1, env, &b))) return jump;
        put_result(c, out, cj_apply_filter(c, cj_buf_string(c, &b), e->a, env), e->pos);
        break;
      }
      case N_BREAK: case N_CONTINUE: return e;
      default: put_result(c, out, cj_eval(c, e, env), e->pos);
    }
    if (jump) return jump;
  }
  return NULL;
}

void cj_exec_block(cj_ctx *c, const cj_list *l, cj_env *env, cj_buf *out) {
  const cj_node *jump = exec(c, l, env, out);
  if (jump) cj_fail(c, jump->pos, "{%% %s %%} outside a loop", jump->t == N_BREAK ? "break" : "continue");
}
