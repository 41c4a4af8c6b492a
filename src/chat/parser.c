/* The template's tree, built as @huggingface/jinja's parser.ts builds it: the same statements, the
 * same precedence (ternary < or < and < not < comparisons and `in` < + - ~ < * / // % < ** < `is`
 * tests < | filters < unary signs < calls, members and slices). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

typedef struct {
  cj_ctx *c;
  const cj_tok *t;
  size_t n, i;
} parser;

static const char *TOK_NAMES[] = {"the end of the template", "text", "a number", "a string", "a name", "'='",
                                  "'('", "')'", "'{%'", "'%}'", "'{{'", "'}}'", "'['", "']'", "'{'", "'}'", "','",
                                  "'.'", "':'", "'|'", "an operator", "an operator", "'**'", "a comparison",
                                  "a sign", "a comment"};

static const cj_tok *peek(const parser *P) { return &P->t[P->i < P->n ? P->i : P->n - 1]; }
static int is(const parser *P, cj_tok_type t) { return peek(P)->t == t; }
static int is_ident(const parser *P, size_t ahead, const char *name) {
  return P->i + ahead < P->n && P->t[P->i + ahead].t == T_IDENT && cj_str_eq(P->t[P->i + ahead].v, name);
}
static const cj_tok *next(parser *P) {
  const cj_tok *t = peek(P);
  if (P->i < P->n - 1) P->i++;
  return t;
}

_Noreturn static void unexpected(parser *P, const char *want) {
  const cj_tok *t = peek(P);
  if (t->t == T_IDENT || t->t == T_ADD || t->t == T_MUL || t->t == T_CMP)
    cj_fail(P->c, t->pos, "expected %s, found '%.*s'", want, (int)t->v.n, t->v.s);
  cj_fail(P->c, t->pos, "expected %s, found %s", want, TOK_NAMES[t->t]);
}

static const cj_tok *expect(parser *P, cj_tok_type t, const char *want) {
  if (!is(P, t)) unexpected(P, want);
  return next(P);
}

static void expect_ident(parser *P, const char *name) {
  if (!is_ident(P, 0, name)) {
    char want[64];
    snprintf(want, sizeof want, "'%s'", name);
    unexpected(P, want);
  }
  next(P);
}

static cj_node *node(parser *P, cj_node_type t, size_t pos) {
  cj_node *e = cj_alloc(P->c, sizeof *e);
  e->t = t;
  e->pos = pos;
  return e;
}

typedef struct {
  cj_node **v;
  size_t n, cap;
} vec;
static void vpush(parser *P, vec *v, cj_node *e) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 4;
    cj_node **nv = cj_alloc(P->c, cap * sizeof *nv);
    if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
    v->v = nv;
    v->cap = cap;
  }
  v->v[v->n++] = e;
}
static cj_list vlist(vec v) { return (cj_list){v.v, v.n}; }

static void enter(parser *P) {
  if (++P->c->depth > P->c->lim.max_depth)
    cj_fail(P->c, peek(P)->pos, "nested deeper than %d", P->c->lim.max_depth);
}
static void leave(parser *P) { P->c->depth--; }

static cj_node *expression(parser *P);
static cj_node *primary(parser *P);
static cj_node *any(parser *P);

/* {% NAME ...: whether the next tokens open one of these statements. */
static int at_statement(const parser *P, const char *const *names) {
  if (!is(P, T_OPEN_STMT) || P->i + 1 >= P->n || P->t[P->i + 1].t != T_IDENT) return 0;
  for (; *names; names++)
    if (cj_str_eq(P->t[P->i + 1].v, *names)) return 1;
  return 0;
}

/* Statements up to one of `ends` (not consumed); the opening statement names the error at the end. */
static cj_list body(parser *P, const char *const *ends, const cj_tok *open) {
  vec v = {0};
  while (!at_statement(P, ends)) {
    if (is(P, T_EOF)) cj_fail(P->c, open->pos, "{%% %.*s %%} without its {%% %s %%}", (int)open->v.n, open->v.s, ends[0]);
    vpush(P, &v, any(P));
  }
  return vlist(v);
}

static void close_block(parser *P, const char *end) {
  expect(P, T_OPEN_STMT, "'{%'");
  expect_ident(P, end);
  expect(P, T_CLOSE_STMT, "'%}'");
}

