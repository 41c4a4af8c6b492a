/* Tutel's adaptive r online (parallel_r = MOE_PARALLEL_AUTO, DIGEST P2 1.7): the dictionary of
 * adapt/setup_dict.c keyed by floor(capacity / 128), whose trials are the layer's own steps. The
 * dictionary's search asks for costs as it goes; here a cost not measured yet stops the search
 * (pending), the next MOE__AUTO_REPS steps run that r (the first builds the tasks' layer, the fastest
 * counts), and the search then starts again, the costs measured so far answered from the table, until
 * it completes and the dictionary remembers its choice. The replays are arithmetic only: the steps
 * run are MOE__AUTO_REPS per distinct r the search asks for. Only r varies in the layer (the sharded
 * layout runs one micro-batch; the all-to-all is the moe_dist's), so every (degree, algorithm) gets r's
 * cost and the dictionary's entry is its r with degree 1 and Linear. */
#include <string.h>

#include "shard.h"

static uint64_t slot(const moe__auto_r *a, uint64_t key, int r) { return key * (uint64_t)(a->dict.r_max + 1) + (uint64_t)r; }

/* The dictionary's cost of s at capacity c: r's fastest trial step, or pending (a->want = r). */
static moe_status measured(void *user, size_t c, const moe__setup *s, double *seconds) {
  moe__auto_r *a = user;
  uint64_t runs, v, k = slot(a, c / a->dict.window, s->r);
  if (moe__u64map_get(&a->runs, k, &runs) && runs >= MOE__AUTO_REPS && moe__u64map_get(&a->secs, k, &v)) {
    *seconds = moe__double_of_u64(v);
    return MOE_OK;
  }
  a->want = s->r;
  return moe__error(MOE_ERR_STATE, __FILE__, __LINE__, "r = %d not measured yet", s->r);
}

moe_status moe__auto_r_init(moe__auto_r *a, int W, int E) {
  memset(a, 0, sizeof *a);
  a->trial = a->want = -1;
  return moe__setup_dict_init(&a->dict, W, E, 1, 0, measured, a);
}

moe_status moe__auto_r_pick(moe__auto_r *a, size_t capacity, int *r) {
  moe__setup s;
  a->want = a->trial = -1;
  moe_status st = moe__setup_dict_get(&a->dict, capacity, &s);
  if (st == MOE_OK) {
    *r = s.r;
    return MOE_OK;
  }
  if (a->want < 0) return st; /* a real failure, not a cost still to measure */
  a->key = capacity / a->dict.window;
  *r = a->trial = a->want;
  return MOE_OK;
}

moe_status moe__auto_r_record(moe__auto_r *a, double seconds) {
  if (a->trial < 0) return MOE_OK;
  uint64_t k = slot(a, a->key, a->trial), runs;
  a->trial = -1;
  MOE_CHECK(moe__trial_record(&a->runs, &a->secs, k, seconds, &runs));
  a->measured += runs == 0;
  return MOE_OK;
}

void moe__auto_r_free(moe__auto_r *a) {
  moe__setup_dict_free(&a->dict);
  moe__u64map_free(&a->runs);
  moe__u64map_free(&a->secs);
}
