/* Locality-first token routing (P3 Algorithm 3 with DIGEST P3 4.1's erratum): each rank's tokens of
 * an expert stay on its own replicas up to their capacity, the rest go to the other replicas in
 * proportion to their spare capacity. Integer throughout, so every rank computes the same counts from
 * the same all-gathered Isrc and the send and receive sides agree. */
#include "flex/flex.h"

/* total apportioned over n parts in proportion to w (sum w > 0) by largest remainder: each part gets
 * floor(total w_i / sum w), the parts left over go to the largest remainders, ties to the lower index.
 * total * w_i must fit int64 (the caller keeps both below 2^31). */
static void apportion(int64_t total, const int64_t *w, int n, int64_t *out) {
  int64_t sw = 0, given = 0, rem[MOE__FLEX_MAX_RANKS];
  for (int i = 0; i < n; i++) sw += w[i];
  for (int i = 0; i < n; i++) {
    out[i] = total * w[i] / sw;
    rem[i] = total * w[i] % sw;
    given += out[i];
  }
  for (; given < total; given++) {
    int best = -1;
    for (int i = 0; i < n; i++)
      if (rem[i] >= 0 && (best < 0 || rem[i] > rem[best])) best = i;
    out[best]++;
    rem[best] = -1; /* each part gets at most one of the leftovers */
  }
}

moe_status moe__flex_route(const moe__flex_table *t, const int64_t *Isrc, int64_t *r) {
  int W = t->W, E = t->E;
  for (int e = 0; e < E; e++) {
    int64_t Ie = 0, n[MOE__FLEX_MAX_RANKS], C[MOE__FLEX_MAX_RANKS], spare[MOE__FLEX_MAX_RANKS];
    for (int g = 0; g < W; g++) {
      int64_t x = Isrc[(size_t)g * E + e];
      MOE_TRY(x >= 0, MOE_ERR_VALUE, "flex route: rank %d has %lld tokens for expert %d", g, (long long)x, e);
      Ie += x;
      MOE_TRY(Ie <= INT32_MAX, MOE_ERR_VALUE, "flex route: expert %d has more than %d tokens", e, INT32_MAX);
      n[g] = moe__flex_count(t, e, g);
    }
    MOE_TRY(moe__flex_replicas(t, e) > 0, MOE_ERR_STATE, "flex route: expert %d has no replica", e);
    apportion(Ie, n, W, C);
    for (int h = 0; h < W; h++) {
      int64_t x = Isrc[(size_t)h * E + e];
      spare[h] = C[h] > x ? C[h] - x : 0;
    }
    for (int g = 0; g < W; g++) {
      int64_t x = Isrc[(size_t)g * E + e], keep = x < C[g] ? x : C[g];
      int64_t *row = r + ((size_t)g * E + e) * (size_t)W;
      if (x > keep) /* sum C = I_e, so the spare capacity (sum of the excesses) >= x - keep > 0 */
        apportion(x - keep, spare, W, row);
      else
        for (int h = 0; h < W; h++) row[h] = 0;
      row[g] = keep; /* spare[g] = 0: nothing of its own excess came back to g */
    }
  }
  return MOE_OK;
}
