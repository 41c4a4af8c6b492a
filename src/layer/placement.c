/* Capacity and placement (DESIGN 4.1): count assignments per expert, choose the capacity C from
 * capacity_setting, and place assignments slot-major (all slot-0 assignments, then slot 1, ...),
 * tokens in index order or, with priority=score, by their top probability (batch-prioritized
 * routing). Static dispatch drops what finds its expert full; dynamic dispatch keeps everything.
 * The result is a counting sort: each kept assignment gets a row in contiguous per-expert slices.
 * The tokens placed are the transport's view: this process's, or all ranks' (static, expert-parallel). */
#include <math.h>
#include <string.h>

#include "layer/stages.h"

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

static int capacity(const moe_layer_config *cfg, int T, int k, int maxc) {
  float x = cfg->capacity_setting;
  if (cfg->dispatch == MOE_DISPATCH_DYNAMIC || x == 0) return maxc;
  double v = (double)fabsf(x) * k * T / cfg->E, r = nearbyint(v);
  if (fabs(v - r) <= 1e-6 * fmax(1.0, r)) v = r; /* 1.2f * 5 / 2 is 3, as the decimal setting says */
  double c = ceil(v);
  if (c > T) c = T; /* no expert gets more than T assignments: more slots would only be padding */
  return x > 0 || c < maxc ? (int)c : maxc;
}

moe_status moe__place(const moe_layer_config *cfg, const int32_t *ecap, int ecap_tokens, const moe__view *view,
                      int32_t *fill, moe__arena *route, moe__plan *p) {
  const moe__view v = *view;
  int T = p->T, k = p->k, E = cfg->E;
  int maxc = 0;
  for (int e = 0; e < E; e++) maxc = v.counts[e] > maxc ? v.counts[e] : maxc;
  int is_static = cfg->dispatch == MOE_DISPATCH_STATIC, Tv = v.T, t0 = v.t0;
  int C = capacity(cfg, Tv, k, maxc);
  p->C = C;
  for (int e = 0; e < E; e++) { /* DynaMoE's per-expert capacities, scaled to this batch */
    int64_t c = C, T0 = ecap_tokens;
    if (ecap) c = T0 > 0 && T0 != Tv ? (int64_t)ceil((double)ecap[e] * Tv / T0 - 1e-9) : ecap[e];
    p->cap[e] = (int32_t)(c < Tv ? c : Tv);
  }

  int32_t *order = v.order;
  for (int t = 0; t < Tv; t++) order[t] = t;
  if (cfg->priority == MOE_PRIORITY_SCORE && Tv > 1) {
    prio_key *keys = moe__arena_alloc(route, (size_t)Tv * sizeof *keys);
    MOE_TRY(keys, MOE_ERR_STATE, "internal: routing workspace too small");
    for (int t = 0; t < Tv; t++) keys[t] = (prio_key){v.score[(size_t)t * v.stride], t};
    prio_sort(keys, Tv);
    for (int t = 0; t < Tv; t++) order[t] = keys[t].t;
  }

  memset(fill, 0, (size_t)E * 4);
  p->dropped = 0; /* over the view: with the gathered routing, every rank counts all drops */
  for (int j = 0; j < k; j++)
    for (int i = 0; i < Tv; i++) {
      int t = order[i];
      int e = v.top_e[(size_t)t * k + j], pos = fill[e]++;
      int drop = is_static && pos >= p->cap[e];
      p->dropped += drop;
      if (t < t0 || t >= t0 + T) continue; /* another rank's token */
      p->row[(size_t)(t - t0) * k + j] = drop ? -1 : pos;
    }
  p->offs[0] = 0;
  for (int e = 0; e < E; e++) {
    int Ce = p->cap[e];
    p->kept[e] = is_static && p->counts[e] > Ce ? Ce : p->counts[e];
    p->offs[e + 1] = p->offs[e] + (is_static ? Ce : p->kept[e]);
  }
  if (is_static && ecap) {
    p->C = 0;
    for (int e = 0; e < E; e++) p->C = p->cap[e] > p->C ? p->cap[e] : p->C;
  }
  /* the same on every rank (the view is global): all fail together, before any exchange */
  MOE_TRY((int64_t)p->offs[E] * cfg->D <= INT32_MAX / 2, MOE_ERR_ARG,
          "%d expert rows of %d values are too many for one batch (capacities too large?)", p->offs[E], cfg->D);
  p->rows = p->offs[E];
  for (size_t a = 0; a < (size_t)T * k; a++)
    if (p->row[a] >= 0) p->row[a] += p->offs[p->top_e[a]];
  return MOE_OK;
}
