/* RECOMPILE (see moe.h): a trigger thread fed with the most recent metrics, and adjustments that take
 * effect delta_launch + 1 iterations after the metrics they come from. The training loop never waits
 * for a trigger unless the trigger is still working on (or has not yet started) metrics whose
 * adjustment is due now: then it stalls, and the stall is counted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "base/worker.h"

#define MAX_RESULTS 64 /* adjustments decided and not yet due */

typedef struct {
  moe_adjustment a;
  int32_t *cap; /* (E) */
} result;

struct moe_recompile {
  int E, delta;
  moe_trigger_fn fn;
  void *user;
  moe__worker w;        /* the trigger thread; w.mu guards what follows */
  moe_metrics pending;  /* the newest metrics not yet seen by the trigger */
  int32_t *pending_counts, *seen_counts, *trig_cap;
  int has_pending;
  int64_t running;      /* iteration whose metrics the trigger is working on, or -1 */
  result res[MAX_RESULTS];
  int nres;
  moe_adjustment current; /* what begin() hands out */
  int32_t *current_cap;
  moe_recompile_stats stats;
};

static void *trigger_loop(void *arg) {
  moe_recompile *r = arg;
  pthread_mutex_lock(&r->w.mu);
  for (;;) {
    while (!r->has_pending && !r->w.stop) pthread_cond_wait(&r->w.cv, &r->w.mu);
    if (r->w.stop) break;
    moe_metrics m = r->pending; /* the most recent metrics: older ones were superseded */
    memcpy(r->seen_counts, r->pending_counts, sizeof(int32_t) * (size_t)r->E);
    m.counts = r->seen_counts;
    r->has_pending = 0;
    r->running = m.iter;
    int delta = r->delta;
    pthread_mutex_unlock(&r->w.mu);
    moe_adjustment a = {.capacity = r->trig_cap};
    memset(r->trig_cap, 0, sizeof(int32_t) * (size_t)r->E);
    int got = r->fn(&m, &a, r->user); /* while training goes on */
    pthread_mutex_lock(&r->w.mu);
    r->stats.triggers++;
    if (got && r->nres < MAX_RESULTS) {
      result *x = &r->res[r->nres++];
      int32_t *cap = x->cap;
      x->a = a;
      x->a.apply_at = m.iter + delta + 1;
      x->a.capacity = cap;
      if (a.set_capacity || a.set_placement) memcpy(cap, r->trig_cap, sizeof(int32_t) * (size_t)r->E);
    }
    r->running = -1;
    pthread_cond_broadcast(&r->w.cv);
  }
  pthread_mutex_unlock(&r->w.mu);
  return NULL;
}

moe_status moe_recompile_new(moe_recompile **out, int experts, int delta_launch, moe_trigger_fn fn, void *user) {
  MOE_TRY(out && fn, MOE_ERR_ARG, "moe_recompile_new: NULL argument");
  MOE_TRY(experts > 0 && delta_launch >= 0 && delta_launch < MAX_RESULTS - 1, MOE_ERR_ARG,
          "recompile: experts must be > 0 and delta_launch in [0, %d) (got %d, %d)", MAX_RESULTS - 1, experts,
          delta_launch);
  moe_recompile *r = calloc(1, sizeof *r);
  int32_t *buf = calloc((size_t)experts * (4 + MAX_RESULTS), sizeof *buf);
  if (!r || !buf) {
    free(r);
    free(buf);
    MOE_TRY(0, MOE_ERR_NOMEM, "recompile: out of memory");
  }
  r->E = experts;
  r->delta = delta_launch;
  r->fn = fn;
  r->user = user;
  r->running = -1;
  r->pending_counts = buf;
  r->seen_counts = buf + experts;
  r->trig_cap = buf + 2 * experts;
  r->current_cap = buf + 3 * experts;
  for (int i = 0; i < MAX_RESULTS; i++) r->res[i].cap = buf + (size_t)(4 + i) * experts;
  if (!moe__worker_start(&r->w, trigger_loop, r)) {
    free(buf);
    free(r);
    MOE_TRY(0, MOE_ERR_NOMEM, "recompile: cannot start the trigger thread");
  }
  *out = r;
  return MOE_OK;
}

