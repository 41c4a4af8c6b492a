/* Decode speed by the thread that decodes (issue 36; BENCHMARKS "Decoding on another thread"): a random
 * language model of the shape moe train --task lm makes by default at 2 layers (vocab 4096, D 128, H 256,
 * 8 experts top-2, 4 heads of 32, max_seq 64), 60 tokens decoded one at a time after a warm-up run on the
 * same thread, in one of four ways:
 *   main              on the thread that built the model
 *   thread            on a new thread only
 *   main-then-thread  on a new thread after the building thread decoded (its OpenMP team kept)
 *   main-release      the same after moe_threads_release on the building thread
 * usage: decode_threads MODE [THREADS (default 2)]; prints "MODE tokens/s". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe.h"

enum { TOKENS = 60 };
static moe_lm_t m;
static double rate;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *decode(void *arg) {
  (void)arg;
  moe_lm_cache *c;
  if (moe_lm_cache_new(&c, &m, 1)) return fprintf(stderr, "%s\n", moe_last_error()), exit(1), NULL;
  int32_t tok = 1;
  double t0 = now();
  for (int i = 0; i < TOKENS; i++) {
    if (moe_lm_decode(&m, c, &tok, 1)) fprintf(stderr, "%s\n", moe_last_error()), exit(1);
    tok = (tok * 7 + 3) % 50;
  }
  rate = TOKENS / (now() - t0);
  moe_lm_cache_free(c);
  return NULL;
}

static void *twice(void *arg) { /* a warm-up, then the measured run */
  decode(arg);
  return decode(arg);
}

static void on_new_thread(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, twice, NULL)) fprintf(stderr, "pthread_create failed\n"), exit(1);
  pthread_join(t, NULL);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.moe.D = 128, c.moe.H = 256, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 32, c.max_seq = 64;
  c.moe.threads = argc > 2 ? atoi(argv[2]) : 2;
  if (moe_lm_init(&m, &c)) return fprintf(stderr, "%s\n", moe_last_error()), 1;
  moe_lm_init_params(&m, 1);
  if (!strcmp(mode, "main")) twice(NULL);
  else if (!strcmp(mode, "thread")) on_new_thread();
  else if (!strcmp(mode, "main-then-thread")) decode(NULL), on_new_thread();
  else if (!strcmp(mode, "main-release")) decode(NULL), moe_threads_release(), on_new_thread();
  else return fprintf(stderr, "usage: decode_threads main|thread|main-then-thread|main-release [THREADS]\n"), 2;
  printf("%s %.0f\n", mode, rate);
  moe_lm_free(&m);
  return 0;
}
