/* The template's tokens, cut as @huggingface/jinja's lexer cuts them (lexer.ts): its preprocessing
 * (lstrip_blocks, trim_blocks, a final newline dropped, {% generation %} tags removed), then text
 * outside tags, and inside them names, numbers, strings and operators, with {%- -%} trimming. Each
 * byte keeps its offset in the template as given, so that errors name the line and column. */
#include <string.h>

#include "chat.h"

typedef struct {
  char *s;
  size_t *pos; /* pos[i]: the offset in the template of s[i] */
  size_t n;
} src_t;

static src_t src_new(cj_ctx *c, size_t cap) {
  src_t d = {cj_alloc(c, cap + 1), cj_alloc(c, (cap + 1) * sizeof(size_t)), 0};
  return d;
}
static void src_copy(src_t *d, const src_t *s, size_t from, size_t to) {
  memcpy(d->s + d->n, s->s + from, to - from);
  memcpy(d->pos + d->n, s->pos + from, (to - from) * sizeof(size_t));
  d->n += to - from;
}
static void src_end(src_t *d, size_t end) {
  d->s[d->n] = 0;
  d->pos[d->n] = end;
}

/* The end of the run of JavaScript whitespace (\s) starting at i. */
static size_t skip_space(const src_t *s, size_t i) {
  size_t len;
  while (i < s->n && cj_js_space(cj_utf8_next(s->s, s->n, i, &len))) i += len;
  return i;
}

/* /^[ \t]*({[#%-])/gm -> "$1": blanks before a tag that starts its line. */
static src_t lstrip_blocks(cj_ctx *c, const src_t *s) {
  src_t d = src_new(c, s->n);
  for (size_t i = 0; i < s->n;) {
    if (i == 0 || s->s[i - 1] == '\n' || s->s[i - 1] == '\r') {
      size_t j = i;
      while (j < s->n && (s->s[j] == ' ' || s->s[j] == '\t')) j++;
      if (j + 1 < s->n && s->s[j] == '{' && strchr("#%-", s->s[j + 1])) i = j;
    }
    src_copy(&d, s, i, i + 1);
    i++;
  }
  src_end(&d, s->pos[s->n]);
  return d;
}

/* /([#%-]})\n/g -> "$1": the newline after a tag. */
static src_t trim_blocks(cj_ctx *c, const src_t *s) {
  src_t d = src_new(c, s->n);
  for (size_t i = 0; i < s->n;) {
    if (i + 2 < s->n && s->s[i] && strchr("#%-", s->s[i]) && s->s[i + 1] == '}' && s->s[i + 2] == '\n') {
      src_copy(&d, s, i, i + 2);
      i += 3;
    } else {
      src_copy(&d, s, i, i + 1);
      i++;
    }
  }
  src_end(&d, s->pos[s->n]);
  return d;
}

/* The end of a {%-? (end)?generation -?%} tag at i, or 0; *l and *r: its dashes. */
static size_t generation_tag(const src_t *s, size_t i, int *l, int *r) {
  if (i + 1 >= s->n || s->s[i] != '{' || s->s[i + 1] != '%') return 0;
  i += 2;
  *l = i < s->n && s->s[i] == '-';
  i = skip_space(s, i + (size_t)*l);
  if (i + 3 <= s->n && !memcmp(s->s + i, "end", 3) && i + 13 <= s->n && !memcmp(s->s + i + 3, "generation", 10)) i += 3;
  if (i + 10 > s->n || memcmp(s->s + i, "generation", 10)) return 0;
  i = skip_space(s, i + 10);
  *r = i < s->n && s->s[i] == '-';
  i += (size_t)*r;
  if (i + 1 >= s->n || s->s[i] != '%' || s->s[i + 1] != '}') return 0;
  return i + 2;
}

/* /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs: transformers' {% generation %} marks, removed
 * with the blanks around them unless a dash says otherwise. */
static src_t strip_generation(cj_ctx *c, const src_t *s) {
  src_t d = src_new(c, s->n);
  for (size_t i = 0; i < s->n;) {
    size_t j = skip_space(s, i), end, after;
    int l, r;
    if ((end = generation_tag(s, j, &l, &r))) {
      after = skip_space(s, end);
      if (!l) src_copy(&d, s, i, j);
      if (!r) src_copy(&d, s, end, after);
      i = after;
    } else if (j > i) {
      src_copy(&d, s, i, j);
      i = j;
    } else {
      src_copy(&d, s, i, i + 1);
      i++;
    }
  }
  src_end(&d, s->pos[s->n]);
  return d;
}

typedef struct {
  cj_ctx *c;
  src_t s;
  size_t i;
  cj_tok *v;
  size_t n, cap;
} lexer;