/* Arguments of a call (mode 0) or parameters of a macro (mode 1), after '('. */
static cj_list arguments(parser *P, int params) {
  expect(P, T_LPAREN, "'('");
  vec v = {0};
  int kw = 0, spread = 0;
  while (!is(P, T_RPAREN)) {
    if (is(P, T_EOF)) unexpected(P, "')'");
    size_t pos = peek(P)->pos;
    int kwspread = is(P, T_POW), star = is(P, T_MUL) && cj_str_eq(peek(P)->v, "*");
    if (params && (kwspread || star)) cj_fail(P->c, pos, "argument unpacking in a parameter list");
    cj_node *a;
    if (kwspread) {
      next(P);
      a = node(P, N_KWSPREAD, pos);
      a->a = expression(P);
      vpush(P, &v, a);
      if (is(P, T_COMMA)) next(P);
      if (!is(P, T_RPAREN)) unexpected(P, "')' after the ** argument");
      break;
    }
    if (star) {
      if (spread) cj_fail(P->c, pos, "more than one * argument");
      spread = 1;
      next(P);
      a = node(P, N_SPREAD, pos);
      a->a = expression(P);
    } else {
      a = expression(P);
      if (is(P, T_EQUALS)) {
        next(P);
        if (a->t != N_IDENT) cj_fail(P->c, a->pos, "a keyword argument's name must be a name");
        cj_node *k = node(P, N_KWARG, a->pos);
        k->s = a->s;
        k->a = expression(P);
        a = k;
      }
      if (params && a->t != N_IDENT && a->t != N_KWARG) cj_fail(P->c, a->pos, "a parameter must be a name");
      if (params)
        for (size_t j = 0; j < v.n; j++)
          if (v.v[j]->s.n == a->s.n && !memcmp(v.v[j]->s.s, a->s.s, a->s.n))
            cj_fail(P->c, a->pos, "parameter '%.*s' twice", (int)a->s.n, a->s.s);
      if (a->t == N_KWARG) kw = 1;
      else if (kw) cj_fail(P->c, a->pos, params ? "a parameter without default after one with a default"
                                                : "a positional argument after a keyword argument");
      else if (spread) cj_fail(P->c, a->pos, "a positional argument after a * argument");
    }
    vpush(P, &v, a);
    if (is(P, T_COMMA)) next(P);
  }
  next(P);
  return vlist(v);
}

static cj_node *member(parser *P, cj_node *obj);

static cj_node *call(parser *P, cj_node *callee) {
  cj_node *e = node(P, N_CALL, callee->pos);
  e->a = callee;
  e->l1 = arguments(P, 0);
  e = member(P, e);
  if (is(P, T_LPAREN)) e = call(P, e);
  return e;
}

/* The inside of [...]: an index or a slice a:b:c. */
static cj_node *subscript(parser *P, size_t pos) {
  cj_node *parts[4] = {0};
  size_t k = 0;
  int slice = 0;
  while (!is(P, T_RBRACKET)) {
    if (is(P, T_EOF)) unexpected(P, "']'");
    if (k == 4) cj_fail(P->c, pos, "a slice takes at most 3 parts");
    if (is(P, T_COLON)) {
      parts[k++] = NULL;
      next(P);
      slice = 1;
    } else {
      parts[k++] = expression(P);
      if (is(P, T_COLON)) {
        next(P);
        slice = 1;
      }
    }
  }
  if (!k) cj_fail(P->c, pos, "empty []");
  if (!slice) return parts[0];
  if (k > 3) cj_fail(P->c, pos, "a slice takes at most 3 parts");
  cj_node *s = node(P, N_SLICE, pos);
  s->a = parts[0], s->b = parts[1], s->c = parts[2];
  return s;
}

static cj_node *member(parser *P, cj_node *obj) {
  while (is(P, T_DOT) || is(P, T_LBRACKET)) {
    const cj_tok *op = next(P);
    cj_node *m = node(P, N_MEMBER, op->pos);
    m->a = obj;
    if (op->t == T_LBRACKET) {
      m->flag = 1;
      m->b = subscript(P, op->pos);
      expect(P, T_RBRACKET, "']'");
    } else {
      m->b = primary(P);
      if (m->b->t != N_IDENT && m->b->t != N_INT) cj_fail(P->c, m->b->pos, "expected a name or an integer after '.'");
    }
    obj = m;
  }
  return obj;
}

