/* libFuzzer target: trace CSV (moe_trace_load), experts inferred and given; a trace that loads is
 * also run through the cache simulator and the placement, which index its table. */
#include "fuzz_file.h"
#include "moe.h"

static void use(const moe_trace *t) {
  if (t->layers < 1 || t->experts < 1) return;
  int64_t acc, miss;
  for (int p = MOE_CACHE_LIFO; p <= MOE_CACHE_BELADY; p++) moe_cachesim(t, 0, 0, t->steps, (moe_cache_policy)p, 2, &acc, &miss);
  if (t->experts % 2) return;
  static int dev[MOE_TRACE_MAX_EXPERTS];
  double mx, avg;
  if (moe_placement_fit(t, 0, 0, t->steps, 2, MOE_PLACEMENT_ANTICORR, 0.5, dev) == MOE_OK)
    moe_placement_eval(t, 0, 0, t->steps, 2, dev, &mx, &avg, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  const char *path = fuzz_file(0, "trace.csv", data, n);
  const int experts[2] = {0, 8};
  for (int i = 0; i < 2; i++) {
    moe_trace t;
    if (moe_trace_load(&t, path, experts[i]) != MOE_OK) continue;
    use(&t);
    moe_trace_free(&t);
  }
  return 0;
}
