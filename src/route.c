/* Capacity and placement (DESIGN 4.1): count assignments per expert, choose the capacity C from
 * capacity_setting, and place assignments slot-major (all slot-0 assignments, then slot 1, ...),
 * tokens in index order or, with priority=score, by their top probability (batch-prioritized
 * routing). Static dispatch drops what finds its expert full; dynamic dispatch keeps everything.
 * The result is a counting sort: each kept assignment gets a row in contiguous per-expert slices. */
#include <math.h>
#include <string.h>

#include "layer_internal.h"

typedef struct { float p; int32_t t; } prio_key;

/* Priority order: highest top probability first, ties to the lower token. A total order, so
 * an unstable in-place sort gives the same result as a stable one; heapsort allocates nothing
 * (glibc's qsort may malloc). */
static int prio_before(prio_key a, prio_key b) { return a.p != b.p ? a.p > b.p : a.t < b.t; }

static void sift_down(prio_key *k, int i, int n) {
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n) return;
    if (c + 1 < n && prio_before(k[c], k[c + 1])) c++; /* the child that sorts later */
    if (!prio_before(k[i], k[c])) return;
    prio_key t = k[i]; k[i] = k[c]; k[c] = t;
    i = c;
  }
}

static void prio_sort(prio_key *k, int n) {
  for (int i = n / 2 - 1; i >= 0; i--) sift_down(k, i, n);
  for (int e = n - 1; e > 0; e--) {
    prio_key t = k[0]; k[0] = k[e]; k[e] = t;
    sift_down(k, 0, e);
  }
}

static int capacity(const moe_layer_t *l, int T, int k, int maxc) {
  float x = l->cfg.capacity_setting;
  if (l->cfg.dispatch == MOE_DISPATCH_DYNAMIC || x == 0) return maxc;
  double v = (double)fabsf(x) * k * T / l->cfg.E, r = nearbyint(v);
  if (fabs(v - r) <= 1e-6 * fmax(1.0, r)) v = r; /* 1.2f * 5 / 2 is 3, as the decimal setting says */
  double c = ceil(v);
  if (c > T) c = T; /* no expert gets more than T assignments: more slots would only be padding */
  return x > 0 || c < maxc ? (int)c : maxc;
}

