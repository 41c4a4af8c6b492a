/* Serving analysis from expert traces: the strict trace reader (errors with line numbers), the
 * expert-cache simulator (eviction order of LIFO / LRU / FIFO on hand-made traces, Belady's MIN
 * against hand counts and a brute-force optimum), expert placement (greedy and anti-correlation on
 * hand-computed examples, Max Load / Avg Max Load), and the `moe cachesim` / `moe placement`
 * commands' output and exit codes. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "internal.h"
#include "run_cli.h"
#include "test.h"

/* ---- helpers ---- */

/* A one-layer trace over E experts from "1 2 3|2|0|3": batches separated by '|', each the active
 * experts (one token each). */
static void trace_sets(moe_trace *t, int E, const char *spec) {
  int steps = 1;
  for (const char *p = spec; *p; p++) steps += *p == '|';
  t->steps = steps, t->layers = 1, t->experts = E;
  t->tokens = calloc((size_t)steps * E, sizeof *t->tokens);
  int b = 0;
  for (const char *p = spec; *p;) {
    if (*p == '|') { b++, p++; continue; }
    if (*p == ' ') { p++; continue; }
    char *end;
    long e = strtol(p, &end, 10);
    t->tokens[(size_t)b * E + e] = 1;
    p = end;
  }
}

/* A trace over (steps, layers, E) from a dense table (copied). */
static void trace_table(moe_trace *t, int64_t steps, int layers, int E, const int32_t *tok) {
  t->steps = steps, t->layers = layers, t->experts = E;
  t->tokens = malloc((size_t)steps * layers * E * sizeof *t->tokens);
  memcpy(t->tokens, tok, (size_t)steps * layers * E * sizeof *t->tokens);
}

static int64_t misses_of(const moe_trace *t, moe_cache_policy p, int K) {
  int64_t a, m;
  if (moe_cachesim(t, 0, 0, t->steps, p, K, &a, &m) != MOE_OK) return -1;
  return m;
}

static const char *write_text(const char *name, const char *text, char *buf, size_t n) {
  test_tmp_path(name, buf, n);
  FILE *f = fopen(buf, "w");
  fputs(text, f);
  fclose(f);
  return buf;
}

static char out_text[8192], err_text[4096];

/* Runs `moe <args>`; stdout in out_text, stderr in err_text; returns the exit status. */
static int serve_moe(const char *args) {
  char o[512];
  test_tmp_path("serve_stdout.txt", o, sizeof o);
  int rc = run_moe(NULL, args, o, err_text, sizeof err_text);
  test_read_text(o, out_text, sizeof out_text);
  return rc;
}

/* ---- trace reader ---- */

TEST(serve_trace_load) {
  char p[512];
  moe_trace t;
  write_text("ok.csv", "step,layer,expert,tokens\n0,0,1,5\n0,1,2,7\r\n2,0,0,3\n", p, sizeof p);
  ASSERT_OK(moe_trace_load(&t, p, 0));
  ASSERT_EQ_INT(t.steps, 3);
  ASSERT_EQ_INT(t.layers, 2);
  ASSERT_EQ_INT(t.experts, 3);
  ASSERT_EQ_INT(t.tokens[(0 * 2 + 0) * 3 + 1], 5);
  ASSERT_EQ_INT(t.tokens[(0 * 2 + 1) * 3 + 2], 7);
  ASSERT_EQ_INT(t.tokens[(2 * 2 + 0) * 3 + 0], 3);
  int64_t sum = 0;
  for (int i = 0; i < 3 * 2 * 3; i++) sum += t.tokens[i];
  ASSERT_EQ_INT(sum, 15); /* everything else is 0, step 1 included */
  moe_trace_free(&t);
  ASSERT_OK(moe_trace_load(&t, p, 8)); /* the caller's expert count wins */
  ASSERT_EQ_INT(t.experts, 8);
  ASSERT_EQ_INT(t.tokens[(2 * 2 + 0) * 8 + 0], 3);
  moe_trace_free(&t);
  write_text("empty.csv", "step,layer,expert,tokens\n", p, sizeof p);
  ASSERT_OK(moe_trace_load(&t, p, 4)); /* header only: valid and empty */
  ASSERT_EQ_INT(t.steps, 0);
  ASSERT_EQ_INT(t.layers, 0);
  ASSERT_EQ_INT(t.experts, 4);
  moe_trace_free(&t);
}

