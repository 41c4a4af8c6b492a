/* The dictionary of a layer (pipe_model.h): Tutel's dictionary of setups (setup_dict.c) whose trials
 * are the layer's own steps. The dictionary's search asks for costs as it goes; a cost not measured yet
 * stops it (pending), the next MOE__AUTO_REPS steps run that setup, and the search then starts again,
 * the costs measured so far answered from the table. The replays are arithmetic only: the steps run are
 * MOE__AUTO_REPS per distinct setup the search asks for. */
#include <string.h>

#include "adapt/pipe_model.h"

/* The table's slot of setup s at key: (key, r, degree's index, algorithm). */
static uint64_t slot(const moe__auto_pipe *a, uint64_t key, const moe__setup *s) {
  int di = 0;
  while (di + 1 < a->dict.ndeg && a->dict.deg[di] != s->d) di++;
  uint64_t per_key = (uint64_t)(a->dict.r_max + 1) * MOE__SETUP_MAX_DEG * 2;
  return key * per_key + ((uint64_t)s->r * MOE__SETUP_MAX_DEG + (uint64_t)di) * 2 + (uint64_t)s->a;
}

/* The dictionary's cost of s at capacity c: its fastest trial step, or pending (a->want = s). */
static moe_status measured(void *user, size_t c, const moe__setup *s, double *seconds) {
  moe__auto_pipe *a = user;
  uint64_t runs, v, k = slot(a, c / a->dict.window, s);
  if (moe__u64map_get(&a->runs, k, &runs) && runs >= MOE__AUTO_REPS && moe__u64map_get(&a->secs, k, &v)) {
    *seconds = moe__double_of_u64(v);
    return MOE_OK;
  }
  a->want = *s;
  return moe__error(MOE_ERR_STATE, __FILE__, __LINE__, "setup (r %d, n %d) not measured yet", s->r, s->d);
}

moe_status moe__auto_pipe_init(moe__auto_pipe *a, int W, int E, int search_r, const int *deg, int ndeg,
                               const moe__a2a *algo, int nalgo) {
  memset(a, 0, sizeof *a);
  MOE_CHECK(moe__setup_dict_init(&a->dict, W, E, search_r, MOE__AUTO_ROWS, measured, a));
  moe_status st = moe__setup_dict_limit(&a->dict, deg, ndeg, algo, nalgo);
  if (st) moe__setup_dict_free(&a->dict);
  return st;
}

moe_status moe__auto_pipe_pick(moe__auto_pipe *a, size_t capacity, moe__setup *s) {
  a->want.d = 0;
  a->trial = 0;
  a->acc = 0;
  a->capacity = capacity;
  a->key = capacity / a->dict.window;
  moe_status st = moe__setup_dict_get(&a->dict, capacity, s);
  if (st != MOE_OK && !a->want.d) return st; /* a real failure, not a cost still to measure */
  if (st != MOE_OK) *s = a->want, a->trial = 1;
  a->now = *s;
  return MOE_OK;
}

moe_status moe__auto_pipe_record(moe__auto_pipe *a, double seconds) {
  if (!a->trial) return MOE_OK;
  uint64_t runs;
  a->trial = 0;
  MOE_CHECK(moe__trial_record(&a->runs, &a->secs, slot(a, a->key, &a->now), seconds, &runs));
  a->measured += runs == 0;
  return MOE_OK;
}

void moe__auto_pipe_free(moe__auto_pipe *a) {
  moe__setup_dict_free(&a->dict);
  moe__u64map_free(&a->runs);
  moe__u64map_free(&a->secs);
}
