/* The trainers' data orders: a permutation per epoch that is a function of (seed, epoch) only, so a
 * resumed run visits the samples the uninterrupted one would have. */
#include "internal.h"

static uint64_t mix(uint64_t z) { return moe__splitmix(&z); } /* splitmix64's finalizer of z + its step */

void moe_train_shuffle(int32_t *perm, int n, uint64_t seed, int epoch) {
  for (int i = 0; i < n; i++) perm[i] = i;
  uint64_t s = mix(seed ^ mix((uint64_t)epoch + 0x51ED));
  for (int i = n - 1; i > 0; i--) { /* Fisher-Yates */
    s = mix(s);
    int j = (int)(s % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}