/* Each malformed trace fails with MOE_ERR_FORMAT and a message naming the line and the problem. */
TEST(serve_trace_load_errors) {
  static const struct { const char *text; int experts; const char *line, *what; } cases[] = {
      {"step,layer,expert,count\n0,0,0,1\n", 0, "line 1:", "header"},
      {"", 0, "line 1:", "empty file"},
      {"step,layer,expert,tokens\n0,0,0,1\n0,0,1\n", 0, "line 3:", "expected 4 fields"},
      {"step,layer,expert,tokens\n0,0,0,1,9\n", 0, "line 2:", "got 5"},
      {"step,layer,expert,tokens\n0,0,x,1\n", 0, "line 2:", "'expert' is not a non-negative integer"},
      {"step,layer,expert,tokens\n0,0,1,2\n1,0,1, 3\n", 0, "line 3:", "not a non-negative integer"},
      {"step,layer,expert,tokens\n0,0,0,1\n0,0,1,1\n1,0,1,-3\n", 0, "line 4:", "negative count"},
      {"step,layer,expert,tokens\n0,-1,0,1\n", 0, "line 2:", "negative layer"},
      {"step,layer,expert,tokens\n0,0,1,0\n", 0, "line 2:", "tokens must be > 0"},
      {"step,layer,expert,tokens\n0,0,3,1\n0,0,4,1\n", 4, "line 3:", "unknown expert 4"},
      {"step,layer,expert,tokens\n0,0,1,1\n0,0,2,1\n1,0,1,1\n0,0,1,5\n", 0, "line 5:", "duplicate row"},
      {"step,layer,expert,tokens\n0,0,0,1\n\n1,0,0,1\n", 0, "line 3:", "empty line"},
      {"step,layer,expert,tokens\n0,0,0,99999999999\n", 0, "line 2:", "out of range"},
      /* issue 21: ids at their types' maxima (signed overflow, a segfault) and far-apart ids in a few
       * rows (gigabytes of zeros) */
      {"step,layer,expert,tokens\n9223372036854775807,0,0,1\n0,1,0,1\n", 0, "line 2:",
       "step 9223372036854775807 out of range (at most 2147483647)"},
      {"step,layer,expert,tokens\n0,2147483647,0,1\n", 0, "line 2:", "layer 2147483647 out of range (at most 4095)"},
      {"step,layer,expert,tokens\n0,0,0,57\n0,1,2147483647,1\n1,0,0,1\n", 0, "line 3:",
       "expert 2147483647 out of range (at most 65535)"},
      {"step,layer,expert,tokens\n0,0,0,9\n12,2000000,5,17\n", 0, "line 3:", "layer 2000000 out of range"},
      {"step,layer,expert,tokens\n2147483647,0,0,1\n", 0, "largest step 2147483647 at line 2",
       "too large for its 1 rows: 2147483648 steps x 1 layers x 1 experts is 2147483648 cells, more than 4194304"},
      {"step,layer,expert,tokens\n0,0,0,1\n0,4095,65535,1\n", 0, "layer 4095 at line 3, expert 65535 at line 3",
       "1 steps x 4096 layers x 65536 experts is 268435456 cells"},
      {"step,layer,expert,tokens\n1024,0,0,1\n", 4096, "the expert count given", "is 4198400 cells, more than 4194304"},
  };
  char p[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    moe_trace t;
    write_text("bad.csv", cases[i].text, p, sizeof p);
    moe_status st = moe_trace_load(&t, p, cases[i].experts);
    if (st != MOE_ERR_FORMAT) FAIL_("case %zu: status %s, want MOE_ERR_FORMAT", i, moe_status_name(st));
    const char *msg = moe_last_error();
    if (!strstr(msg, p) || !strstr(msg, cases[i].line) || !strstr(msg, cases[i].what))
      FAIL_("case %zu: message '%s' lacks the file, '%s' or '%s'", i, msg, cases[i].line, cases[i].what);
    ASSERT(t.tokens == NULL && t.steps == 0);
  }
  /* the duplicate's message also names the first occurrence */
  write_text("dup.csv", cases[10].text, p, sizeof p);
  moe_trace t;
  ASSERT_STATUS(moe_trace_load(&t, p, 0), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "first at line 2"));
  ASSERT_STATUS(moe_trace_load(&t, "/nonexistent/trace.csv", 0), MOE_ERR_IO);
  ASSERT_STATUS(moe_trace_load(&t, p, -1), MOE_ERR_ARG);
  ASSERT_STATUS(moe_trace_load(&t, p, MOE_TRACE_MAX_EXPERTS + 1), MOE_ERR_ARG);
}

/* The table may have MOE_TRACE_MIN_CELLS cells whatever the rows, and MOE_TRACE_CELLS_PER_ROW a row
 * beyond that: exactly at each bound loads, one expert more does not. */
TEST(serve_trace_load_size_bounds) {
  char p[512];
  moe_trace t;
  write_text("floor.csv", "step,layer,expert,tokens\n1023,0,0,1\n", p, sizeof p);
  ASSERT_OK(moe_trace_load(&t, p, 4096)); /* 1024 x 1 x 4096 = 2^22 cells */
  ASSERT_EQ_INT(t.steps * t.layers * t.experts, MOE_TRACE_MIN_CELLS);
  ASSERT_EQ_INT(t.tokens[1023 * 4096], 1);
  moe_trace_free(&t);
  ASSERT_STATUS(moe_trace_load(&t, p, 4097), MOE_ERR_FORMAT);
  /* 2048 rows: 2048 x 4096 = 2^23 cells, twice the floor, is 4096 a row */
  enum { ROWS = 2048 };
  char *text = malloc(32 + ROWS * 16), *q = text;
  q += sprintf(q, "step,layer,expert,tokens\n");
  for (int s = 0; s < ROWS; s++) q += sprintf(q, "%d,0,0,%d\n", s, s + 1);
  write_text("per_row.csv", text, p, sizeof p);
  free(text);
  ASSERT_OK(moe_trace_load(&t, p, 4096));
  ASSERT_EQ_INT(t.steps, ROWS);
  ASSERT_EQ_INT(t.tokens[(int64_t)(ROWS - 1) * 4096], ROWS);
  moe_trace_free(&t);
  ASSERT_STATUS(moe_trace_load(&t, p, 4097), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "for its 2048 rows") && strstr(moe_last_error(), "more than 8388608"));
}

