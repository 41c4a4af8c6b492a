/* FlexMoE's locality-first routing (P3 Algorithm 3 with the erratum): hand-computed cases, and on
 * random tables and loads exact conservation, locality, the proportionality bound and equality with a
 * brute-force reference. */
#include <stdint.h>
#include <stdlib.h>

#include "flex/flex.h"
#include "flex_ops.h"
#include "test.h"

#define R(r, W, E, g, e, h) (r)[((size_t)(g) * (E) + (e)) * (W) + (h)]

/* A table with n0[g] replicas of expert 0 on rank g, its other slots cycling through experts 1 .. E-1. */
static moe_status table_with(moe__flex_table *t, int W, int Ev, int E, const int *n0) {
  MOE_CHECK(moe__flex_table_init(t, W, Ev, E, 1));
  int k = 0;
  for (int g = 0; g < W; g++)
    for (int s = 0; s < Ev; s++) t->slot[g * Ev + s] = s < n0[g] ? 0 : 1 + k++ % (E - 1);
  for (int e = 0; e < E; e++)
    for (int g = 0; g < W; g++) {
      int c = 0;
      for (int s = 0; s < Ev; s++) c += t->slot[g * Ev + s] == e;
      t->n[(size_t)e * W + g] = c;
    }
  return moe__flex_table_check(t);
}

TEST(flex_route_by_hand) {
  moe__flex_table t;
  int64_t r[3 * 3 * 3];
  /* Expert 0 on both of 2 ranks, 10 tokens on rank 0 and 2 on rank 1: capacities 6 and 6; rank 0 keeps
   * 6 and sends its 4 extra to rank 1's 4 spare. */
  ASSERT_OK(moe__flex_table_init(&t, 2, 1, 1, 1));
  const int64_t I1[2] = {10, 2};
  ASSERT_OK(moe__flex_route(&t, I1, r));
  const int64_t want1[4] = {6, 4, 0, 2};
  for (int i = 0; i < 4; i++) ASSERT_EQ_INT(r[i], want1[i]);
  moe__flex_table_free(&t);
  /* Replicas 2, 1, 1 of expert 0 on 3 ranks, loads 6, 1, 0: capacities of 7 tokens by 2:1:1 are 3.5,
   * 1.75, 1.75 -> floors 3 1 1 and the two leftovers to the largest remainders (ranks 1, 2): 3 2 2.
   * Spare: 0, 1, 2; rank 0's 3 extra go 1 and 2. */
  const int n0[3] = {2, 1, 1};
  ASSERT_OK(table_with(&t, 3, 2, 3, n0));
  int64_t I2[3 * 3] = {0};
  I2[0 * 3] = 6, I2[1 * 3] = 1;
  ASSERT_OK(moe__flex_route(&t, I2, r));
  ASSERT_EQ_INT(R(r, 3, 3, 0, 0, 0), 3);
  ASSERT_EQ_INT(R(r, 3, 3, 0, 0, 1), 1);
  ASSERT_EQ_INT(R(r, 3, 3, 0, 0, 2), 2);
  ASSERT_EQ_INT(R(r, 3, 3, 1, 0, 1), 1);
  ASSERT_EQ_INT(R(r, 3, 3, 1, 0, 0) + R(r, 3, 3, 1, 0, 2), 0);
  moe__flex_table_free(&t);
  /* Rounding: 4 ranks each with one replica, loads 3 3 0 0: capacities 2 2 1 1 (leftovers to the lower
   * ranks); ranks 0 and 1 each send 1 token to spare 0 0 1 1, a tie that goes to rank 2 both times: rank
   * 2 computes 2 tokens for a capacity of 1 (a source's share is off by less than one token). */
  ASSERT_OK(moe__flex_table_init(&t, 4, 1, 1, 1));
  const int64_t I3[4] = {3, 3, 0, 0};
  int64_t r3[16];
  ASSERT_OK(moe__flex_route(&t, I3, r3));
  const int64_t want3[16] = {2, 0, 1, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 16; i++)
    if (r3[i] != want3[i]) FAIL_("r[%d][%d] = %lld, want %lld", i / 4, i % 4, (long long)r3[i], (long long)want3[i]);
  const int64_t bad[4] = {3, -1, 0, 0};
  ASSERT_STATUS(moe__flex_route(&t, bad, r3), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "rank 1 has -1 tokens for expert 0"));
  moe__flex_table_free(&t);
}

/* ---- the brute-force reference ---- */

/* The integer vector v (n parts, sum total) closest to the quotas total w_i / sum w in squared distance,
 * ties to the lexicographically largest (lower indices first), by enumerating every such vector. This
 * is what largest remainder computes, found without computing remainders. */
