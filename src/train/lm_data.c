/* The language model's data: a text as one token stream, and the loss over fixed windows of one. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

moe_status moe_lm_stream_encode(const moe_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  int32_t eot = moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT);
  MOE_TRY(eot >= 0, MOE_ERR_ARG, "the tokenizer has no %s token", MOE_TOKENIZER_EOT);
  int32_t *out = malloc((len + 2) * sizeof *out); /* a token is a byte at least; the EOTs fit in the separators */
  MOE_TRY(out, MOE_ERR_NOMEM, "token stream: out of memory for %zu bytes of text", len);
  size_t k = 0;
  for (const char *doc = text; doc < text + len;) {
    const char *end = memmem(doc, (size_t)(text + len - doc), "\n\n", 2), *stop = end ? end : text + len;
    size_t got = 0;
    out[k++] = eot;
    moe_status st = moe_tokenizer_encode(t, doc, (size_t)(stop - doc), 0, out + k, &got);
    if (st != MOE_OK) return free(out), st;
    k += got;
    doc = end ? end + 2 : stop;
  }
  *ids = out;
  *n = k;
  return MOE_OK;
}

moe_status moe_lm_eval_windows(moe_lm_t *m, const int32_t *ids, size_t n, int T, int B, int max_windows,
                               double *loss) {
  MOE_TRY(T > 0 && B > 0 && n >= (size_t)T + 1, MOE_ERR_ARG,
          "evaluation: %zu tokens, fewer than one window of %d + 1 (batch %d)", n, T, B);
  size_t count = (n - 1) / (size_t)T;
  size_t use = max_windows > 0 && (size_t)max_windows < count ? (size_t)max_windows : count;
  int32_t *x = malloc((size_t)B * T * sizeof *x), *y = malloc((size_t)B * T * sizeof *y);
  if (!x || !y) {
    free(x);
    free(y);
    MOE_TRY(0, MOE_ERR_NOMEM, "evaluating: out of memory for a batch of %d x %d", B, T);
  }
  moe_status st = MOE_OK;
  double sum = 0;
  long tokens = 0;
  for (size_t w = 0; st == MOE_OK && w < use; w += (size_t)B) {
    int b = use - w < (size_t)B ? (int)(use - w) : B;
    for (int i = 0; i < b; i++) {
      const int32_t *s = ids + (w + (size_t)i) * count / use * T; /* evenly spaced windows */
      memcpy(x + (size_t)i * T, s, (size_t)T * sizeof *x);
      memcpy(y + (size_t)i * T, s + 1, (size_t)T * sizeof *y);
    }
    moe_lm_stats ls;
    st = moe_lm_forward(m, x, y, b, T, &ls);
    sum += ls.ce * ls.tokens;
    tokens += ls.tokens;
  }
  free(x);
  free(y);
  if (st == MOE_OK) *loss = tokens ? sum / (double)tokens : 0;
  return st;
}
