/* The machine's read bandwidth, the bound a decode's weight reads run against (issue 41; bench/vs_llamacpp.sh
 * reports each type's decode as a share of it): THREADS OpenMP threads each sum their contiguous part
 * of a buffer of MIB MiB (default 1024: far past any cache), 64-bit integer sums in 4 chains the
 * compiler vectorizes; the best of REPS passes (default 5) after one that touches the pages.
 * usage: read_bandwidth [THREADS (2)] [MIB (1024)] [REPS (5)]; prints "read GB/s <best> threads <n>". */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t sum_part(const uint64_t *p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
  return s0 + s1 + s2 + s3;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 3 ? atoi(argv[3]) : 5;
  size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024, n = mib << 17; /* 64-bit words */
  if (threads < 1 || reps < 1 || mib < 1) {
    fprintf(stderr, "usage: read_bandwidth [THREADS >= 1] [MIB >= 1] [REPS >= 1]\n");
    return 2;
  }
  uint64_t *buf = aligned_alloc(64, n * sizeof *buf);
  if (!buf) {
    fprintf(stderr, "read_bandwidth: cannot allocate %zu MiB\n", mib);
    return 1;
  }
  memset(buf, 1, n * sizeof *buf);
  double best = 0;
  uint64_t check = 0;
  for (int r = 0; r <= reps; r++) { /* pass 0 warms up */
    uint64_t total = 0;
    double t = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      int k = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t lo = n / nt * k, hi = k == nt - 1 ? n : n / nt * (k + 1);
      total += sum_part(buf + lo, hi - lo);
    }
    t = omp_get_wtime() - t;
    double gbs = (double)n * sizeof *buf / t / 1e9;
    if (r && gbs > best) best = gbs;
    check = total;
  }
  if (check != (uint64_t)0x0101010101010101ull * (n & ~(size_t)3)) { /* the sums were really taken */
    fprintf(stderr, "read_bandwidth: wrong sum %llu\n", (unsigned long long)check);
    return 1;
  }
  printf("read GB/s %.1f threads %d\n", best, threads);
  free(buf);
  return 0;
}