/* ---- cache simulation ---- */

TEST(serve_cachesim_paper_example) {
  moe_trace t;
  /* The paper's example: E=4, K=2, batch {1,2,3}. All policies load 1 and 2; for 3, LIFO evicts 2
   * (the most recently inserted), FIFO and LRU evict 1. A next batch {1} hits under LIFO only. */
  trace_sets(&t, 4, "1 2 3|1");
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_LIFO, 2), 3);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_FIFO, 2), 4);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_LRU, 2), 4);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_BELADY, 2), 3);
  int64_t a, m;
  ASSERT_OK(moe_cachesim(&t, 0, 0, 1, MOE_CACHE_LIFO, 2, &a, &m)); /* the first batch alone */
  ASSERT_EQ_INT(a, 3);
  ASSERT_EQ_INT(m, 3);
  ASSERT_OK(moe_cachesim(&t, 0, 1, 2, MOE_CACHE_LIFO, 2, &a, &m)); /* a cold cache for step 1 */
  ASSERT_EQ_INT(a, 1);
  ASSERT_EQ_INT(m, 1);
  moe_trace_free(&t);

  /* Batches {1,2,3} {2} {0} {3}, K=2, where the three online policies differ:
   * LIFO: 1,2 in; 3 evicts 2 -> {1,3}; 2 misses, evicts 3 (inserted last; 1 and 3 both inactive)
   *       -> {1,2}; 0 misses, evicts 2 -> {1,0}; 3 misses. 6 misses.
   * LRU:  3 evicts 1 -> {2,3}; 2 hits (used now); 0 evicts 3 (used longer ago) -> {2,0}; 3 misses. 5.
   * FIFO: 3 evicts 1 -> {2,3}; 2 hits; 0 evicts 2 (inserted first) -> {3,0}; 3 hits. 4.
   * MIN over 1,2,3,2,0,3: 3 evicts 1 (never used again); 2 hits; 0 misses and evicts 2; 3 hits. 4. */
  trace_sets(&t, 4, "1 2 3|2|0|3");
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_LIFO, 2), 6);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_LRU, 2), 5);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_FIFO, 2), 4);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_BELADY, 2), 4);
  moe_trace_free(&t);
}

/* The "not active in this batch first" rule, and more active experts than slots. */
TEST(serve_cachesim_active_rules) {
  moe_trace t;
  /* K=2, batches {0,1} {1,2} {1}: for 2, plain LIFO would evict 1 (inserted last), but 1 was
   * computed in this batch while 0 is inactive, so 0 goes -> {1,2}, and 1 then hits: 3 misses of 5
   * accesses (plain LIFO: 4). */
  trace_sets(&t, 3, "0 1|1 2|1");
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_LIFO, 2), 3);
  moe_trace_free(&t);
  /* K=1 with four active experts: they stream through, every access a miss. */
  trace_sets(&t, 4, "0 1 2 3|0 1 2 3");
  for (int p = 0; p < 4; p++) ASSERT_EQ_INT(misses_of(&t, (moe_cache_policy)p, 1), 8);
  moe_trace_free(&t);
  /* K=2 holding {2,3} when batch {1,2,3} comes: both are active and still to run, so one must go for
   * 1: the one needed last, 3; 2 hits; 3 misses again and evicts a computed one. 2 + 2 = 4 misses.
   * MIN: 1 evicts 3 (next use farther than 2's), 2 hits, 3 misses: also 4. */
  trace_sets(&t, 4, "2 3|1 2 3");
  for (int p = 0; p < 4; p++) ASSERT_EQ_INT(misses_of(&t, (moe_cache_policy)p, 2), 4);
  moe_trace_free(&t);
  /* The same under FIFO, then {1}: 1 evicts 3 -> {2,1}; 2 hits; 3 evicts 2 (inserted before 1)
   * -> {1,3}; 1 hits: 4 misses. (Evicting 2 for 1 instead would leave {3,2} and miss 1 again.) */
  trace_sets(&t, 4, "2 3|1 2 3|1");
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_FIFO, 2), 4);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_BELADY, 2), 4);
  /* a cache as large as the experts only takes the first loads */
  for (int p = 0; p < 4; p++) ASSERT_EQ_INT(misses_of(&t, (moe_cache_policy)p, 4), 3);
  moe_trace_free(&t);
}

/* The textbook reference string (Silberschatz, Operating System Concepts) with 3 frames, one expert
 * per batch: optimal 9 faults, LRU 12, FIFO 15. Belady's MIN by hand (next uses in brackets):
 *   7 0 1 miss -> {7,0,1}; 2 miss, evicts 7 [17 vs 0@4, 1@13] -> {0,1,2}; 0 hit;
 *   3 miss, evicts 1 [13 vs 0@6, 2@8] -> {0,2,3}; 0 hit; 4 miss, evicts 0 [10 vs 2@8, 3@9];
 *   2 3 hit; 0 miss, evicts 4 [never]; 3 2 hit; 1 miss, evicts 3 [never]; 2 0 1 hit;
 *   7 miss, evicts 2 [never]; 0 1 hit. Misses: 7 0 1 2 3 4 0 1 7 = 9.
 * LIFO (evict the last inserted): 7 0 1 | 2 (-1) | 3 (-2) | 4 (-3) | 2 (-4) | 3 (-2) | 2 (-3) |
 *   1 (-2) | 2 (-1) | 1 (-2); 7 and 0 stay: 12 misses. */
