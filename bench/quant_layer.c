/* The MoE layer with quantized experts against fp32 experts (issue 41; BENCHMARKS "Quantized experts"):
 * a Mixtral-shaped layer (swiglu, default D 1024, H 3584, E 8, k 2, no biases), random weights, for each
 * expert type: decode (one token a forward, a new random token each time so that the experts change)
 * and prefill (512 tokens a forward), the medians, and the bytes of expert weights a decode token
 * reads (k experts' fc1, fc3, fc2) over its time, next to the read bandwidth of this machine measured
 * here (a 512 MiB buffer summed by the same threads).
 * usage: quant_layer [--shape D,H,E,k] [--threads N] [--types f32,Q8_0,Q4_K,...] [--decode N] [--reps R] */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t seed = 12345;
static float urand(void) {
  seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
  return (float)((seed >> 40) * 0x1.0p-23) - 1.0f;
}

/* GB/s of reading a 512 MiB buffer with `threads` threads (the best of 3). */
static double read_bandwidth(int threads) {
  size_t n = (size_t)64 << 20; /* uint64s */
  uint64_t *b = malloc(n * 8);
  volatile uint64_t sink = 0; /* the sums are used: the reads happen */
  if (!b) return 0;
  memset(b, 1, n * 8);
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now();
    uint64_t x = 0;
#pragma omp parallel for num_threads(threads) reduction(^ : x) schedule(static)
    for (size_t i = 0; i < n; i++) x ^= b[i];
    double gbs = (double)n * 8 / (now() - t0) / 1e9;
    sink ^= x;
    if (gbs > best) best = gbs;
  }
  free(b);
  return best;
}

int main(int argc, char **argv) {
  int D = 1024, H = 3584, E = 8, k = 2, threads = 2, decode = 64, reps = 3, prefill = 512;
  const char *types = "f32,Q8_0,Q4_K";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--shape") && i + 1 < argc && sscanf(argv[++i], "%d,%d,%d,%d", &D, &H, &E, &k) == 4) continue;
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) { threads = atoi(argv[++i]); continue; }
    if (!strcmp(argv[i], "--types") && i + 1 < argc) { types = argv[++i]; continue; }
    if (!strcmp(argv[i], "--decode") && i + 1 < argc) { decode = atoi(argv[++i]); continue; }
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) { reps = atoi(argv[++i]); continue; }
    fprintf(stderr, "usage: quant_layer [--shape D,H,E,k] [--threads N] [--types f32,Q8_0,Q4_K,...] [--decode N] [--reps R]\n");
    return 2;
  }
  if (decode < 1 || reps < 1 || threads < 1) {
    fprintf(stderr, "quant_layer: --decode, --reps and --threads must be >= 1\n");
    return 2;
  }
  printf("# %s\n# layer D %d H %d E %d k %d swiglu, %d threads; read bandwidth %.1f GB/s\n", moe_cpu_info(), D, H, E, k,
         threads, read_bandwidth(threads));
  printf("%-6s %12s %12s %14s %16s %12s\n", "type", "decode_ms", "decode_tok/s", "prefill_ms", "prefill_tok/s",
         "decode_GB/s");
  float *x = malloc((size_t)prefill * D * 4), *y = malloc((size_t)prefill * D * 4);
  double *t = malloc(sizeof(double) * (size_t)(decode > reps ? decode : reps));
  if (!x || !y || !t) return 1;
  char list[256];
  snprintf(list, sizeof list, "%s", types);
  for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
    moe_gguf_type ty = MOE_GGUF_F32;
    if (moe_gguf_type_parse(name, "--types", &ty) != MOE_OK) {
      fprintf(stderr, "quant_layer: %s\n", moe_last_error());
      return 2;
    }
    moe_layer_config c;
    moe_layer_config_default(&c);
    c.D = D, c.H = H, c.E = E, c.top_k = k, c.act = MOE_ACT_SWIGLU, c.expert_bias = 0, c.threads = threads;
    moe_layer_t l;
    if (moe_layer_init(&l, &c) != MOE_OK) {
      fprintf(stderr, "quant_layer: %s\n", moe_last_error());
      return 1;
    }
    moe_layer_init_params(&l, 1);
    if (ty != MOE_GGUF_F32 && moe_layer_quantize_experts(&l, ty) != MOE_OK) {
      fprintf(stderr, "quant_layer: %s\n", moe_last_error());
      return 1;
    }
    double bpw = (double)moe_gguf_type_block_bytes(ty) / moe_gguf_type_block(ty);
    double bytes = (double)k * 3 * H * D * bpw;
    for (size_t i = 0; i < (size_t)prefill * D; i++) x[i] = urand();
    moe_layer_forward(&l, x, 1, y, NULL, NULL); /* warm-up: the workspace, the threads */
    for (int i = 0; i < decode; i++) {
      for (int j = 0; j < D; j++) x[j] = urand();
      double t0 = now();
      moe_layer_forward(&l, x, 1, y, NULL, NULL);
      t[i] = now() - t0;
    }
    double dec = median(t, decode);
    moe_layer_forward(&l, x, prefill, y, NULL, NULL);
    for (int i = 0; i < reps; i++) {
      double t0 = now();
      moe_layer_forward(&l, x, prefill, y, NULL, NULL);
      t[i] = now() - t0;
    }
    double pre = median(t, reps);
    printf("%-6s %12.3f %12.1f %14.2f %16.1f %12.1f\n", moe_gguf_type_name(ty), dec * 1e3, 1 / dec, pre * 1e3,
           prefill / pre, bytes / dec / 1e9);
    fflush(stdout);
    moe_layer_free(&l);
  }
  free(x), free(y), free(t);
  return 0;
}
