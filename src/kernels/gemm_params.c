/* The small-GEMM kernels' blocking, from the CPU's caches (gemm.h; DESIGN 4.3b).
 *
 * Two blocks depend on the L2 cache (per core), both tuned on Zen 4/5 with 1 MiB:
 * - NN's block of the inner dimension: a 64-column panel of B of kc rows is read by every tile of
 *   rows and must stay in L2, at an eighth of it (512 rows, 128 KiB);
 * - NT's longest block of the inner dimension: the copy of A^T, up to 128 rows by kc_nt, is read
 *   against every tile of B's rows and stays in L2 with room for the streaming weights, at half of it
 *   (1024, 512 KiB); the scratch a thread holds grows with it.
 * Both scale with the L2: a 2 MiB L2 (Intel's Xeons since Sapphire Rapids) gives 1024 and 2048, so case
 * L's fc2 forward (K 3072) takes two blocks of 1536 where 1 MiB takes three of 1024, and the NN
 * panels of dx (K 3072) three of 1024 where it takes six. That is what the sizes suggest; it was not
 * measured (no such CPU here). The L2 is taken as a power of two rounded down (1.25 MiB of Ice Lake
 * as 1 MiB), at most 2 MiB (past that, nothing measured says longer blocks help, and the scratch
 * grows), at least 256 KiB; a size of 0 (unknown) or outside 128 KiB to 64 MiB (none that a core has)
 * counts as 1 MiB. The L1d drives nothing: the register tiles and NT's write-back group (24 KiB) were
 * sized for 32 KiB, the least of any CPU with AVX-512.
 * NN's block does not change the bits (the sums go on in order through C); NT's does: its products
 * over each block are added to C, so outputs may differ between CPUs of different L2 sizes, but on one
 * CPU never with the thread count or anything else. */
#include <pthread.h>

#include "base/cpu.h"
#include "kernels/gemm.h"

#define L2_DEFAULT (1ll << 20)

moe__gemm_params moe__gemm_params_for(const moe__cpu *c) {
  long long l2 = c ? c->l2 : 0, p = 1ll << 18;
  if (l2 < (1ll << 17) || l2 > (1ll << 26)) l2 = L2_DEFAULT;
  while (p * 2 <= l2 && p < (1ll << 21)) p *= 2;
  moe__gemm_params g = {(int)(p / 8 / (64 * 4)), (int)(p / 2 / (128 * 4)), p};
  return g;
}

static moe__gemm_params mine;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void find(void) { mine = moe__gemm_params_for(moe__cpu_get()); }

const moe__gemm_params *moe__gemm_params_get(void) {
  pthread_once(&once, find);
  return &mine;
}