TEST(serve_cachesim_belady_textbook) {
  moe_trace t;
  trace_sets(&t, 8, "7|0|1|2|0|3|0|4|2|3|0|3|2|1|2|0|1|7|0|1");
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_BELADY, 3), 9);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_LRU, 3), 12);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_FIFO, 3), 15);
  ASSERT_EQ_INT(misses_of(&t, MOE_CACHE_LIFO, 3), 12);
  moe_trace_free(&t);
}

/* The fewest misses any load-on-miss cache of K slots can have on the trace's access sequence:
 * dynamic programming over the cache contents (E <= 8). */
static int64_t optimal_misses(const moe_trace *t, int K) {
  const int E = t->experts, S = 1 << E;
  int64_t *dp = malloc(S * sizeof *dp), *nd = malloc(S * sizeof *nd), inf = INT64_MAX / 2;
  for (int s = 0; s < S; s++) dp[s] = s ? inf : 0;
  for (int64_t b = 0; b < t->steps; b++)
    for (int e = 0; e < E; e++) {
      if (!t->tokens[b * E + e]) continue;
      for (int s = 0; s < S; s++) nd[s] = inf;
      for (int s = 0; s < S; s++) {
        if (dp[s] >= inf) continue;
        int bit = 1 << e;
        if (s & bit) { nd[s] = dp[s] < nd[s] ? dp[s] : nd[s]; continue; }
        if (__builtin_popcount(s) < K) {
          if (dp[s] + 1 < nd[s | bit]) nd[s | bit] = dp[s] + 1;
          continue;
        }
        for (int x = 0; x < E; x++)
          if (s & (1 << x)) {
            int n = (s & ~(1 << x)) | bit;
            if (dp[s] + 1 < nd[n]) nd[n] = dp[s] + 1;
          }
      }
      int64_t *tmp = dp; dp = nd; nd = tmp;
    }
  int64_t best = inf;
  for (int s = 0; s < S; s++) best = dp[s] < best ? dp[s] : best;
  free(dp), free(nd);
  return best;
}

/* Random traces with hot experts: MIN equals the brute-force optimum, and no policy beats it. */
TEST(serve_cachesim_belady_optimal) {
  uint64_t seed = 7;
  for (int trial = 0; trial < 40; trial++) {
    const int E = 6, steps = 12 + trial % 7;
    int32_t tok[19 * 6] = {0};
    for (int i = 0; i < steps * E; i++) {
      int e = i % E;
      double u = (moe__uniform(&seed) + 1) / 2, pr = e < 2 ? 0.7 : 0.25; /* experts 0, 1 are hot */
      tok[i] = u < pr;
    }
    moe_trace t;
    trace_table(&t, steps, 1, E, tok);
    for (int K = 1; K <= 4; K++) {
      int64_t opt = optimal_misses(&t, K), bel = misses_of(&t, MOE_CACHE_BELADY, K);
      if (bel != opt) FAIL_("trial %d K=%d: belady %lld, optimum %lld", trial, K, (long long)bel, (long long)opt);
      for (int p = 0; p < 3; p++)
        if (misses_of(&t, (moe_cache_policy)p, K) < bel)
          FAIL_("trial %d K=%d: %s beats belady", trial, K, moe_cache_policy_name((moe_cache_policy)p));
    }
    moe_trace_free(&t);
  }
  /* a larger trace with locality (a slowly drifting hot set), several layers */
  const int E = 16, L = 3, steps = 400;
  int32_t *tok = calloc((size_t)steps * L * E, sizeof *tok);
  for (int b = 0; b < steps; b++)
    for (int l = 0; l < L; l++)
      for (int e = 0; e < E; e++) {
        int hot = (e - b / 50 - l + 2 * E) % E < 4;
        tok[((size_t)b * L + l) * E + e] = (moe__uniform(&seed) + 1) / 2 < (hot ? 0.8 : 0.1) ? 1 + b % 5 : 0;
      }
  moe_trace t;
  trace_table(&t, steps, L, E, tok);
  free(tok);
  for (int l = 0; l < L; l++)
    for (int K = 2; K <= 10; K += 4) {
      int64_t a[4], m[4];
      for (int p = 0; p < 4; p++) ASSERT_OK(moe_cachesim(&t, l, 0, steps, (moe_cache_policy)p, K, &a[p], &m[p]));
      for (int p = 0; p < 3; p++) {
        ASSERT_EQ_INT(a[p], a[3]);
        if (m[p] < m[3]) FAIL_("layer %d K=%d: %s %lld < belady %lld", l, K, moe_cache_policy_name((moe_cache_policy)p),
                               (long long)m[p], (long long)m[3]);
      }
      ASSERT(m[3] < a[3]);
    }
  moe_trace_free(&t);
}