static cj_node *sequence(parser *P, int prim) {
  cj_node *first = prim ? primary(P) : expression(P);
  if (!is(P, T_COMMA)) return first;
  vec v = {0};
  vpush(P, &v, first);
  while (is(P, T_COMMA)) {
    next(P);
    vpush(P, &v, prim ? primary(P) : expression(P));
  }
  cj_node *t = node(P, N_TUPLE, first->pos);
  t->l1 = vlist(v);
  return t;
}

static cj_node *primary(parser *P) {
  enter(P);
  const cj_tok *t = next(P);
  cj_node *e;
  switch (t->t) {
    case T_NUM: {
      char buf[64];
      size_t n = t->v.n < sizeof buf ? t->v.n : sizeof buf - 1;
      memcpy(buf, t->v.s, n);
      buf[n] = 0;
      e = node(P, memchr(t->v.s, '.', t->v.n) ? N_FLOAT : N_INT, t->pos);
      e->num = t->v.n < sizeof buf ? strtod(buf, NULL) : (buf[0] == '-' ? -1 : 1) * (double)INFINITY;
      break;
    }
    case T_STR: { /* adjacent strings are one */
      cj_buf b = {0};
      cj_puts(P->c, &b, t->v);
      while (is(P, T_STR)) cj_puts(P->c, &b, next(P)->v);
      e = node(P, N_STR, t->pos);
      e->s = (cj_str){b.s ? b.s : "", b.n};
      break;
    }
    case T_IDENT:
      e = node(P, N_IDENT, t->pos);
      e->s = t->v;
      break;
    case T_LPAREN:
      e = sequence(P, 0);
      expect(P, T_RPAREN, "')'");
      break;
    case T_LBRACKET: {
      vec v = {0};
      while (!is(P, T_RBRACKET)) {
        if (is(P, T_EOF)) unexpected(P, "']'");
        vpush(P, &v, expression(P));
        if (is(P, T_COMMA)) next(P);
      }
      next(P);
      e = node(P, N_ARRAY, t->pos);
      e->l1 = vlist(v);
      break;
    }
    case T_LBRACE: {
      vec k = {0}, v = {0};
      while (!is(P, T_RBRACE)) {
        if (is(P, T_EOF)) unexpected(P, "'}'");
        vpush(P, &k, expression(P));
        expect(P, T_COLON, "':' between a key and its value");
        vpush(P, &v, expression(P));
        if (is(P, T_COMMA)) next(P);
      }
      next(P);
      e = node(P, N_OBJECT, t->pos);
      e->l1 = vlist(k);
      e->l2 = vlist(v);
      break;
    }
    default:
      P->i--;
      unexpected(P, "an expression");
  }
  leave(P);
  return e;
}

static cj_node *binary(parser *P, const cj_tok *op, const char *name, cj_node *a, cj_node *b) {
  cj_node *e = node(P, N_BINARY, op->pos);
  e->s = name ? cj_cstr(name) : op->v;
  e->a = a, e->b = b;
  return e;
}

static cj_node *unary_sign(parser *P) {
  const cj_tok *t = peek(P);
  if ((t->t == T_UNARY || t->t == T_ADD) && (cj_str_eq(t->v, "-") || cj_str_eq(t->v, "+"))) {
    enter(P);
    next(P);
    cj_node *e = node(P, N_UNARY, t->pos);
    e->s = t->v;
    e->a = unary_sign(P);
    leave(P);
    return e;
  }
  cj_node *m = member(P, primary(P));
  return is(P, T_LPAREN) ? call(P, m) : m;
}

static cj_node *filter_expr(parser *P) {
  cj_node *e = unary_sign(P);
  while (is(P, T_PIPE)) {
    const cj_tok *op = next(P);
    cj_node *f = primary(P);
    if (f->t != N_IDENT) cj_fail(P->c, f->pos, "expected a filter name after '|'");
    if (is(P, T_LPAREN)) f = call(P, f);
    cj_node *n = node(P, N_FILTER, op->pos);
    n->a = e, n->b = f;
    e = n;
  }
  return e;
}

static cj_node *test_expr(parser *P) {
  cj_node *e = filter_expr(P);
  while (is_ident(P, 0, "is")) {
    const cj_tok *op = next(P);
    int neg = is_ident(P, 0, "not");
    if (neg) next(P);
    cj_node *name = primary(P);
    if (name->t != N_IDENT) cj_fail(P->c, name->pos, "expected a test name after 'is'");
    cj_node *n = node(P, N_TEST, op->pos);
    n->a = e, n->s = name->s, n->flag = neg;
    e = n;
  }
  return e;
}

