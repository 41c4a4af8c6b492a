/* Random FlexMoE primitives for the property tests (test_flex_table.c, test_flex_route.c). */
#ifndef MOE_TEST_FLEX_OPS_H
#define MOE_TEST_FLEX_OPS_H

#include "flex/flex.h"

/* An Expand, Shrink or Migrate with random experts below E and ranks below W; often refused. */
static inline moe__flex_op flex_random_op(uint64_t *seed, int E, int W) {
  moe__flex_op op;
  op.kind = (moe__flex_kind)(moe__splitmix(seed) % 3);
  op.e = (int)(moe__splitmix(seed) % (uint64_t)E);
  op.g = (int)(moe__splitmix(seed) % (uint64_t)W);
  op.b = (int)(moe__splitmix(seed) % (uint64_t)E);
  op.h = (int)(moe__splitmix(seed) % (uint64_t)W);
  return op;
}

#endif