TEST(serve_cachesim_args) {
  moe_trace t;
  trace_sets(&t, 4, "1 2|3");
  int64_t a, m;
  ASSERT_STATUS(moe_cachesim(&t, 0, 0, 2, MOE_CACHE_LIFO, 0, &a, &m), MOE_ERR_ARG);
  ASSERT_STATUS(moe_cachesim(&t, 1, 0, 2, MOE_CACHE_LIFO, 2, &a, &m), MOE_ERR_ARG);
  ASSERT_STATUS(moe_cachesim(&t, 0, 1, 3, MOE_CACHE_LIFO, 2, &a, &m), MOE_ERR_ARG);
  ASSERT_STATUS(moe_cachesim(&t, 0, 2, 1, MOE_CACHE_LIFO, 2, &a, &m), MOE_ERR_ARG);
  ASSERT_OK(moe_cachesim(&t, 0, 1, 1, MOE_CACHE_BELADY, 2, &a, &m));
  ASSERT_EQ_INT(a, 0);
  ASSERT_EQ_INT(m, 0);
  moe_trace_free(&t);
  moe_cache_policy p;
  for (int i = 0; i < 4; i++) {
    ASSERT_OK(moe_cache_policy_parse(moe_cache_policy_name((moe_cache_policy)i), "--policy", &p));
    ASSERT_EQ_INT(p, i);
  }
  ASSERT_STATUS(moe_cache_policy_parse("mru", "--policy", &p), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "--policy") && strstr(moe_last_error(), "lifo|lru|fifo|belady"));
}

/* ---- placement ---- */

TEST(serve_placement_greedy) {
  int dev[6];
  moe_trace t;
  /* mean shares .7 .1 .1 .1 on 2 devices of 2: 0 -> d0, 1 -> d1, 2 -> d1 (.1 < .7), and d1 is full
   * so 3 -> d0 although d1 is lighter: the cardinality limit at work. */
  int32_t a[] = {70, 10, 10, 10, 70, 10, 10, 10};
  trace_table(&t, 2, 1, 4, a);
  ASSERT_OK(moe_placement_fit(&t, 0, 0, 2, 2, MOE_PLACEMENT_GREEDY, 0.5, dev));
  int want_a[] = {0, 1, 1, 0};
  for (int m = 0; m < 4; m++) ASSERT_EQ_INT(dev[m], want_a[m]);
  ASSERT_STATUS(moe_placement_fit(&t, 0, 0, 2, 3, MOE_PLACEMENT_GREEDY, 0.5, dev), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "(4)") && strstr(moe_last_error(), "(3)"));
  moe_trace_free(&t);
  /* shares .05 .30 .10 .25 .20 .10 on 2 devices of 3. Order 1 3 4 2 5 0 (2 before 5: lower id).
   * 1 -> d0 (.30); 3 -> d1 (.25); 4 -> d1 (.45); 2 -> d0 (.40); 5 -> d0 (.50 vs d1 .45? d0 is .40
   * < .45) -> d0 full {1,2,5}; 0 -> d1 {3,4,0}. Loads .50 / .50. */
  int32_t b[] = {5, 30, 10, 25, 20, 10};
  trace_table(&t, 1, 1, 6, b);
  ASSERT_OK(moe_placement_fit(&t, 0, 0, 1, 2, MOE_PLACEMENT_GREEDY, 0.5, dev));
  int want_b[] = {1, 0, 0, 1, 1, 0}, count[2] = {0, 0};
  for (int m = 0; m < 6; m++) {
    ASSERT_EQ_INT(dev[m], want_b[m]);
    count[dev[m]]++;
  }
  ASSERT_EQ_INT(count[0], 3);
  ASSERT_EQ_INT(count[1], 3);
  /* 3 devices of 2: 1 -> d0, 3 -> d1, 4 -> d2, 2 -> d2 (.30), 5 -> d1 (.35), 0 -> d0. */
  ASSERT_OK(moe_placement_fit(&t, 0, 0, 1, 3, MOE_PLACEMENT_GREEDY, 0.5, dev));
  int want_c[] = {0, 0, 2, 1, 2, 1};
  for (int m = 0; m < 6; m++) ASSERT_EQ_INT(dev[m], want_c[m]);
  ASSERT_OK(moe_placement_contiguous(6, 3, dev));
  int want_d[] = {0, 0, 1, 1, 2, 2};
  for (int m = 0; m < 6; m++) ASSERT_EQ_INT(dev[m], want_d[m]);
  ASSERT_STATUS(moe_placement_contiguous(6, 4, dev), MOE_ERR_ARG);
  moe_trace_free(&t);
  moe_placement_method me;
  ASSERT_OK(moe_placement_method_parse("anticorr", "--method", &me));
  ASSERT_EQ_INT(me, MOE_PLACEMENT_ANTICORR);
  ASSERT_STATUS(moe_placement_method_parse("random", "--method", &me), MOE_ERR_ARG);
}

/* Experts x=0, a=1, b=2, y=3 over batches alternating (40,30,25,5) and (40,20,15,25): x is constant
 * (correlation 0 by convention), b = a - 5 (correlation 1 with a), y anti-correlated with both.
 * Mean shares .40 .25 .20 .15, two devices of two. */