static cj_node *power(parser *P) {
  cj_node *e = test_expr(P);
  while (is(P, T_POW)) {
    const cj_tok *op = next(P);
    e = binary(P, op, NULL, e, test_expr(P));
  }
  return e;
}

static cj_node *multiplicative(parser *P) {
  cj_node *e = power(P);
  while (is(P, T_MUL)) {
    const cj_tok *op = next(P);
    e = binary(P, op, NULL, e, power(P));
  }
  return e;
}

static cj_node *additive(parser *P) {
  cj_node *e = multiplicative(P);
  while (is(P, T_ADD)) {
    const cj_tok *op = next(P);
    e = binary(P, op, NULL, e, multiplicative(P));
  }
  return e;
}

static cj_node *comparison(parser *P) {
  cj_node *e = additive(P);
  for (;;) {
    const cj_tok *op = peek(P);
    const char *name = NULL;
    if (is_ident(P, 0, "not") && is_ident(P, 1, "in")) {
      next(P);
      name = "not in";
    } else if (!is_ident(P, 0, "in") && !is(P, T_CMP)) {
      break;
    }
    next(P);
    e = binary(P, op, name, e, additive(P));
  }
  return e;
}

static cj_node *negation(parser *P) {
  if (is_ident(P, 0, "not")) {
    enter(P);
    const cj_tok *op = next(P);
    cj_node *e = node(P, N_UNARY, op->pos);
    e->s = op->v;
    e->a = negation(P);
    leave(P);
    return e;
  }
  return comparison(P);
}

static cj_node *logical_and(parser *P) {
  cj_node *e = negation(P);
  while (is_ident(P, 0, "and")) {
    const cj_tok *op = next(P);
    e = binary(P, op, NULL, e, negation(P));
  }
  return e;
}

static cj_node *logical_or(parser *P) {
  cj_node *e = logical_and(P);
  while (is_ident(P, 0, "or")) {
    const cj_tok *op = next(P);
    e = binary(P, op, NULL, e, logical_and(P));
  }
  return e;
}

static cj_node *expression(parser *P) {
  enter(P);
  cj_node *a = logical_or(P);
  if (is_ident(P, 0, "if")) {
    const cj_tok *op = next(P);
    cj_node *test = logical_or(P);
    cj_node *e;
    if (is_ident(P, 0, "else")) {
      next(P);
      e = node(P, N_TERNARY, op->pos);
      e->a = test, e->b = a, e->c = expression(P);
    } else {
      e = node(P, N_SELECT, op->pos);
      e->a = a, e->b = test;
    }
    a = e;
  }
  leave(P);
  return a;
}

static cj_node *if_statement(parser *P, const cj_tok *open) {
  static const char *const ENDS[] = {"endif", "elif", "else", NULL}, *const ENDIF[] = {"endif", NULL};
  cj_node *e = node(P, N_IF, open->pos);
  e->a = expression(P);
  expect(P, T_CLOSE_STMT, "'%}'");
  e->l1 = body(P, ENDS, open);
  if (at_statement(P, (const char *const[]){"elif", NULL})) {
    next(P);
    const cj_tok *elif = next(P);
    enter(P);
    cj_node *alt = if_statement(P, elif);
    leave(P);
    cj_node **one = cj_alloc(P->c, sizeof *one);
    one[0] = alt;
    e->l2 = (cj_list){one, 1};
  } else if (at_statement(P, (const char *const[]){"else", NULL})) {
    next(P);
    next(P);
    expect(P, T_CLOSE_STMT, "'%}'");
    e->l2 = body(P, ENDIF, open);
  }
  return e;
}