static void bf_apportion(int64_t total, const int64_t *w, int n, int64_t *out) {
  int64_t sw = 0, v[8] = {0}, best = -1;
  for (int i = 0; i < n; i++) sw += w[i];
  for (;;) {
    int64_t sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    if (sum == total) {
      int64_t d = 0; /* sum (v_i sw - total w_i)^2: the squared distance times sw^2, exact */
      for (int i = 0; i < n; i++) d += (v[i] * sw - total * w[i]) * (v[i] * sw - total * w[i]);
      int take = best < 0 || d < best;
      if (!take && d == best) /* lexicographically larger than the kept one? */
        for (int i = 0; i < n && !take; i++) {
          if (v[i] != out[i]) {
            take = v[i] > out[i];
            break;
          }
        }
      if (take) {
        best = d;
        for (int i = 0; i < n; i++) out[i] = v[i];
      }
    }
    int i = 0; /* next vector in [0, total]^n */
    while (i < n && v[i] == total) v[i++] = 0;
    if (i == n) break;
    v[i]++;
  }
}

static void bf_route(const moe__flex_table *t, const int64_t *Isrc, int64_t *r) {
  int W = t->W, E = t->E;
  for (int e = 0; e < E; e++) {
    int64_t Ie = 0, n[8], C[8], spare[8];
    for (int g = 0; g < W; g++) Ie += Isrc[g * E + e], n[g] = moe__flex_count(t, e, g);
    bf_apportion(Ie, n, W, C);
    for (int h = 0; h < W; h++) spare[h] = C[h] > Isrc[h * E + e] ? C[h] - Isrc[h * E + e] : 0;
    for (int g = 0; g < W; g++) {
      int64_t x = Isrc[g * E + e], keep = x < C[g] ? x : C[g], *row = &R(r, W, E, g, e, 0);
      if (x > keep)
        bf_apportion(x - keep, spare, W, row);
      else
        for (int h = 0; h < W; h++) row[h] = 0;
      row[g] = keep;
    }
  }
}

TEST(flex_route_random_loads) {
  /* Random tables (random primitives from the initial placement) and loads on 2 and 3 ranks: the
   * routing conserves every (rank, expert) count exactly, keeps tokens local while the local replicas
   * have room, sends no source's share more than a token off its quota, and equals the reference. */
  uint64_t seed = 3;
  moe__flex_xfers x = {0};
  int cases = 0, moved = 0;
  for (int it = 0; it < 300; it++) {
    int W = 2 + (int)(moe__splitmix(&seed) % 2), E = 1 + (int)(moe__splitmix(&seed) % 3), Ev = 2;
    moe__flex_table t;
    ASSERT_OK(moe__flex_table_init(&t, W, Ev, E, 1));
    for (int k = 0; k < 20; k++) {
      moe__flex_op op = flex_random_op(&seed, E, W);
      (void)moe__flex_apply(&t, &op, &x); /* refused ops leave the table as it was */
    }
    int64_t I[3 * 3], r[3 * 3 * 3], ref[3 * 3 * 3];
    for (int i = 0; i < W * E; i++) I[i] = (int64_t)(moe__splitmix(&seed) % 8);
    ASSERT_OK(moe__flex_route(&t, I, r));
    bf_route(&t, I, ref);
    for (int i = 0; i < W * E * W; i++)
      if (r[i] != ref[i]) FAIL_("case %d: r[%d] = %lld, reference %lld", it, i, (long long)r[i], (long long)ref[i]);
    for (int e = 0; e < E; e++) {
      int64_t Ie = 0, C[3], n[3], spare[3], S = 0;
      for (int g = 0; g < W; g++) Ie += I[g * E + e], n[g] = moe__flex_count(&t, e, g);
      bf_apportion(Ie, n, W, C);
      for (int h = 0; h < W; h++) S += spare[h] = C[h] > I[h * E + e] ? C[h] - I[h * E + e] : 0;
      for (int g = 0; g < W; g++) {
        int64_t sum = 0, x0 = I[g * E + e], local = R(r, W, E, g, e, g);
        for (int h = 0; h < W; h++) sum += R(r, W, E, g, e, h);
        if (sum != x0) FAIL_("case %d: rank %d expert %d: %lld tokens routed of %lld", it, g, e, (long long)sum,
                             (long long)x0);
        /* Locality: nothing leaves g while g's capacity has room; what leaves is exactly the excess. */
        if (local != (x0 < C[g] ? x0 : C[g])) FAIL_("case %d: rank %d keeps %lld of %lld (capacity %lld)", it, g,
                                                    (long long)local, (long long)x0, (long long)C[g]);
        for (int h = 0; h < W; h++) {
          if (h == g) continue;
          double quota = S ? (double)(x0 - local) * (double)spare[h] / (double)S : 0;
          if (fabs((double)R(r, W, E, g, e, h) - quota) >= 1)
            FAIL_("case %d: rank %d expert %d sends %lld to rank %d, quota %g", it, g, e,
                  (long long)R(r, W, E, g, e, h), h, quota);
          moved += R(r, W, E, g, e, h) > 0;
        }
      }
    }
    cases++;
    moe__flex_table_free(&t);
  }
  ASSERT_EQ_INT(cases, 300);
  if (moved < 100) FAIL_("only %d (source, expert, destination) triples moved tokens: cases too easy", moved);
  moe__flex_xfers_free(&x);
}
