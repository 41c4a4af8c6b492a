/* Sampling the next token: greedy, or temperature with nucleus (top-p) truncation. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

typedef struct { float p; int32_t id; } cand;

static int by_prob(const void *a, const void *b) { /* most probable first, ties to the lower id */
  const cand *x = a, *y = b;
  return x->p != y->p ? (x->p < y->p ? 1 : -1) : (x->id > y->id) - (x->id < y->id);
}

moe_status moe_lm_sample(const float *logits, int V, float temperature, float top_p, uint64_t *rng,
                         int32_t *token) {
  MOE_TRY(logits && rng && token && V > 0, MOE_ERR_ARG, "moe_lm_sample: NULL argument or V < 1");
  MOE_TRY(temperature >= 0 && isfinite(temperature), MOE_ERR_ARG, "temperature must be >= 0, got %g",
          (double)temperature);
  MOE_TRY(top_p > 0 && top_p <= 1, MOE_ERR_ARG, "top_p must be in (0, 1], got %g", (double)top_p);
  int best = 0;
  for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
  if (temperature == 0) {
    *token = best;
    return MOE_OK;
  }
  cand *c = malloc((size_t)V * sizeof *c);
  MOE_TRY(c, MOE_ERR_NOMEM, "moe_lm_sample: out of memory for %d candidates", V);
  double sum = 0;
  for (int i = 0; i < V; i++) {
    c[i].id = i;
    c[i].p = expf((logits[i] - logits[best]) / temperature);
    sum += c[i].p;
  }
  qsort(c, (size_t)V, sizeof *c, by_prob);
  int n = 0;
  double mass = 0;
  while (n < V && (n == 0 || mass < top_p * sum)) mass += c[n++].p;
  double u = (double)(moe__splitmix(rng) >> 11) * 0x1.0p-53 * mass, acc = 0;
  int pick = n - 1;
  for (int i = 0; i < n; i++)
    if ((acc += c[i].p) > u) {
      pick = i;
      break;
    }
  *token = c[pick].id;
  free(c);
  return MOE_OK;
}
