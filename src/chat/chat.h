/* Chat templates: the subset of Jinja that Hugging Face's chat templates use, rendered as
 * @huggingface/jinja (the renderer transformers.js uses) renders them, quirks included (its values are
 * JavaScript's: numbers are doubles, `==` is JavaScript's loose equality, strip() takes no argument).
 * lexer.c cuts the template into tokens, parser.c builds the tree, eval.c runs it over values
 * (value.c), filters.c and methods.c are the built-in filters, tests, methods and globals.
 *
 * Every allocation of a render comes from one arena (cj_ctx) freed at the end, and an error anywhere
 * longjmps back to the entry point with its message: the tree and values need no freeing of their own. */
#ifndef MOE_CHAT_H
#define MOE_CHAT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* Bounds that keep a hostile template finite. */
typedef struct {
  size_t max_bytes;  /* the arena: every string, list and tree node of the render */
  size_t max_steps;  /* expressions and statements evaluated */
  size_t max_items;  /* elements of one list (range(), +) */
  int max_depth;     /* nesting of the parser and the evaluator */
} cj_limits;

typedef struct cj_chunk cj_chunk;
typedef struct cj_ctx {
  jmp_buf fail;
  const char *tmpl; /* the template as given: positions are offsets into it */
  size_t tmpl_len;
  cj_chunk *chunks;
  size_t used;
  size_t steps;
  int depth;
  int64_t now; /* strftime_now's time (Unix seconds, UTC); < 0: the clock */
  cj_limits lim;
  moe_status status; /* of the failure: MOE_ERR_FORMAT while parsing, MOE_ERR_VALUE while rendering */
} cj_ctx;