static const int32_t XABY[] = {40, 30, 25, 5, 40, 20, 15, 25, 40, 30, 25, 5, 40, 20, 15, 25};

TEST(serve_placement_anticorr) {
  moe_trace t;
  trace_table(&t, 4, 1, 4, XABY);
  int dev[4];
  /* greedy: x -> d0; a -> d1; b -> d1 (.25 < .40); y -> d0: a and b together. */
  ASSERT_OK(moe_placement_fit(&t, 0, 0, 4, 2, MOE_PLACEMENT_GREEDY, 0.5, dev));
  int want_g[] = {0, 1, 1, 0};
  for (int m = 0; m < 4; m++) ASSERT_EQ_INT(dev[m], want_g[m]);
  /* anticorr: x -> d0; a: L0 = .40 + .5 * S_ax(0) = .40, L1 = 0 -> d1; b: L0 = .40 + .5 * 0 = .40,
   * L1 = .25 + .5 * S_ab(1) = .75 -> d0; y -> d1. The correlated pair is split. */
  ASSERT_OK(moe_placement_fit(&t, 0, 0, 4, 2, MOE_PLACEMENT_ANTICORR, 0.5, dev));
  int want_a[] = {0, 1, 0, 1};
  for (int m = 0; m < 4; m++) ASSERT_EQ_INT(dev[m], want_a[m]);
  /* with no weight on the correlation it is greedy again */
  ASSERT_OK(moe_placement_fit(&t, 0, 0, 4, 2, MOE_PLACEMENT_ANTICORR, 0.0, dev));
  for (int m = 0; m < 4; m++) ASSERT_EQ_INT(dev[m], want_g[m]);
  moe_trace_free(&t);
}

TEST(serve_placement_loads) {
  /* Two layers, five steps; layer 1 holds XABY's batches at steps 0, 1, 3, 4 and nothing at step 2
   * (skipped); layer 0 holds something else, to catch a wrong layer index. */
  int32_t tok[5 * 2 * 4] = {0};
  const int steps_used[4] = {0, 1, 3, 4};
  for (int i = 0; i < 4; i++) {
    memcpy(&tok[(steps_used[i] * 2 + 1) * 4], &XABY[i * 4], 4 * sizeof(int32_t));
    tok[(steps_used[i] * 2 + 0) * 4 + 3] = 9;
  }
  tok[(2 * 2 + 0) * 4 + 0] = 1;
  moe_trace t;
  trace_table(&t, 5, 2, 4, tok);
  int orig[4], greedy[] = {0, 1, 1, 0};
  double mx, avg;
  int64_t nb;
  ASSERT_OK(moe_placement_contiguous(4, 2, orig));
  /* contiguous {x,a} {b,y}: batch 1 .70/.30, batch 2 .60/.40 -> Max .70, Avg (.70 + .60)/2 = .65 */
  ASSERT_OK(moe_placement_eval(&t, 1, 0, 5, 2, orig, &mx, &avg, &nb));
  ASSERT_EQ_INT(nb, 4);
  ASSERT_NEAR(mx, 0.70, 1e-12);
  ASSERT_NEAR(avg, 0.65, 1e-12);
  /* greedy {x,y} {a,b}: .45/.55 and .65/.35 -> Max .65, Avg (.55 + .65)/2 = .60 */
  ASSERT_OK(moe_placement_eval(&t, 1, 0, 5, 2, greedy, &mx, &avg, &nb));
  ASSERT_NEAR(mx, 0.65, 1e-12);
  ASSERT_NEAR(avg, 0.60, 1e-12);
  /* only step 1 (type 2 batch): .65 both ways */
  ASSERT_OK(moe_placement_eval(&t, 1, 1, 2, 2, greedy, &mx, &avg, &nb));
  ASSERT_EQ_INT(nb, 1);
  ASSERT_NEAR(mx, 0.65, 1e-12);
  ASSERT_NEAR(avg, 0.65, 1e-12);
  /* only the empty step: no batch, loads 0 */
  ASSERT_OK(moe_placement_eval(&t, 1, 2, 3, 2, greedy, &mx, &avg, &nb));
  ASSERT_EQ_INT(nb, 0);
  ASSERT_NEAR(mx, 0, 0);
  /* layer 0: everything on expert 3 (device 1) except step 2 on expert 0: Max 1, Avg 1 */
  ASSERT_OK(moe_placement_eval(&t, 0, 0, 5, 2, orig, &mx, &avg, &nb));
  ASSERT_EQ_INT(nb, 5);
  ASSERT_NEAR(mx, 1, 1e-12);
  ASSERT_NEAR(avg, 1, 1e-12);
  int bad[] = {0, 1, 2, 0};
  ASSERT_STATUS(moe_placement_eval(&t, 1, 0, 5, 2, bad, &mx, &avg, &nb), MOE_ERR_ARG);
  ASSERT_STATUS(moe_placement_eval(&t, 2, 0, 5, 2, orig, &mx, &avg, &nb), MOE_ERR_ARG);
  moe_trace_free(&t);
}

/* ---- the commands ---- */

