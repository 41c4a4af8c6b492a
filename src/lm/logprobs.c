/* Log-probabilities of the next token under the model (moe.h): the softmax of the logits at
 * temperature 1, for the engine's and moe generate's logprobs and the checks against other
 * implementations. */
#include <math.h>

#include "internal.h"

moe_status moe_lm_logprobs(const float *logits, int V, int32_t token, int n, float *lp, int32_t *top_ids,
                           float *top_lp) {
  MOE_TRY(logits && lp && V > 0 && (n == 0 || (top_ids && top_lp)), MOE_ERR_ARG,
          "moe_lm_logprobs: NULL argument or V < 1");
  MOE_TRY(token >= 0 && token < V, MOE_ERR_ARG, "moe_lm_logprobs: token %d is not in [0, %d)", token, V);
  MOE_TRY(n >= 0 && n <= V, MOE_ERR_ARG, "moe_lm_logprobs: n must be in [0, V=%d], got %d", V, n);
  float mx = -INFINITY;
  for (int v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
  double sum = 0;
  for (int v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
  float lse = mx + (float)log(sum);
  *lp = logits[token] - lse;
  for (int j = 0; j < n; j++) { /* n passes of selection: n is small */
    int best = -1;
    for (int v = 0; v < V; v++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= top_ids[i] == v;
      if (!taken && (best < 0 || logits[v] > logits[best])) best = v;
    }
    top_ids[j] = best;
    top_lp[j] = logits[best] - lse;
  }
  return MOE_OK;
}
