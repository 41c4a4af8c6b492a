/* Expert-cache simulation (deployment paper VI, DIGEST P1 1.3 and 4.4-4.5). One layer's experts
 * live in slow memory; a cache holds K of them. Batch after batch (trace steps), the active experts
 * (tokens > 0) run in increasing id order, and each run is one access: a hit if the expert is cached,
 * else a miss that loads it. The access sequence is the same for every policy.
 *
 * On a miss with the cache full, LIFO / LRU / FIFO choose the victim in two rounds: first among the
 * cached experts not active in this batch, then among the active ones already computed; inside a
 * round LIFO evicts the most recently inserted, LRU the least recently used (hit or insert), FIFO
 * the oldest inserted, LFU the least used so far (ties: least recently), LFRU the lowest
 * frequency-recency score (moe.h). An expert active and not yet computed in this batch is never chosen while
 * another candidate exists. When every cached expert is such an expert (possible only when the
 * batch has more than K active experts), the cache has exactly K slots and one must go: the one
 * needed last in this batch (the highest id), which is then a miss again when its turn comes; this
 * is the "streaming through in id order" of DIGEST P1 4.4.
 *
 * BELADY is Belady's MIN over the same sequence: evict the cached expert whose next access is
 * farthest (never = infinitely far), ties to the lower id. MIN is optimal among policies that load
 * on every miss, which all of these are, so its miss count is a lower bound for the others. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *policy_names[] = {"lifo", "lru", "fifo", "belady", "lfu", "lfru"};
#define NPOLICIES ((int)(sizeof policy_names / sizeof *policy_names))

const char *moe_cache_policy_name(moe_cache_policy p) { return (unsigned)p < NPOLICIES ? policy_names[p] : "?"; }

moe_status moe_cache_policy_parse(const char *s, const char *field, moe_cache_policy *out) {
  int v;
  MOE_CHECK(moe__parse_name(s, field ? field : "policy", policy_names, NPOLICIES, &v));
  *out = (moe_cache_policy)v;
  return MOE_OK;
}

#define NEVER INT64_MAX

/* Per-expert state of the simulated cache. */
typedef struct {
  char cached;
  int64_t inserted, used; /* access index of the insertion / of the last access */
  int64_t next;           /* BELADY: index of the next access, NEVER if none */
  int64_t uses;           /* LFU: accesses so far, cached or not */
  double score;           /* LFRU: the decaying score at the last access (moe__lfru_score) */
} slot;

/* Whether x is a better victim than best under p (LIFO, LRU, FIFO, LFU, LFRU) at access index now. */
static int worse_kept(const slot *x, const slot *best, moe_cache_policy p, int64_t now, int E) {
  switch (p) {
    case MOE_CACHE_LIFO: return x->inserted > best->inserted;
    case MOE_CACHE_FIFO: return x->inserted < best->inserted;
    case MOE_CACHE_LFU: return x->uses < best->uses || (x->uses == best->uses && x->used < best->used);
    case MOE_CACHE_LFRU: return moe__lfru_score(x->score, now - x->used, E) < moe__lfru_score(best->score, now - best->used, E);
    default: return x->used < best->used;
  }
}

/* The victim for the online policies when expert e (active, being computed) misses at access now. */
static int pick_online(const slot *s, const int32_t *tok, int E, int e, moe_cache_policy p, int64_t now) {
  for (int round = 0; round < 2; round++) {
    int best = -1;
    for (int x = 0; x < E; x++) {
      if (!s[x].cached) continue;
      int active = tok[x] > 0;
      if (round == 0 ? active : (!active || x > e)) continue; /* round 1: active and computed (x < e) */
      if (best < 0) { best = x; continue; }
      if (worse_kept(&s[x], &s[best], p, now, E)) best = x;
    }
    if (best >= 0) return best;
  }
  for (int x = E - 1; x > e; x--) /* all cached experts still to run in this batch: the last one goes */
    if (s[x].cached) return x;
  return -1; /* unreachable when the cache is full and e is not in it */
}

/* The victim for BELADY: the cached expert whose next access is farthest, ties to the lower id. */
static int pick_min(const slot *s, int E) {
  int best = -1;
  for (int x = 0; x < E; x++)
    if (s[x].cached && (best < 0 || s[x].next > s[best].next)) best = x;
  return best;
}

moe_status moe_cachesim(const moe_trace *t, int layer, int64_t s0, int64_t s1, moe_cache_policy p, int K,
                        int64_t *accesses, int64_t *misses) {
  MOE_TRY(t && accesses && misses, MOE_ERR_ARG, "moe_cachesim: NULL argument");
  MOE_CHECK(moe__trace_check_range(t, layer, s0, s1, "moe_cachesim"));
  MOE_TRY((unsigned)p < NPOLICIES, MOE_ERR_ARG, "moe_cachesim: unknown policy %d", (int)p);
  MOE_TRY(K >= 1, MOE_ERR_ARG, "moe_cachesim: cache size must be >= 1, got %d", K);
  const int E = t->experts, L = t->layers;
  const int32_t *tok = t->tokens + (size_t)layer * E; /* step s at tok + s * L * E */
  slot *s = calloc((size_t)E, sizeof *s);
  MOE_TRY(s || E == 0, MOE_ERR_NOMEM, "moe_cachesim: out of memory");

  /* BELADY: the access sequence, and for each access the index of the same expert's next access. */
  int64_t n = 0, *next = NULL;
  if (p == MOE_CACHE_BELADY) {
    for (int64_t b = s0; b < s1; b++)
      for (int e = 0; e < E; e++) n += tok[(size_t)b * L * E + e] > 0;
    int64_t *last = malloc((size_t)E * sizeof *last);
    next = malloc((size_t)(n ? n : 1) * sizeof *next);
    if (!last || !next) {
      free(last), free(next), free(s);
      MOE_TRY(0, MOE_ERR_NOMEM, "moe_cachesim: out of memory for %lld accesses", (long long)n);
    }
    for (int e = 0; e < E; e++) last[e] = NEVER;
    int64_t i = n;
    for (int64_t b = s1 - 1; b >= s0; b--)
      for (int e = E - 1; e >= 0; e--)
        if (tok[(size_t)b * L * E + e] > 0) {
          next[--i] = last[e];
          last[e] = i;
        }
    free(last);
  }

  int64_t acc = 0, miss = 0;
  int used = 0;
  for (int64_t b = s0; b < s1; b++) {
    const int32_t *bt = tok + (size_t)b * L * E;
    for (int e = 0; e < E; e++) {
      if (bt[e] <= 0) continue;
      int64_t i = acc++;
      if (!s[e].cached) {
        miss++;
        if (used == K) {
          int v = p == MOE_CACHE_BELADY ? pick_min(s, E) : pick_online(s, bt, E, e, p, i);
          s[v].cached = 0;
          used--;
        }
        s[e].cached = 1;
        s[e].inserted = i;
        used++;
      }
      s[e].score = moe__lfru_score(s[e].score, i - s[e].used, E) + 1;
      s[e].uses++;
      s[e].used = i;
      if (next) s[e].next = next[i];
    }
  }
  free(next);
  free(s);
  *accesses = acc;
  *misses = miss;
  return MOE_OK;
}