static const char *xaby_csv(char *buf, size_t n, int copies) {
  char text[4096], *p = text;
  p += sprintf(p, "step,layer,expert,tokens\n");
  for (int s = 0; s < 4 * copies; s++)
    for (int e = 0; e < 4; e++) p += sprintf(p, "%d,0,%d,%d\n", s, e, XABY[(s % 4) * 4 + e]);
  return write_text("xaby.csv", text, buf, n);
}

/* moe_placement_load reads the whole file strictly: trailing whitespace is fine, trailing garbage
 * (issue 21: accepted) and a NUL byte are refused with the byte. */
TEST(serve_placement_load_strict) {
  static const char good[] = "{\"devices\": 2, \"layers\": [{\"layer\": 0, \"expert_device\": [1, 0, 0, 1]}]}";
  static const struct { const char *tail, *what; size_t extra; } cases[] = {
      {" \n\t\r\n", NULL, 0},
      {"garbage", "garbage after the JSON placement at byte 71", 0},
      {"\n{}", "garbage after the JSON placement at byte 72", 0},
      {"\n", "contains a NUL byte at byte 71", 1}, /* "\0\n": the NUL first */
  };
  ASSERT_EQ_INT(strlen(good), 71);
  char p[512], text[256];
  test_tmp_path("strict.json", p, sizeof p);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n = strlen(good), tl = strlen(cases[i].tail);
    memcpy(text, good, n);
    if (cases[i].extra) text[n++] = 0;
    memcpy(text + n, cases[i].tail, tl);
    ASSERT_OK(moe_write_file_atomic(p, text, n + tl));
    int dev[4] = {-1, -1, -1, -1};
    moe_status st = moe_placement_load(p, 0, 4, 2, dev);
    if (!cases[i].what) {
      ASSERT_OK(st);
      ASSERT(dev[0] == 1 && dev[1] == 0 && dev[2] == 0 && dev[3] == 1);
    } else if (st != MOE_ERR_FORMAT || !strstr(moe_last_error(), p) || !strstr(moe_last_error(), cases[i].what)) {
      FAIL_("case %zu: %s '%s', want MOE_ERR_FORMAT and '%s'", i, moe_status_name(st), moe_last_error(), cases[i].what);
    }
  }
  ASSERT_OK(moe_write_file_atomic(p, good, 40));
  ASSERT_STATUS(moe_placement_load(p, 0, 4, 2, (int[4]){0}), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "placement is not valid JSON (error near byte"));
}

TEST(serve_cli_cachesim) {
  char tr[512], bad[512], args[2048];
  /* layer 0: the paper's example {1,2,3} {1}; layer 1: {0} {0} */
  write_text("sim.csv", "step,layer,expert,tokens\n0,0,1,4\n0,0,2,1\n0,0,3,2\n1,0,1,3\n0,1,0,1\n1,1,0,8\n", tr,
             sizeof tr);
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy lifo --cache 2", tr);
  ASSERT_EQ_INT(serve_moe(args), 0);
  ASSERT(strstr(out_text, "layer 0: accesses 4 misses 3 miss_rate 0.7500\n"));
  ASSERT(strstr(out_text, "layer 1: accesses 2 misses 1 miss_rate 0.5000\n"));
  ASSERT(strstr(out_text, "overall: accesses 6 misses 4 miss_rate 0.6667\n"));
  ASSERT(strstr(out_text, "worst: layer 0 miss_rate 0.7500\n"));
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy fifo --cache 2 --experts 4", tr);
  ASSERT_EQ_INT(serve_moe(args), 0);
  ASSERT(strstr(out_text, "layer 0: accesses 4 misses 4 miss_rate 1.0000\n"));
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy all --cache 2", tr);
  ASSERT_EQ_INT(serve_moe(args), 0);
  ASSERT(strstr(out_text, "belady"));
  /* layer 0 rates: lifo .75, lru 1, fifo 1, belady .75, lfu 1 (1 and 2 used once: the least recent, 1,
   * goes for 3), lfru 1 (1's score decayed longer) */
  ASSERT(strstr(out_text, "0                 4   0.7500   1.0000   1.0000   0.7500   1.0000   1.0000\n"));
  /* errors: exit 1 with a message */
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy mru --cache 2", tr);
  ASSERT_EQ_INT(serve_moe(args), 1);
  ASSERT(strstr(err_text, "mru"));
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy lifo", tr);
  ASSERT_EQ_INT(serve_moe(args), 1);
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy lifo --cache 0", tr);
  ASSERT_EQ_INT(serve_moe(args), 1);
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy lifo --cache 2 --experts 3", tr);
  ASSERT_EQ_INT(serve_moe(args), 1);
  ASSERT(strstr(err_text, "line 4:") && strstr(err_text, "unknown expert 3"));
  write_text("sim_bad.csv", "step,layer,expert,tokens\n0,0,1,4\n0,0,2,-1\n", bad, sizeof bad);
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy lifo --cache 2", bad);
  ASSERT_EQ_INT(serve_moe(args), 1);
  ASSERT(strstr(err_text, "line 3:") && strstr(err_text, "negative count"));
  ASSERT_EQ_INT(serve_moe("cachesim --trace /nonexistent.csv --policy lifo --cache 2"), 1);
  ASSERT_EQ_INT(serve_moe("cachesim --bogus 1"), 1);
}