static cj_node *statement(parser *P) {
  static const char *const ENDFOR[] = {"endfor", "else", NULL}, *const ENDFOR_ONLY[] = {"endfor", NULL},
                           *const ENDSET[] = {"endset", NULL}, *const ENDMACRO[] = {"endmacro", NULL},
                           *const ENDCALL[] = {"endcall", NULL}, *const ENDFILTER[] = {"endfilter", NULL};
  expect(P, T_OPEN_STMT, "'{%'");
  const cj_tok *name = peek(P);
  if (name->t != T_IDENT) unexpected(P, "a statement name");
  next(P);
  cj_node *e;
  if (cj_str_eq(name->v, "set")) {
    e = node(P, N_SET, name->pos);
    e->a = sequence(P, 0);
    if (is(P, T_EQUALS)) {
      next(P);
      e->b = sequence(P, 0);
    } else {
      expect(P, T_CLOSE_STMT, "'=' or '%}'");
      e->l1 = body(P, ENDSET, name);
      expect(P, T_OPEN_STMT, "'{%'");
      expect_ident(P, "endset");
    }
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (cj_str_eq(name->v, "if")) {
    e = if_statement(P, name);
    close_block(P, "endif");
  } else if (cj_str_eq(name->v, "macro")) {
    e = node(P, N_MACRO, name->pos);
    cj_node *id = primary(P);
    if (id->t != N_IDENT) cj_fail(P->c, id->pos, "expected the macro's name");
    e->s = id->s;
    e->l1 = arguments(P, 1);
    expect(P, T_CLOSE_STMT, "'%}'");
    e->l2 = body(P, ENDMACRO, name);
    close_block(P, "endmacro");
  } else if (cj_str_eq(name->v, "for")) {
    e = node(P, N_FOR, name->pos);
    e->a = sequence(P, 1);
    if (e->a->t != N_IDENT && e->a->t != N_TUPLE) cj_fail(P->c, e->a->pos, "expected the loop's variable names");
    expect_ident(P, "in");
    e->b = expression(P);
    expect(P, T_CLOSE_STMT, "'%}'");
    e->l1 = body(P, ENDFOR, name);
    if (at_statement(P, (const char *const[]){"else", NULL})) {
      next(P);
      next(P);
      expect(P, T_CLOSE_STMT, "'%}'");
      e->l2 = body(P, ENDFOR_ONLY, name);
    }
    close_block(P, "endfor");
  } else if (cj_str_eq(name->v, "call")) {
    e = node(P, N_CALLBLOCK, name->pos);
    if (is(P, T_LPAREN)) {
      e->flag = 1;
      e->l1 = arguments(P, 1);
    }
    cj_node *callee = primary(P);
    if (callee->t != N_IDENT) cj_fail(P->c, callee->pos, "expected a macro name after 'call'");
    e->a = node(P, N_CALL, callee->pos);
    e->a->a = callee;
    e->a->l1 = arguments(P, 0);
    expect(P, T_CLOSE_STMT, "'%}'");
    e->l2 = body(P, ENDCALL, name);
    close_block(P, "endcall");
  } else if (cj_str_eq(name->v, "break") || cj_str_eq(name->v, "continue")) {
    e = node(P, cj_str_eq(name->v, "break") ? N_BREAK : N_CONTINUE, name->pos);
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (cj_str_eq(name->v, "filter")) {
    e = node(P, N_FILTERBLOCK, name->pos);
    e->a = primary(P);
    if (e->a->t == N_IDENT && is(P, T_LPAREN)) e->a = call(P, e->a);
    if (e->a->t != N_IDENT && e->a->t != N_CALL) cj_fail(P->c, e->a->pos, "expected a filter after 'filter'");
    expect(P, T_CLOSE_STMT, "'%}'");
    e->l1 = body(P, ENDFILTER, name);
    close_block(P, "endfilter");
  } else {
    cj_fail(P->c, name->pos, "unknown statement '%.*s'", (int)name->v.n, name->v.s);
  }
  return e;
}

static cj_node *any(parser *P) {
  enter(P);
  const cj_tok *t = peek(P);
  cj_node *e;
  switch (t->t) {
    case T_COMMENT:
      next(P);
      e = node(P, N_COMMENT, t->pos);
      break;
    case T_TEXT:
      next(P);
      e = node(P, N_STR, t->pos);
      e->s = t->v;
      break;
    case T_OPEN_STMT:
      e = statement(P);
      break;
    case T_OPEN_EXPR:
      next(P);
      e = expression(P);
      expect(P, T_CLOSE_EXPR, "'}}'");
      break;
    default:
      unexpected(P, "text, '{{' or '{%'");
  }
  leave(P);
  return e;
}

cj_list cj_parse(cj_ctx *c, const cj_tok *toks, size_t ntok) {
  parser P = {c, toks, ntok, 0};
  vec v = {0};
  while (!is(&P, T_EOF)) vpush(&P, &v, any(&P));
  return vlist(v);
}
