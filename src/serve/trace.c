/* Expert traces (DESIGN 4.4): a strict reader of the CSV "step,layer,expert,tokens" into a dense
 * (steps, layers, experts) int32 table. Every row has four non-negative decimal integers (digits
 * only: no sign, no spaces) below the MOE_TRACE_MAX_* limits, tokens > 0, expert < experts when the
 * caller gives the expert count, and no (step, layer, expert) twice. A trailing '\r' is accepted
 * (CRLF files); an empty line is not. Errors name the file and the line ("t.csv line 7: ..."). The
 * rows are read first, then the table is sized from their maxima (at most MOE_TRACE_CELLS_PER_ROW
 * cells a row, or MOE_TRACE_MIN_CELLS, and MAX_CELLS in all) and filled. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_CELLS (INT64_C(1) << 31) /* steps * layers * experts: 8 GiB of int32 at most */

typedef struct {
  int64_t step, line;
  int32_t layer, expert, tokens;
} row;

static const char *field_names[4] = {"step", "layer", "expert", "tokens"};

/* Parses s (a whole field) as a decimal integer in [0, max]; writes a message naming the field on
 * failure and returns the status. */
static moe_status parse_field(const char *path, int64_t line, int k, const char *s, int64_t max, int64_t *out) {
  const char *name = field_names[k];
  const char *p = s;
  if (*p == '-' && p[1] >= '0' && p[1] <= '9') {
    for (p++; *p >= '0' && *p <= '9'; p++) {}
    if (!*p)
      return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s line %lld: negative %s %.32s%s", path,
                        (long long)line, k == 3 ? "count (tokens)" : name, s, strlen(s) > 32 ? "..." : "");
  }
  int64_t v = 0;
  for (p = s; *p >= '0' && *p <= '9'; p++) {
    if (v > (INT64_MAX - (*p - '0')) / 10) { v = -1; break; }
    v = v * 10 + (*p - '0');
  }
  if (p == s || (*p && v >= 0))
    return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s line %lld: field '%s' is not a non-negative integer: '%.32s%s'",
                      path, (long long)line, name, s, strlen(s) > 32 ? "..." : "");
  if (v < 0 || v > max)
    return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s line %lld: %s %.32s out of range (at most %lld)", path,
                      (long long)line, name, s, (long long)max);
  *out = v;
  return MOE_OK;
}

/* Splits one data line (no newline) into a row. */
static moe_status parse_row(const char *path, int64_t line, char *s, int experts, row *r) {
  char *f[4];
  int n = 0;
  for (char *p = s;; p++) {
    if (n < 4) f[n] = p;
    n++;
    p = strchr(p, ',');
    if (!p) break;
    *p = 0;
  }
  MOE_TRY(n == 4, MOE_ERR_FORMAT, "%s line %lld: expected 4 fields (step,layer,expert,tokens), got %d", path,
          (long long)line, n);
  int64_t v[4];
  const int64_t max[4] = {MOE_TRACE_MAX_STEPS - 1, MOE_TRACE_MAX_LAYERS - 1, MOE_TRACE_MAX_EXPERTS - 1, INT32_MAX};
  for (int k = 0; k < 4; k++) MOE_CHECK(parse_field(path, line, k, f[k], max[k], &v[k]));
  MOE_TRY(v[3] > 0, MOE_ERR_FORMAT, "%s line %lld: tokens must be > 0 (rows with no tokens are left out), got 0",
          path, (long long)line);
  MOE_TRY(experts == 0 || v[2] < experts, MOE_ERR_FORMAT, "%s line %lld: unknown expert %lld (the model has %d experts)",
          path, (long long)line, (long long)v[2], experts);
  r->step = v[0];
  r->layer = (int32_t)v[1];
  r->expert = (int32_t)v[2];
  r->tokens = (int32_t)v[3];
  r->line = line;
  return MOE_OK;
}

/* Reads every row of f into *rows (grown as needed). */
static moe_status read_rows(FILE *f, const char *path, int experts, row **rows, int64_t *nrows) {
  char *buf = NULL;
  size_t cap = 0, rcap = 0;
  ssize_t len;
  int64_t line = 0;
  moe_status st = MOE_OK;
  *rows = NULL;
  *nrows = 0;
  while ((len = getline(&buf, &cap, f)) >= 0) {
    line++;
    if (len > 0 && buf[len - 1] == '\n') buf[--len] = 0;
    if (len > 0 && buf[len - 1] == '\r') buf[--len] = 0;
    if (line == 1) {
      if (strcmp(buf, "step,layer,expert,tokens")) {
        st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                        "%s line 1: bad header '%.64s' (want 'step,layer,expert,tokens')", path, buf);
        break;
      }
      continue;
    }
    if (len == 0) {
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s line %lld: empty line", path, (long long)line);
      break;
    }
    if ((size_t)*nrows == rcap) {
      size_t nc = rcap ? 2 * rcap : 1024;
      row *nr = realloc(*rows, nc * sizeof *nr);
      if (!nr) {
        st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory at line %lld", path, (long long)line);
        break;
      }
      *rows = nr;
      rcap = nc;
    }
    st = parse_row(path, line, buf, experts, &(*rows)[*nrows]);
    if (st != MOE_OK) break;
    (*nrows)++;
  }
  if (st == MOE_OK && ferror(f))
    st = moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: read error after line %lld: %s", path, (long long)line,
                    strerror(errno));
  else if (st == MOE_OK && !feof(f)) /* getline stopped before the end: no memory for the line */
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory reading line %lld", path,
                    (long long)line + 1);
  if (st == MOE_OK && line == 0)
    st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s line 1: empty file (want the header 'step,layer,expert,tokens')",
                    path);
  free(buf);
  return st;
}