moe_status moe__route(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  int T = s->T, k = s->k, E = l->cfg.E;
  memset(s->counts, 0, (size_t)E * 4);
  for (size_t i = 0; i < (size_t)T * k; i++) s->counts[s->top_e[i]]++;
  const int32_t *cnt = s->counts;
  if (l->cfg.dist) { /* expert-parallel: the counts (and the stats) are over all ranks */
    double *g = moe__arena_alloc(&s->route, (size_t)E * sizeof *g);
    s->gcounts = moe__arena_alloc(&s->route, (size_t)E * 4);
    MOE_TRY(g && s->gcounts, MOE_ERR_STATE, "internal: routing workspace too small");
    for (int e = 0; e < E; e++) g[e] = s->counts[e];
    MOE_CHECK(moe_dist_allreduce(l->cfg.dist, g, E));
    for (int e = 0; e < E; e++) s->gcounts[e] = (int32_t)g[e];
    cnt = s->gcounts;
  }
  int maxc = 0;
  for (int e = 0; e < E; e++) maxc = cnt[e] > maxc ? cnt[e] : maxc;
  int is_static = l->cfg.dispatch == MOE_DISPATCH_STATIC;

  /* The placement runs over a view of the tokens: this process's, or, static and expert-parallel,
   * every rank's (the routing of all tokens gathered, so that positions and drops are those of one
   * process); tokens [t0, t0 + T) of the view are this rank's. */
  int Tv = T, t0 = 0;
  const int32_t *te = s->top_e;
  const float *tp = s->top_p;
  int tp_stride = k;
  int32_t *order = s->order;
  if (is_static && l->cfg.dist) {
    Tv = s->Tgi;
    t0 = s->t0;
    int with_p = l->cfg.priority == MOE_PRIORITY_SCORE; /* the scores only where they order the tokens */
    double *g = moe__arena_alloc(&s->route, (size_t)Tv * (k + 1) * sizeof *g);
    int32_t *gte = moe__arena_alloc(&s->route, (size_t)Tv * k * 4);
    float *gtp = moe__arena_alloc(&s->route, (size_t)Tv * 4);
    order = moe__arena_alloc(&s->route, (size_t)Tv * 4);
    MOE_TRY((g && gte && gtp && order) || Tv == 0, MOE_ERR_STATE, "internal: routing workspace too small");
    memset(g, 0, (size_t)Tv * (k + with_p) * sizeof *g);
    for (size_t a = 0; a < (size_t)T * k; a++) g[(size_t)t0 * k + a] = s->top_e[a];
    for (int t = 0; t < T && with_p; t++) g[(size_t)Tv * k + t0 + t] = s->top_p[(size_t)t * k];
    MOE_CHECK(moe_dist_allreduce(l->cfg.dist, g, Tv * (k + with_p)));
    for (size_t a = 0; a < (size_t)Tv * k; a++) gte[a] = (int32_t)g[a];
    for (int t = 0; t < Tv && with_p; t++) gtp[t] = (float)g[(size_t)Tv * k + t];
    te = gte;
    tp = gtp;
    tp_stride = 1;
  }
  int C = capacity(l, Tv, k, maxc);
  s->C = C;
  for (int e = 0; e < E; e++) { /* DynaMoE's per-expert capacities, scaled to this batch */
    int64_t c = C, T0 = l->expert_capacity_tokens;
    if (l->expert_capacity)
      c = T0 > 0 && T0 != Tv ? (int64_t)ceil((double)l->expert_capacity[e] * Tv / T0 - 1e-9) : l->expert_capacity[e];
    s->cap[e] = (int32_t)(c < Tv ? c : Tv);
  }

  for (int t = 0; t < Tv; t++) order[t] = t;
  if (l->cfg.priority == MOE_PRIORITY_SCORE && Tv > 1) {
    prio_key *keys = moe__arena_alloc(&s->route, (size_t)Tv * sizeof *keys);
    MOE_TRY(keys, MOE_ERR_STATE, "internal: routing workspace too small");
    for (int t = 0; t < Tv; t++) keys[t] = (prio_key){tp[(size_t)t * tp_stride], t};
    prio_sort(keys, Tv);
    for (int t = 0; t < Tv; t++) order[t] = keys[t].t;
  }

  memset(s->fill, 0, (size_t)E * 4);
  s->dropped = 0; /* over the view: with the gathered routing, every rank counts all drops */
  for (int j = 0; j < k; j++)
    for (int i = 0; i < Tv; i++) {
      int t = order[i];
      int e = te[(size_t)t * k + j], pos = s->fill[e]++;
      int drop = is_static && pos >= s->cap[e];
      s->dropped += drop;
      if (t < t0 || t >= t0 + T) continue; /* another rank's token */
      s->row[(size_t)(t - t0) * k + j] = drop ? -1 : pos;
    }
  s->offs[0] = 0;
  for (int e = 0; e < E; e++) {
    int Ce = s->cap[e];
    s->kept[e] = is_static && s->counts[e] > Ce ? Ce : s->counts[e];
    s->offs[e + 1] = s->offs[e] + (is_static ? Ce : s->kept[e]);
  }
  if (is_static && l->expert_capacity) {
    s->C = 0;
    for (int e = 0; e < E; e++) s->C = s->cap[e] > s->C ? s->cap[e] : s->C;
  }
  /* the same on every rank (the view is global): all fail together, before any exchange */
  MOE_TRY((int64_t)s->offs[E] * l->cfg.D <= INT32_MAX / 2, MOE_ERR_ARG,
          "%d expert rows of %d values are too many for one batch (capacities too large?)", s->offs[E], l->cfg.D);
  s->rows = s->offs[E];
  for (size_t a = 0; a < (size_t)T * k; a++)
    if (s->row[a] >= 0) s->row[a] += s->offs[s->top_e[a]];
  return MOE_OK;
}
