/* --memory-budget SIZE [--policy P] [--prefetch on|off] of moe generate, eval and serve (lm_budget.c):
 * the experts streamed from the checkpoint into caches of at most SIZE bytes (moe_lm_load_streaming),
 * and their stats as JSON. */
#ifndef MOE_CLI_LM_BUDGET_H
#define MOE_CLI_LM_BUDGET_H

#include <cjson/cJSON.h>

#include "moe.h"

typedef struct {
  moe_lm_stream_config s; /* s.budget 0: every expert resident (moe_lm_load) */
  int policy_set;         /* --policy given */
  const char *placement_trace, *pin_from; /* --placement-trace, --pin-from: read by lm_budget_load */
  int pin_set;            /* --pin given */
} lm_budget_opts;

#define LM_BUDGET_USAGE                                                                                    \
  "--memory-budget SIZE (bytes, or with K, M, G or T, powers of 1024): the dense weights resident, the\n" \
  "experts read from the checkpoint on demand into caches of at most SIZE bytes together (equal per MoE\n" \
  "layer), never read at load; reads drop their pages from the page cache. --policy lifo|lru|fifo|lfu|\n" \
  "lfru (default lru) evicts; --prefetch on|off (default on) reads the next layer's experts ahead, as its\n" \
  "router predicts them from this layer's hidden state. --page-cache keep leaves the file's pages to the\n" \
  "kernel's page cache (a second cache outside the budget, as mmap has). --placement miss-cost\n"          \
  "--placement-trace T.csv places the slots across the layers by each layer's misses simulated over the\n" \
  "trace (the policy's, with every slot count; the fewest bytes missed in all), instead of equally.\n"    \
  "--pin-from T.csv reads each layer's most used experts in the trace at load and never evicts them\n"    \
  "(--pin N per layer, default half the layer's slots; inside the budget). A trace: serve --trace or\n"  \
  "generate --trace of the same model. Outputs are those without a budget, bit for bit.\n"

void lm_budget_defaults(lm_budget_opts *o);
/* A message for flags given without what they need (the trace flags without --memory-budget, miss-cost
 * without --placement-trace and the other way round, --pin without --pin-from), or NULL. */
const char *lm_budget_misuse(const lm_budget_opts *o);
/* Whether f is one of the flags (then *ok says whether its value v parses). */
int lm_budget_flag(const char *f, const char *v, lm_budget_opts *o, int *ok);
/* A size: bytes, or a number with K, M, G, T (KiB ..., "B" or "iB" may follow); 0 on garbage. */
int cli_parse_size(const char *s, size_t *bytes);
/* moe_lm_load, or with a budget moe_lm_load_streaming into x (x zeroed otherwise), with the traces of
 * --placement-trace and --pin-from read for the load (c NULL: dir's config.json). */
moe_status lm_budget_load(moe_lm_t *m, const char *dir, const moe_lm_config *c, const lm_budget_opts *o,
                          moe_lm_experts *x);
/* The streamed experts' stats over `tokens` tokens (bytes per token) as a new JSON object: the budget, the
 * slots' bytes, the overall and per-layer hit rate, bytes read, stall seconds and the prefetch's
 * precision and recall. NULL without a budget. */
cJSON *lm_budget_json(const moe_lm_experts *x, const lm_budget_opts *o, int64_t tokens);

#endif