void moe_recompile_free(moe_recompile *r) {
  if (!r) return;
  moe__worker_stop(&r->w);
  free(r->pending_counts);
  free(r);
}

moe_status moe_recompile_set_delta(moe_recompile *r, int delta_launch) {
  MOE_TRY(delta_launch >= 0 && delta_launch < MAX_RESULTS - 1, MOE_ERR_ARG,
          "recompile: delta_launch must be in [0, %d), got %d", MAX_RESULTS - 1, delta_launch);
  pthread_mutex_lock(&r->w.mu);
  r->delta = delta_launch;
  pthread_mutex_unlock(&r->w.mu);
  return MOE_OK;
}

moe_status moe_recompile_push(moe_recompile *r, const moe_metrics *m) {
  MOE_TRY(m && m->experts == r->E && m->counts, MOE_ERR_ARG, "recompile: metrics of %d experts, want %d",
          m ? m->experts : 0, r->E);
  pthread_mutex_lock(&r->w.mu);
  r->pending = *m;
  memcpy(r->pending_counts, m->counts, sizeof(int32_t) * (size_t)r->E);
  r->has_pending = 1;
  pthread_cond_broadcast(&r->w.cv);
  pthread_mutex_unlock(&r->w.mu);
  return MOE_OK;
}

moe_status moe_recompile_begin(moe_recompile *r, int64_t i, const moe_adjustment **adj, int *has) {
  pthread_mutex_lock(&r->w.mu);
  int64_t due = i - r->delta - 1; /* metrics of iterations <= due must have been seen by now */
  if ((r->running >= 0 && r->running <= due) || (r->has_pending && r->pending.iter <= due)) {
    double t0 = moe__now();
    r->stats.stalls++;
    while ((r->running >= 0 && r->running <= due) || (r->has_pending && r->pending.iter <= due))
      pthread_cond_wait(&r->w.cv, &r->w.mu);
    r->stats.stall_seconds += moe__now() - t0;
  }
  *has = 0;
  int64_t placed_at = -1; /* the newest placement due: each is whole, so it supersedes older ones */
  for (int k = 0; k < r->nres;) { /* every adjustment due by now, oldest first, merged */
    result *x = &r->res[k];
    if (x->a.apply_at > i) {
      k++;
      continue;
    }
    if (!*has) r->current = (moe_adjustment){.capacity = r->current_cap};
    *has = 1;
    r->current.apply_at = i;
    if (x->a.set_capacity) {
      r->current.set_capacity = 1;
      memcpy(r->current_cap, x->cap, sizeof(int32_t) * (size_t)r->E);
    }
    if (x->a.set_placement && x->a.apply_at > placed_at) {
      placed_at = x->a.apply_at;
      r->current.set_placement = 1;
      memcpy(r->current_cap, x->cap, sizeof(int32_t) * (size_t)r->E);
    }
    if (x->a.set_caching) r->current.set_caching = 1, r->current.caching = x->a.caching;
    if (x->a.set_top_k) r->current.set_top_k = 1, r->current.top_k = x->a.top_k;
    r->stats.adjustments++;
    int32_t *cap = x->cap; /* keep the buffers with their slots */
    r->res[k] = r->res[--r->nres];
    r->res[r->nres].cap = cap;
  }
  *adj = *has ? &r->current : NULL;
  pthread_mutex_unlock(&r->w.mu);
  return MOE_OK;
}

void moe_recompile_get_stats(const moe_recompile *r, moe_recompile_stats *out) {
  pthread_mutex_lock((pthread_mutex_t *)&r->w.mu);
  *out = r->stats;
  pthread_mutex_unlock((pthread_mutex_t *)&r->w.mu);
}

int moe_dynamic_capacity(const int32_t *need, const int32_t *cur, int E, float headroom, int32_t *out) {
  int due = 0;
  for (int e = 0; e < E; e++)
    due |= need[e] > cur[e] || (double)cur[e] > (double)need[e] * (1.0 + 2.0 * headroom) + 1.0;
  for (int e = 0; e < E; e++) {
    int32_t c = (int32_t)ceil((double)need[e] * (1.0 + (double)headroom) - 1e-6); /* 10 * 1.1 is 11 */
    out[e] = due ? (c < 1 ? 1 : c) : cur[e];
  }
  return due;
}
