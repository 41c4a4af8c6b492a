/* Forward + backward throughput of the language model (moe_lm_*) at one configuration: tokens/s over
 * a few steps after a warm-up, random tokens; and per CPU-second (the process's CPU time), which a
 * machine shared with other jobs changes less than the wall time. Built against the shared library:
 *   gcc -O2 -Iinclude bench/lm_step.c -Lbuild -lmoe -Wl,-rpath,$PWD/build -o build/lm_step
 *   build/lm_step [D L T B E k threads]   (default 256 4 256 8 8 2 0: vocab 4096, head_dim 32, H = 2 D) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "moe.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  const char *core = moe_blas_better_coretype(); /* the AVX-512 kernels, as the moe command gets them */
  if (core && setenv("OPENBLAS_CORETYPE", core, 1) == 0 && setenv("MOE_BLAS_REEXEC", "1", 1) == 0)
    execv("/proc/self/exe", argv);
  int v[7] = {256, 4, 256, 8, 8, 2, 0};
  for (int i = 1; i < argc && i <= 7; i++) v[i - 1] = atoi(argv[i]);
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.moe.D = v[0], c.n_layers = v[1], c.max_seq = v[2], c.moe.E = v[4], c.moe.top_k = v[5], c.moe.threads = v[6];
  c.moe.H = 2 * v[0], c.n_heads = v[0] / 32, c.n_kv_heads = c.n_heads / 2 > 0 ? c.n_heads / 2 : 1;
  int B = v[3], T = v[2], N = B * T;
  moe_lm_t m;
  if (moe_lm_init(&m, &c)) return fprintf(stderr, "%s\n", moe_last_error()), 1;
  moe_lm_init_params(&m, 1);
  int32_t *tok = malloc((size_t)(N + 1) * 4);
  for (int i = 0; i <= N; i++) tok[i] = (int32_t)((i * 2654435761u) % (unsigned)c.vocab);
  double t0 = 0;
  clock_t c0 = 0;
  moe_lm_stats st;
  for (int s = 0; s < 4; s++) {
    if (s == 1) t0 = now(), c0 = clock();
    moe_lm_zero_grad(&m);
    if (moe_lm_forward(&m, tok, tok + 1, B, T, &st) || moe_lm_backward(&m))
      return fprintf(stderr, "%s\n", moe_last_error()), 1;
  }
  double dt = (now() - t0) / 3, cpu = (double)(clock() - c0) / CLOCKS_PER_SEC / 3;
  printf("D=%d layers=%d T=%d B=%d E=%d k=%d params=%zu: %.3f s/step, %.0f tokens/s (fwd+bwd), %.0f tokens per "
         "CPU-second, loss %.4f\n", v[0], v[1], T, B, v[4], v[5], m.numel, dt, N / dt, N / cpu, st.loss);
  moe_lm_free(&m);
  free(tok);
  return 0;
}
