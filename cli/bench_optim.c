/* moe bench --optimizer-params N,...: the time of one AdamW step over N parameters (the update
 * moe train runs after each backward), and the memory bandwidth it reaches. Each parameter's update
 * reads its value, gradient and two moments and writes the value and the moments back: 28 bytes that
 * do not stay in cache from one step to the next once the model is larger than the cache, so the step
 * is a memory stream whose time grows with the parameters, not with the tokens of a batch. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_optim.h"
#include "cli.h"

#define BYTES_PER_PARAM 28.0
#define WARMUP 3

/* Parses "N,N,..." (each 1 to 2^30 parameters, at most max of them) into n; returns the count or -1. */
int bench_optim_parse(const char *s, long *n, int max) {
  int c = 0;
  for (const char *p = s; *p;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 1 || v > (1L << 30) || c == max || (*end && *end != ',')) return -1;
    n[c++] = v;
    p = *end ? end + 1 : end;
    if (*end && !*p) return -1; /* a trailing comma */
  }
  return c;
}

static int one(long n, int threads, int reps, int json) {
  float *p = malloc((size_t)n * sizeof *p), *g = malloc((size_t)n * sizeof *g);
  double *t = malloc((size_t)reps * sizeof *t);
  moe_optim_t opt = {0};
  moe_optim_config cfg;
  moe_optim_config_default(&cfg);
  int ok = p && g && t && moe_optim_init_n(&opt, &cfg, (size_t)n) == MOE_OK;
  if (ok) {
    for (long i = 0; i < n; i++) {
      p[i] = 0.01f * (float)(i % 101);
      g[i] = 1e-3f * (float)(i % 13 - 6);
    }
    moe_tensor_ref r = {0};
    snprintf(r.name, sizeof r.name, "bench.weight");
    r.ndim = 2;
    r.data = p;
    r.grad = g;
    r.numel = (size_t)n;
    for (int i = 0; i < WARMUP + reps; i++) {
      double s = cli_now();
      moe_optim_step_refs(&opt, &r, 1, 1e-3f, threads);
      if (i >= WARMUP) t[i - WARMUP] = cli_now() - s;
    }
    double ms = 1e3 * cli_median(t, reps);
    double gbs = BYTES_PER_PARAM * (double)n / (ms * 1e-3) / 1e9;
    if (json)
      printf("{\"optimizer\": \"adam\", \"params\": %ld, \"threads\": %d, \"step_ms\": %.4f, \"gb_per_s\": %.2f}\n", n,
             threads, ms, gbs);
    else
      printf("%-9s %12ld %8d %10.3f %8.1f\n", "adam", n, threads, ms, gbs);
  }
  moe_optim_free(&opt);
  free(p);
  free(g);
  free(t);
  return ok ? 0 : cli_usage_error("bench", "--optimizer-params %ld: out of memory", n);
}

int bench_optim_run(const long *n, int count, int threads, int reps, int json) {
  if (!json) {
    printf("moe %s, %d threads; AdamW step, median of %d; GB/s at %.0f bytes a parameter\n", MOE_VERSION, threads,
           reps, BYTES_PER_PARAM);
    printf("%-9s %12s %8s %10s %8s\n", "optimizer", "params", "threads", "step_ms", "GB/s");
  }
  for (int i = 0; i < count; i++)
    if (one(n[i], threads, reps, json)) return 1;
  return 0;
}