/* Records "MESSAGE at LINE:COL" (pos: offset in the template; SIZE_MAX: no position) and longjmps. */
_Noreturn void cj_fail(cj_ctx *c, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *cj_alloc(cj_ctx *c, size_t n); /* zeroed; fails the render past max_bytes */
void cj_free_all(cj_ctx *c);

typedef struct {
  const char *s;
  size_t n;
} cj_str;

/* ---- tokens and tree ---- */
typedef enum {
  T_EOF, T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT, T_CLOSE_STMT,
  T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT, T_COLON,
  T_PIPE, T_ADD, T_MUL, T_POW, T_CMP, T_UNARY, T_COMMENT
} cj_tok_type;

typedef struct {
  cj_tok_type t;
  cj_str v;
  size_t pos;
} cj_tok;

/* The tokens of the template (ending with T_EOF), after @huggingface/jinja's preprocessing: one
 * trailing newline dropped, lstrip_blocks and trim_blocks, {% generation %} tags removed. */
cj_tok *cj_lex(cj_ctx *c, size_t *ntok);

typedef enum {
  N_INT, N_FLOAT, N_STR, N_IDENT, N_ARRAY, N_TUPLE, N_OBJECT, N_MEMBER, N_SLICE, N_CALL, N_KWARG,
  N_SPREAD, N_KWSPREAD, N_UNARY, N_BINARY, N_FILTER, N_TEST, N_SELECT, N_TERNARY,
  N_IF, N_FOR, N_SET, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_COMMENT
} cj_node_type;

typedef struct cj_node cj_node;
typedef struct {
  cj_node **v;
  size_t n;
} cj_list;

/* One node; which fields mean what, by type:
 *  literals: num, s; IDENT: s; ARRAY/TUPLE: l1; OBJECT: l1 keys, l2 values; MEMBER: a[b] (flag:
 *  computed); SLICE: a:b:c (NULL: omitted); CALL: a(l1); KWARG: s=a; SPREAD/KWSPREAD: a;
 *  UNARY/BINARY: s the operator, a, b; FILTER: a | b (b an IDENT or CALL); TEST: a is [not] s (flag:
 *  negated); SELECT: a if b; TERNARY: b if a else c; IF: a, l1, l2 (else); FOR: a in b, l1, l2
 *  (else); SET: a = b, or l1 (block set); MACRO: s(l1) l2; CALLBLOCK: a the call, l1 the caller's
 *  parameters, l2 the body; FILTERBLOCK: a the filter, l1. */
struct cj_node {
  cj_node_type t;
  size_t pos;
  cj_str s;
  double num;
  int flag;
  cj_node *a, *b, *c;
  cj_list l1, l2;
};

/* The statements of the template. */
cj_list cj_parse(cj_ctx *c, const cj_tok *toks, size_t ntok);

/* ---- values (JavaScript's, as @huggingface/jinja holds them) ---- */
typedef enum { V_UNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARRAY, V_TUPLE, V_OBJECT, V_KWARGS, V_NS,
               V_FUNC } cj_vtype;

typedef struct cj_val cj_val;
typedef struct {
  size_t n, cap;
  cj_str *keys;
  cj_val **vals;
} cj_map;

typedef enum { F_BUILTIN, F_METHOD, F_MACRO, F_CALLER } cj_fkind;
typedef struct cj_env cj_env;

struct cj_val {
  cj_vtype t;
  union {
    int b;
    double num;
    cj_str str;
    struct {
      cj_val **v;
      size_t n;
    } arr;
    cj_map *map;
    struct {
      cj_fkind kind;
      const char *name; /* builtin or method name */
      cj_val *self;     /* a method's object */
      const cj_node *node;
      cj_env *env; /* a call block's scope */
    } fn;
  };
};

struct cj_env {
  cj_env *parent;
  cj_map vars;
};

cj_val *cj_new(cj_ctx *c, cj_vtype t);
cj_val *cj_bool(cj_ctx *c, int b);
cj_val *cj_num(cj_ctx *c, cj_vtype t, double x);
cj_val *cj_string(cj_ctx *c, const char *s, size_t n);
cj_val *cj_array(cj_ctx *c, cj_vtype t, size_t n); /* n elements to fill */
cj_val *cj_object(cj_ctx *c, cj_vtype t);
cj_val *cj_map_get(const cj_map *m, const char *k, size_t n);
void cj_map_set(cj_ctx *c, cj_map *m, cj_str k, cj_val *v);
void cj_map_reserve(cj_ctx *c, cj_map *m, size_t cap);
cj_val *cj_from_json(cj_ctx *c, const void *cjson); /* JSON.parse's value (a cJSON *) */

int cj_truthy(const cj_val *v);
const char *cj_type_name(cj_vtype t);
int cj_is_object(const cj_val *v); /* instanceof ObjectValue: objects and keyword arguments */
int cj_is_array(const cj_val *v);  /* instanceof ArrayValue: lists and tuples */

/* A growing byte string in the arena. */
typedef struct {
  char *s;
  size_t n, cap;
} cj_buf;
void cj_put(cj_ctx *c, cj_buf *b, const char *s, size_t n);
/* The buffer's bytes as a string value (no copy; "" when empty). */
cj_val *cj_buf_string(cj_ctx *c, const cj_buf *b);
static inline void cj_puts(cj_ctx *c, cj_buf *b, cj_str s) { cj_put(c, b, s.s, s.n); }

/* JavaScript's Number.prototype.toString of x. */
void cj_put_number(cj_ctx *c, cj_buf *b, double x);
/* RuntimeValue.toString (what {{ }} prints); pos for the error on a function. */
void cj_put_value(cj_ctx *c, cj_buf *b, const cj_val *v, size_t pos);
/* The raw JavaScript value's toString (what `~` and `+` join). */
void cj_put_raw(cj_ctx *c, cj_buf *b, const cj_val *v, size_t pos);
typedef struct {
  int indent; /* 0: none */
  int ensure_ascii, sort_keys;
  const char *item_sep, *key_sep; /* NULL: the defaults */
  int undefined_as_null;
} cj_json_opts;
void cj_put_json(cj_ctx *c, cj_buf *b, const cj_val *v, const cj_json_opts *o, int depth, size_t pos);

/* JavaScript's loose (==) and strict (===) equality of the values' .value. */
int cj_loose_eq(const cj_val *a, const cj_val *b);
int cj_strict_eq(const cj_val *a, const cj_val *b);

/* ---- strings as JavaScript sees them (UTF-16 units, its \s) ---- */
int cj_js_space(uint32_t cp);
/* JavaScript's \w: ASCII letters, digits and _. */
static inline int cj_is_word(unsigned char ch) {
  return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}
/* The code point at s[i] (invalid bytes: one unit each) and its length in bytes. */
uint32_t cj_utf8_next(const char *s, size_t n, size_t i, size_t *len);
size_t cj_utf16_len(const char *s, size_t n);
cj_str cj_trim(cj_str s, int start, int end);
/* JavaScript's toUpperCase / toLowerCase (glibc's C.UTF-8 simple mapping, with ß, İ and the final
 * sigma as SpecialCasing maps them), title() (/\b\w/ upper: ASCII) and capitalize() (the first UTF-16
 * unit upper, the rest as it is) (case.c). */
typedef enum { CJ_UPPER, CJ_LOWER, CJ_TITLE, CJ_CAPITALIZE } cj_case;
cj_val *cj_recase(cj_ctx *c, cj_str s, cj_case how);
void cj_put_utf8(cj_ctx *c, cj_buf *b, uint32_t cp);

/* ---- the evaluator ---- */
cj_val *cj_eval(cj_ctx *c, const cj_node *e, cj_env *env);
/* Runs the statements, appending what they print to out. */
void cj_exec_block(cj_ctx *c, const cj_list *l, cj_env *env, cj_buf *out);
cj_env *cj_env_new(cj_ctx *c, cj_env *parent);
void cj_env_set(cj_ctx *c, cj_env *env, cj_str name, cj_val *v);
cj_val *cj_call(cj_ctx *c, cj_val *fn, cj_val **args, size_t nargs, cj_env *env, size_t pos);
/* Evaluates a call's arguments: the positional ones into *pos_args, the keyword ones into a map. */
void cj_eval_args(cj_ctx *c, const cj_list *args, cj_env *env, cj_val ***pos_args, size_t *npos, cj_map *kw);

/* Counts one step of the render against max_steps. */
void cj_step(cj_ctx *c, size_t pos);

/* ---- built-ins (filters.c, methods.c) ---- */
/* dict.dictsort(case_sensitive, by, reverse): the [key, value] pairs sorted. */
cj_val *cj_dictsort(cj_ctx *c, const cj_val *obj, cj_val **args, size_t n, size_t pos);
cj_val *cj_apply_filter(cj_ctx *c, cj_val *v, const cj_node *filter, cj_env *env);
int cj_test(cj_ctx *c, const cj_val *v, cj_str name, const cj_val *arg, int has_arg, size_t pos);
/* A property of a string, list, object or other value (methods bound to it), or NULL. */
cj_val *cj_builtin_member(cj_ctx *c, cj_val *obj, cj_str name);
cj_val *cj_call_builtin(cj_ctx *c, cj_val *fn, cj_val **args, size_t nargs, cj_env *env, size_t pos);
/* The global functions and constants, in env. */
void cj_set_globals(cj_ctx *c, cj_env *env);
cj_str cj_cstr(const char *s);
int cj_str_eq(cj_str a, const char *b);

#endif