/* Sizes t from the rows, refusing a table mostly of zeros, and fills it, rejecting duplicates. */
static moe_status build(moe_trace *t, const char *path, const row *rows, int64_t n, int experts) {
  int64_t steps = 0, layers = 0, ex = experts;
  const row *far[3] = {NULL, NULL, NULL}; /* the rows with the largest step, layer, expert */
  for (int64_t i = 0; i < n; i++) {
    const row *r = &rows[i];
    if (r->step >= steps) steps = r->step + 1, far[0] = r;
    if (r->layer >= layers) layers = r->layer + 1, far[1] = r;
    if (r->expert >= ex) ex = r->expert + 1, far[2] = r;
  }
  if (n == 0) { /* header only: a valid, empty trace */
    t->experts = experts;
    return MOE_OK;
  }
  /* each factor is below 2^31, 2^12 and 2^16 (the field limits): no overflow */
  int64_t cells = steps * layers * ex, allowed = n * MOE_TRACE_CELLS_PER_ROW;
  if (allowed < MOE_TRACE_MIN_CELLS) allowed = MOE_TRACE_MIN_CELLS;
  if (allowed > MAX_CELLS) allowed = MAX_CELLS;
  if (cells > allowed) {
    char who[64] = "the expert count given";
    if (far[2]) snprintf(who, sizeof who, "expert %d at line %lld", far[2]->expert, (long long)far[2]->line);
    return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                      "%s: trace too large for its %lld rows: %lld steps x %lld layers x %lld experts is %lld cells, "
                      "more than %lld (largest step %lld at line %lld, layer %d at line %lld, %s)",
                      path, (long long)n, (long long)steps, (long long)layers, (long long)ex, (long long)cells,
                      (long long)allowed, (long long)far[0]->step, (long long)far[0]->line, far[1]->layer,
                      (long long)far[1]->line, who);
  }
  int32_t *tok = calloc((size_t)cells, sizeof *tok);
  MOE_TRY(tok, MOE_ERR_NOMEM, "%s: out of memory for %lld x %lld x %lld cells", path, (long long)steps,
          (long long)layers, (long long)ex);
  for (int64_t i = 0; i < n; i++) {
    const row *r = &rows[i];
    int32_t *c = &tok[(r->step * layers + r->layer) * ex + r->expert];
    if (*c) {
      int64_t first = 0;
      for (int64_t j = 0; j < i && !first; j++)
        if (rows[j].step == r->step && rows[j].layer == r->layer && rows[j].expert == r->expert) first = rows[j].line;
      free(tok);
      return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                        "%s line %lld: duplicate row for step %lld, layer %d, expert %d (first at line %lld)", path,
                        (long long)r->line, (long long)r->step, r->layer, r->expert, (long long)first);
    }
    *c = r->tokens;
  }
  t->steps = steps;
  t->layers = (int)layers;
  t->experts = (int)ex;
  t->tokens = tok;
  return MOE_OK;
}

moe_status moe_trace_load(moe_trace *t, const char *path, int experts) {
  MOE_TRY(t && path, MOE_ERR_ARG, "moe_trace_load: NULL %s", t ? "path" : "trace");
  memset(t, 0, sizeof *t);
  MOE_TRY(experts >= 0 && experts <= MOE_TRACE_MAX_EXPERTS, MOE_ERR_ARG,
          "moe_trace_load: experts must be in [0, %d] (0 = infer), got %d", MOE_TRACE_MAX_EXPERTS, experts);
  FILE *f = fopen(path, "r");
  MOE_TRY(f, MOE_ERR_IO, "%s: cannot open trace: %s", path, strerror(errno));
  row *rows;
  int64_t n;
  moe_status st = read_rows(f, path, experts, &rows, &n);
  fclose(f);
  if (st == MOE_OK) st = build(t, path, rows, n, experts);
  free(rows);
  if (st != MOE_OK) memset(t, 0, sizeof *t);
  return st;
}

moe_status moe__trace_check_range(const moe_trace *t, int layer, int64_t s0, int64_t s1, const char *fn) {
  MOE_TRY(t, MOE_ERR_ARG, "%s: NULL trace", fn);
  MOE_TRY(layer >= 0 && layer < t->layers, MOE_ERR_ARG, "%s: layer %d out of range (trace has %d layers)", fn, layer,
          t->layers);
  MOE_TRY(0 <= s0 && s0 <= s1 && s1 <= t->steps, MOE_ERR_ARG, "%s: steps [%lld, %lld) out of range (trace has %lld steps)",
          fn, (long long)s0, (long long)s1, (long long)t->steps);
  return MOE_OK;
}

void moe_trace_free(moe_trace *t) {
  if (!t) return;
  free(t->tokens);
  memset(t, 0, sizeof *t);
}