TEST(serve_cli_placement) {
  char tr[512], js[512], args[2048];
  xaby_csv(tr, sizeof tr, 2); /* 8 steps: fit on 0-3, test on 4-7 */
  test_tmp_path("placement.json", js, sizeof js);
  unlink(js);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method anticorr --out '%s'", tr, js);
  ASSERT_EQ_INT(serve_moe(args), 0);
  /* original {x,a} {b,y}: .70 / .65; anticorr {x,b} {a,y}: .65/.35 and .55/.45 -> .65 / .60 */
  ASSERT(strstr(out_text, "layer 0: original max_load 0.7000 avg_max_load 0.6500 | anticorr max_load 0.6500 "
                          "avg_max_load 0.6000 (4 test batches)"));
  char text[4096];
  test_read_text(js, text, sizeof text);
  cJSON *root = cJSON_Parse(text);
  ASSERT(root);
  ASSERT_EQ_INT(cJSON_GetObjectItem(root, "devices")->valueint, 2);
  ASSERT(!strcmp(cJSON_GetObjectItem(root, "method")->valuestring, "anticorr"));
  cJSON *layers = cJSON_GetObjectItem(root, "layers");
  ASSERT_EQ_INT(cJSON_GetArraySize(layers), 1);
  cJSON *l0 = cJSON_GetArrayItem(layers, 0);
  ASSERT_EQ_INT(cJSON_GetObjectItem(l0, "layer")->valueint, 0);
  cJSON *ed = cJSON_GetObjectItem(l0, "expert_device");
  int want[] = {0, 1, 0, 1};
  int n = cJSON_GetArraySize(ed), got[4];
  for (int m = 0; m < 4 && m < n; m++) got[m] = cJSON_GetArrayItem(ed, m)->valueint;
  cJSON_Delete(root);
  ASSERT_EQ_INT(n, 4);
  for (int m = 0; m < 4; m++) ASSERT_EQ_INT(got[m], want[m]);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method greedy --layer 0", tr);
  ASSERT_EQ_INT(serve_moe(args), 0);
  ASSERT(strstr(out_text, "| greedy max_load 0.6500 avg_max_load 0.6000"));
  /* errors: exit 1, and no JSON written */
  unlink(js);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 3 --method greedy --out '%s'", tr, js);
  ASSERT_EQ_INT(serve_moe(args), 1);
  ASSERT(strstr(err_text, "(4)") && strstr(err_text, "(3)"));
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method lpt --out '%s'", tr, js);
  ASSERT_EQ_INT(serve_moe(args), 1);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method greedy --layer 1 --out '%s'", tr, js);
  ASSERT_EQ_INT(serve_moe(args), 1);
  snprintf(args, sizeof args, "placement --trace '%s' --method greedy", tr);
  ASSERT_EQ_INT(serve_moe(args), 1);
  char one[512];
  write_text("one_step.csv", "step,layer,expert,tokens\n0,0,0,1\n0,0,1,1\n", one, sizeof one);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method greedy --out '%s'", one, js);
  ASSERT_EQ_INT(serve_moe(args), 1);
  ASSERT(strstr(err_text, "at least 2"));
  struct stat sb;
  ASSERT(stat(js, &sb) != 0);
  char nodir[512]; /* a JSON that cannot be written: the path named, exit 1 */
  test_tmp_path("no/such/dir/placement.json", nodir, sizeof nodir);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method greedy --out '%s'", tr, nodir);
  ASSERT_EQ_INT(serve_moe(args), 1);
  ASSERT(strstr(err_text, "placement.json") && strstr(err_text, "No such file"));
}

/* issue 21's fuzzed traces: every command that reads a trace exits 1 with the reader's message, writes
 * nothing, and does not crash or allocate the ids' worth of cells. */
TEST(serve_cli_trace_limits) {
  static const struct { const char *text, *what; } cases[] = {
      {"step,layer,expert,tokens\n0,0,0,57\n0,0,1,7\n0,1,2147483647,1\n0,1,1,63\n", "line 4: expert 2147483647 out of range"},
      {"step,layer,expert,tokens\n0,0,0,9\n12,2000000,5,17\n", "line 3: layer 2000000 out of range"},
      {"step,layer,expert,tokens\n0,0,0,5\n9223372036854775807,1,2,7\n", "line 3: step 9223372036854775807 out of range"},
      {"step,layer,expert,tokens\n2147483647,0,0,1\n", "too large for its 1 rows"},
  };
  const char *cmds[] = {"cachesim --trace '%s' --policy all --cache 2", "placement --trace '%s' --devices 2 --method greedy",
                        "plot-trace '%s' -o '%s'"};
  char tr[512], png[512], args[2048];
  test_tmp_path("limits.png", png, sizeof png);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_text("limits.csv", cases[i].text, tr, sizeof tr);
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
      unlink(png);
      snprintf(args, sizeof args, cmds[c], tr, png);
      int rc = serve_moe(args);
      if (rc != 1 || !strstr(err_text, cases[i].what) || access(png, F_OK) == 0)
        FAIL_("case %zu: moe %s: exit %d, stderr '%s', want 1 and '%s' (and no %s)", i, args, rc, err_text,
              cases[i].what, png);
    }
  }
}
