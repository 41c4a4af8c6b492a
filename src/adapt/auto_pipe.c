/* The adaptive micro-batch count of a layer: MPipeMoE's Algorithm 1 (granularity.c) with its trial runs
 * taken online from the layer's steps (see pipe_model.h). */
#include <string.h>

#include "adapt/pipe_model.h"

static uint64_t slot(uint64_t key, int cand) { return key * MOE__GRAN_MAX_CAND + (uint64_t)cand; }

/* searchBestGran's cost of n at key B: the trials' fastest step (all ran before the search). */
static moe_status measured(void *user, size_t B, int n, double *seconds) {
  moe__auto_pipe *a = user;
  uint64_t v;
  for (int i = 0; i < a->gran.ncand; i++)
    if (a->gran.cand[i] == n && moe__u64map_get(&a->secs, slot(B, i), &v)) {
      *seconds = moe__double_of_u64(v);
      return MOE_OK;
    }
  return moe__error(MOE_ERR_STATE, __FILE__, __LINE__, "internal: no trial of n = %d at key %zu", n, B);
}

moe_status moe__auto_pipe_init(moe__auto_pipe *a, int max_n) {
  int cand[5], nc = 0;
  for (int n = 1; n <= MOE__AUTO_MAX_N && (n == 1 || n <= max_n); n *= 2) cand[nc++] = n;
  memset(a, 0, sizeof *a);
  a->trial = -1;
  return moe__gran_init(&a->gran, cand, nc, measured, a);
}

moe_status moe__auto_pipe_pick(moe__auto_pipe *a, size_t rows, int *n) {
  uint64_t key = rows / MOE__AUTO_ROWS, runs;
  a->trial = -1;
  a->acc = 0;
  if (moe__gran_known(&a->gran, key, n)) return MOE_OK;
  for (int i = 0; i < a->gran.ncand; i++)
    if (!moe__u64map_get(&a->runs, slot(key, i), &runs) || runs < MOE__AUTO_REPS) {
      a->key = key;
      a->trial = i;
      *n = a->gran.cand[i];
      return MOE_OK;
    }
  return moe__gran_get(&a->gran, key, n); /* every candidate tried: Algorithm 1 decides */
}

moe_status moe__auto_pipe_record(moe__auto_pipe *a, double seconds) {
  if (a->trial < 0) return MOE_OK;
  uint64_t s = slot(a->key, a->trial);
  a->trial = -1;
  return moe__trial_record(&a->runs, &a->secs, s, seconds, NULL);
}

void moe__auto_pipe_free(moe__auto_pipe *a) {
  moe__gran_free(&a->gran);
  moe__u64map_free(&a->runs);
  moe__u64map_free(&a->secs);
}
