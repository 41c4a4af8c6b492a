/* The quantized dot products alone (src/kernels/quant_dot*.c), every version this CPU has (the AVX-512
 * run kernels with and without GFNI's bit split where a type has both), alternated in one run (issue
 * 41): per weight type,
 *   decode: one activation row against every row of a weight matrix of `--mib` MiB (beyond the caches),
 *     in GB/s of weights read: as the layer reads them (moe__qrows_times: 16 rows a tile, in runs of
 *     four where the version has a run kernel) and by one call a row, next to a plain read loop over
 *     the same bytes by the same threads;
 *   prefill: `--tokens` activation rows against 3584 weight rows (one expert's fc1 at D 1024, in cache),
 *     weight rows 16 at a time, each with the tokens MOE__QDOT_ROWS at a time, as the layer does; in
 *     multiply-adds (values times rows) per second.
 * The best of `--reps` passes of each (the machine may be shared: the best is the least disturbed).
 * usage: qdot_kernels [--n N] [--mib M] [--tokens T] [--threads K] [--reps R] [--types Q8_0,Q4_K,...] */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "kernels/quant.h"
#include "kernels/quant_matmul.h"
#include "moe.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Random bytes with moderate finite scales (f16 1.0-ish; MXFP4 2^0): no subnormal floats to slow a side. */
static void fill_weights(moe_gguf_type t, uint8_t *w, size_t blocks, uint64_t *seed) {
  size_t bb = moe_gguf_type_block_bytes(t);
  for (size_t i = 0; i < blocks * bb; i++) w[i] = (uint8_t)moe__splitmix(seed);
  for (size_t b = 0; b < blocks; b++) {
    uint8_t *p = w + b * bb;
    if (t == MOE_GGUF_MXFP4) p[0] = 127;
    else if (t == MOE_GGUF_Q6_K) p[209] = 0x3c;
    else p[1] = 0x3c, p[3] = 0x3c; /* Q8_0 / Q4_0: byte 3 is a value */
  }
}

/* GB/s of summing the n bytes at p (as uint64) over the threads. */
static double read_loop(const uint8_t *p, size_t n, int threads) {
  const uint64_t *q = (const uint64_t *)p;
  uint64_t x = 0;
  double t0 = now();
#pragma omp parallel for num_threads(threads) reduction(+ : x) schedule(static)
  for (size_t i = 0; i < n / 8; i++) x += q[i];
  double t = now() - t0;
  volatile uint64_t sink = x; /* the reads happen */
  (void)sink;
  return (double)n / t / 1e9;
}