static void push(lexer *L, cj_tok_type t, const char *v, size_t n, size_t at) {
  if (L->n == L->cap) {
    size_t cap = L->cap ? 2 * L->cap : 64;
    cj_tok *nv = cj_alloc(L->c, cap * sizeof *nv);
    if (L->n) memcpy(nv, L->v, L->n * sizeof *nv);
    L->v = nv;
    L->cap = cap;
  }
  L->v[L->n++] = (cj_tok){t, {v, n}, L->s.pos[at]};
}

static cj_tok_type last_type(const lexer *L) { return L->n ? L->v[L->n - 1].t : T_EOF; }

/* {%- and friends: the text before loses its trailing whitespace (and goes when empty). */
static void strip_trailing(lexer *L) {
  if (!L->n || L->v[L->n - 1].t != T_TEXT) return;
  cj_tok *t = &L->v[L->n - 1];
  t->v = cj_trim(t->v, 0, 1);
  if (!t->v.n) L->n--;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* A quoted string from just after its opening quote; escapes as lexer.ts reads them. */
static cj_str string_literal(lexer *L, char quote, size_t start) {
  cj_buf b = {0};
  cj_put(L->c, &b, "", 0);
  const src_t *s = &L->s;
  while (L->i < s->n && s->s[L->i] != quote) {
    if (s->s[L->i] == '\\') {
      if (++L->i >= s->n) break;
      char e = s->s[L->i++];
      if (e == 'x' || e == 'u') {
        size_t k = e == 'x' ? 2 : 4;
        uint32_t cp = 0;
        for (size_t j = 0; j < k; j++) {
          char h = L->i + j < s->n ? s->s[L->i + j] : 0;
          int d = is_digit(h) ? h - '0' : (h | 32) >= 'a' && (h | 32) <= 'f' ? (h | 32) - 'a' + 10 : -1;
          if (d < 0) cj_fail(L->c, s->pos[L->i - 2], "invalid escape \\%c in a string", e);
          cp = cp * 16 + (uint32_t)d;
        }
        L->i += k;
        cj_put_utf8(L->c, &b, cp);
        continue;
      }
      const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
      const char *hit = strchr(from, e);
      if (!e || !hit) cj_fail(L->c, s->pos[L->i - 2], "unknown escape \\%c in a string", e ? e : '0');
      cj_put(L->c, &b, to + (hit - from), 1);
      continue;
    }
    cj_put(L->c, &b, s->s + L->i, 1);
    L->i++;
  }
  if (L->i >= s->n) cj_fail(L->c, s->pos[start], "unterminated string");
  L->i++; /* the closing quote */
  return (cj_str){b.s, b.n};
}

static const struct {
  const char *seq;
  cj_tok_type t;
} TABLE[] = {{"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
             {"(", T_LPAREN}, {")", T_RPAREN}, {"{", T_LBRACE}, {"}", T_RBRACE}, {"[", T_LBRACKET},
             {"]", T_RBRACKET}, {",", T_COMMA}, {".", T_DOT}, {":", T_COLON}, {"|", T_PIPE},
             {"<=", T_CMP}, {">=", T_CMP}, {"==", T_CMP}, {"!=", T_CMP}, {"<", T_CMP}, {">", T_CMP},
             {"+", T_ADD}, {"-", T_ADD}, {"~", T_ADD}, {"**", T_POW}, {"*", T_MUL}, {"//", T_MUL},
             {"/", T_MUL}, {"%", T_MUL}, {"=", T_EQUALS}};

static int at(const lexer *L, const char *seq) {
  size_t n = strlen(seq);
  return L->i + n <= L->s.n && !memcmp(L->s.s + L->i, seq, n);
}

static size_t digits(const lexer *L, size_t i) {
  while (i < L->s.n && is_digit(L->s.s[i])) i++;
  return i;
}

cj_tok *cj_lex(cj_ctx *c, size_t *ntok) {
  src_t s0 = src_new(c, c->tmpl_len);
  memcpy(s0.s, c->tmpl, c->tmpl_len);
  for (size_t i = 0; i <= c->tmpl_len; i++) s0.pos[i] = i;
  s0.n = c->tmpl_len;
  if (s0.n && s0.s[s0.n - 1] == '\n') s0.n--;
  s0.pos[s0.n] = c->tmpl_len;
  src_t s1 = lstrip_blocks(c, &s0);
  src_t s2 = trim_blocks(c, &s1);
  lexer L = {c, strip_generation(c, &s2), 0, NULL, 0, 0};
  const src_t *s = &L.s;
  int curly = 0;
  while (L.i < s->n) {
    cj_tok_type lt = last_type(&L);
    if (lt == T_EOF || lt == T_CLOSE_STMT || lt == T_CLOSE_EXPR || lt == T_COMMENT) {
      size_t j = L.i;
      while (j < s->n && !(s->s[j] == '{' && j + 1 < s->n && strchr("%{#", s->s[j + 1]))) j++;
      if (j > L.i) {
        push(&L, T_TEXT, s->s + L.i, j - L.i, L.i);
        L.i = j;
        continue;
      }
    }
    if (at(&L, "{#")) {
      size_t start = L.i;
      L.i += 2;
      int before = L.i < s->n && s->s[L.i] == '-';
      L.i += (size_t)before;
      size_t from = L.i;
      while (!(L.i + 1 < s->n && s->s[L.i] == '#' && s->s[L.i + 1] == '}')) {
        if (L.i + 2 >= s->n) cj_fail(c, s->pos[start], "comment without its #}");
        L.i++;
      }
      size_t to = L.i;
      int after = to > from && s->s[to - 1] == '-';
      if (before) strip_trailing(&L);
      push(&L, T_COMMENT, s->s + from, to - from - (size_t)after, start);
      L.i += 2;
      if (after) L.i = skip_space(s, L.i);
      continue;
    }
    if (at(&L, "{%-") || at(&L, "{{-")) {
      strip_trailing(&L);
      int expr = s->s[L.i + 1] == '{';
      push(&L, expr ? T_OPEN_EXPR : T_OPEN_STMT, expr ? "{{" : "{%", 2, L.i);
      if (expr) curly = 0;
      L.i += 3;
      continue;
    }
    L.i = skip_space(s, L.i);
    if (L.i >= s->n) break;
    if (at(&L, "-%}") || at(&L, "-}}")) {
      int expr = s->s[L.i + 1] == '}';
      push(&L, expr ? T_CLOSE_EXPR : T_CLOSE_STMT, expr ? "}}" : "%}", 2, L.i);
      L.i = skip_space(s, L.i + 3);
      continue;
    }
    char ch = s->s[L.i];
    if (ch == '-' || ch == '+') {
      lt = last_type(&L);
      if (lt == T_TEXT || lt == T_EOF) cj_fail(c, s->pos[L.i], "unexpected '%c'", ch);
      if (lt != T_IDENT && lt != T_NUM && lt != T_STR && lt != T_RPAREN && lt != T_RBRACKET) {
        size_t start = L.i++, j = digits(&L, L.i);
        if (j > L.i && j + 1 < s->n && s->s[j] == '.' && is_digit(s->s[j + 1])) j = digits(&L, j + 1);
        push(&L, j > L.i ? T_NUM : T_UNARY, s->s + start, j - start, start);
        L.i = j;
        continue;
      }
    }
    int matched = 0;
    for (size_t k = 0; k < sizeof TABLE / sizeof *TABLE && !matched; k++) {
      if (TABLE[k].t == T_CLOSE_EXPR && curly > 0) continue;
      if (!at(&L, TABLE[k].seq)) continue;
      size_t n = strlen(TABLE[k].seq);
      push(&L, TABLE[k].t, s->s + L.i, n, L.i);
      if (TABLE[k].t == T_OPEN_EXPR) curly = 0;
      else if (TABLE[k].t == T_LBRACE) curly++;
      else if (TABLE[k].t == T_RBRACE) curly--;
      L.i += n;
      matched = 1;
    }
    if (matched) continue;
    if (ch == '\'' || ch == '"') {
      size_t start = L.i++;
      cj_str v = string_literal(&L, ch, start);
      push(&L, T_STR, v.s, v.n, start);
      continue;
    }
    if (is_digit(ch)) {
      size_t j = digits(&L, L.i);
      if (last_type(&L) != T_DOT && j + 1 < s->n && s->s[j] == '.' && is_digit(s->s[j + 1])) j = digits(&L, j + 1);
      push(&L, T_NUM, s->s + L.i, j - L.i, L.i);
      L.i = j;
      continue;
    }
    if (cj_is_word((unsigned char)ch)) {
      size_t j = L.i;
      while (j < s->n && cj_is_word((unsigned char)s->s[j])) j++;
      push(&L, T_IDENT, s->s + L.i, j - L.i, L.i);
      L.i = j;
      continue;
    }
    size_t len;
    cj_utf8_next(s->s, s->n, L.i, &len);
    cj_fail(c, s->pos[L.i], "unexpected character '%.*s'", (int)len, s->s + L.i);
  }
  push(&L, T_EOF, "", 0, s->n);
  *ntok = L.n;
  return L.v;
}
