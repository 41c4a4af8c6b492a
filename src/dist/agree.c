/* moe_dist_agree (see moe.h): ranks started with different options hang in a collective whose counts
 * differ, or run silently wrong. Every rank compares its settings with rank 0's at start-up, over the
 * one collective every build has (a sum of doubles: rank 0 contributing and the others zeros is a
 * broadcast, each rank writing its own slot a gather), so that every rank fails with the same message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define TEXT 32 /* characters of a setting's text carried to every rank */

/* The sum over ranks of n doubles, in place. */
static moe_status sum(const moe_dist *d, double *a, int n) { return moe_dist_allreduce(d, a, n); }

/* A setting as text: its own, or its value. */
static void text_of(const moe_dist_setting *s, char *out) {
  if (s->text) snprintf(out, TEXT, "%s", s->text);
  else snprintf(out, TEXT, "%.9g", s->value);
}

moe_status moe_dist_agree(const moe_dist *d, const moe_dist_setting *s, int n) {
  MOE_TRY(n >= 0 && (s || n == 0), MOE_ERR_ARG, "moe_dist_agree: bad arguments (n = %d)", n);
  int W = moe_dist_size(d), r = moe_dist_rank(d);
  if (W <= 1) return MOE_OK;
  double count[2] = {r == 0 ? n : 0, 0};
  MOE_CHECK(sum(d, count, 1));
  count[1] = count[0] != n;
  MOE_CHECK(sum(d, count + 1, 1));
  MOE_TRY(count[1] == 0, MOE_ERR_ARG, "the ranks disagree: %g of them compare another number of settings than rank 0's %d "
          "(different builds of moe?)", count[1], (int)count[0]);
  /* rank 0's values; then each rank's first differing setting (index + 1, 0 for none) */
  double *buf = calloc((size_t)n + 2 * (size_t)W + 2 * TEXT, sizeof *buf);
  MOE_TRY(buf, MOE_ERR_NOMEM, "moe_dist_agree: out of memory");
  double *ref = buf, *first = buf + n, *text = first + 2 * W;
  for (int i = 0; r == 0 && i < n; i++) ref[i] = s[i].value;
  moe_status st = sum(d, ref, n);
  int j = 0;
  while (j < n && (ref[j] == s[j].value || (isnan(ref[j]) && isnan(s[j].value)))) j++;
  if (j < n) first[r] = j + 1, first[W + r] = s[j].value;
  if (st == MOE_OK) st = sum(d, first, 2 * W);
  int q = 0;
  while (q < W && first[q] == 0) q++;
  if (st == MOE_OK && q < W) { /* the first rank that differs, and its setting as text on every rank */
    int k = (int)first[q] - 1, others = 0;
    char mine[TEXT];
    text_of(&s[k], mine);
    for (int c = 0; c < TEXT && (r == 0 || r == q); c++) text[(r == q) * TEXT + c] = (unsigned char)mine[c];
    st = sum(d, text, 2 * TEXT);
    char t0[TEXT], tq[TEXT];
    for (int c = 0; c < TEXT; c++) t0[c] = (char)text[c], tq[c] = (char)text[TEXT + c];
    t0[TEXT - 1] = tq[TEXT - 1] = 0;
    for (int p = q + 1; p < W; p++) others += first[p] != 0;
    if (st == MOE_OK)
      st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__,
                      "the ranks disagree: rank %d has %s = %s, rank 0 has %s%s; every rank must run the same "
                      "configuration", q, s[k].name, tq, t0, others ? " (and more ranks differ)" : "");
  }
  free(buf);
  return st;
}