int main(int argc, char **argv) {
  int n = 1024, mib = 256, tokens = 64, threads = 1, reps = 5;
  const char *types = "Q8_0,Q4_0,MXFP4,Q4_K,Q5_K,Q6_K,BF16,F16";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc) { n = atoi(argv[++i]); continue; }
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) { mib = atoi(argv[++i]); continue; }
    if (!strcmp(argv[i], "--tokens") && i + 1 < argc) { tokens = atoi(argv[++i]); continue; }
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) { threads = atoi(argv[++i]); continue; }
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) { reps = atoi(argv[++i]); continue; }
    if (!strcmp(argv[i], "--types") && i + 1 < argc) { types = argv[++i]; continue; }
    fprintf(stderr, "usage: qdot_kernels [--n N] [--mib M] [--tokens T] [--threads K] [--reps R] [--types Q8_0,...]\n");
    return 2;
  }
  if (n < 256 || n % 256 || mib < 1 || tokens < 1 || threads < 1 || reps < 1) {
    fprintf(stderr, "qdot_kernels: --n a multiple of 256; --mib, --tokens, --threads, --reps >= 1\n");
    return 2;
  }
  const int prefill_rows = 3584, wrows = 16;
  size_t bytes = (size_t)mib << 20;
  uint8_t *w = malloc(bytes);
  size_t outs = (size_t)tokens * prefill_rows > bytes / 16 ? (size_t)tokens * prefill_rows : bytes / 16; /* rows of 16+ bytes */
  float *x = malloc(sizeof(float) * (size_t)tokens * n), *out = malloc(sizeof(float) * outs);
  uint8_t *a = malloc((size_t)tokens * moe__act_bytes(MOE_GGUF_BF16, n)); /* fp32: the largest format */
  if (!w || !x || !out || !a) return 1;
  uint64_t seed = 7;
  for (size_t i = 0; i < (size_t)tokens * n; i++) x[i] = moe__uniform(&seed);
  printf("# %s\n# n %d, decode over %d MiB of weights, prefill %d tokens x %d rows, %d threads, %d rows a call, best of %d\n",
         moe_cpu_info(), n, mib, tokens, prefill_rows, threads, MOE__QDOT_ROWS, reps);
  printf("%-6s %-13s %11s %10s %10s %14s\n", "type", "version", "decode_GB/s", "row_GB/s", "read_GB/s", "prefill_GMAC/s");
  char list[256];
  snprintf(list, sizeof list, "%s", types);
  for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
    moe_gguf_type ty;
    if (moe_gguf_type_parse(name, "--types", &ty) != MOE_OK || !moe__qdot_has(ty)) {
      fprintf(stderr, "qdot_kernels: no dot product for type %s\n", name);
      return 2;
    }
    size_t rb = (size_t)n / moe_gguf_type_block(ty) * moe_gguf_type_block_bytes(ty), ab = moe__act_bytes(ty, n);
    int64_t rows = (int64_t)(bytes / rb);
    fill_weights(ty, w, (size_t)rows * (rb / moe_gguf_type_block_bytes(ty)), &seed);
    for (int t = 0; t < tokens; t++) moe__act_quantize(ty, x + (size_t)t * n, a + (size_t)t * ab, n);
    /* versions: AVX2, AVX-512 without GFNI, AVX-512 with GFNI's nibble split where the type has it */
    moe__qrun_gfni(1);
    moe__qrun_fn with = moe__qrun_kernel(ty, MOE__ISA_AVX512);
    moe__qrun_gfni(0);
    int versions = with && with != moe__qrun_kernel(ty, MOE__ISA_AVX512) ? 3 : 2;
    double best[3][4] = {{0}}; /* [version][decode, a row a call, read, prefill] */
    for (int rep = 0; rep < reps; rep++)
      for (int v = 0; v < versions; v++) {
        moe__isa isa = v ? MOE__ISA_AVX512 : MOE__ISA_AVX2;
        moe__qdot_fn f = moe__qdot_kernel(ty, isa);
        if (!f) continue;
        moe__qrun_gfni(v == 2);
        moe__qkern kern = {f, moe__qdot4_kernel(ty, isa), moe__qrun_kernel(ty, isa)};
        double t0 = now();
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t o = 0; o < rows; o += MOE__QROWS_TILE)
          moe__qrows_times(&kern, w, rb, (int)o, (int)(o + MOE__QROWS_TILE < rows ? o + MOE__QROWS_TILE : rows), a, ab, 1, n,
                           out, 0, 0);
        double dec = (double)rows * rb / (now() - t0) / 1e9;
        t0 = now();
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t o = 0; o < rows; o++) f(w + (size_t)o * rb, a, ab, 1, n, out + o);
        double one = (double)rows * rb / (now() - t0) / 1e9, rd = read_loop(w, (size_t)rows * rb, threads);
        t0 = now();
        moe__qdot4_fn f4 = moe__qdot4_kernel(ty, isa); /* four weight rows a call, as moe__qrows_times */
        int rows = f4 ? MOE__QDOT4_ROWS : MOE__QDOT_ROWS;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int ob = 0; ob < prefill_rows; ob += wrows)
          for (int r = 0; r < tokens; r += rows)
            for (int o = ob; o < ob + wrows; o += f4 ? 4 : 1) {
              int nr = tokens - r < rows ? tokens - r : rows;
              if (f4) f4(w + (size_t)o * rb, rb, a + (size_t)r * ab, ab, nr, n, out + (size_t)o * tokens + r);
              else f(w + (size_t)o * rb, a + (size_t)r * ab, ab, nr, n, out + (size_t)o * tokens + r);
            }
        double pre = (double)tokens * prefill_rows * n / (now() - t0) / 1e9;
        double r[4] = {dec, one, rd, pre};
        for (int k = 0; k < 4; k++)
          if (r[k] > best[v][k]) best[v][k] = r[k];
      }
    moe__qrun_gfni(1);
    for (int v = 0; v < versions; v++)
      if (best[v][0] > 0)
        printf("%-6s %-13s %11.1f %10.1f %10.1f %14.1f\n", moe_gguf_type_name(ty),
               v == 2 ? "AVX-512 GFNI" : moe__isa_name(v ? MOE__ISA_AVX512 : MOE__ISA_AVX2), best[v][0], best[v][1],
               best[v][2], best[v][3]);
    fflush(stdout);
  }
  free(w), free(x), free(out), free(a);
  return 0;
}
