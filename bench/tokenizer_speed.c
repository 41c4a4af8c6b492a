/* Encoding speed of a tokenizer.json (BENCHMARKS.md, issue 37): the public API only.
 * usage: tokenizer_speed TOKENIZER TEXT [REPEATS]
 * Loads TOKENIZER (a tokenizer.json or its directory), reads TEXT, encodes its lines one call each
 * (as a server encodes prompts) REPEATS times (default 3) and prints the best pass:
 *   tokenizer_speed: <MB/s> MB/s <ids> ids <bytes> bytes
 * bench/tokenizer_speed.js measures @lenml/tokenizers the same way; bench/tokenizer_speed.sh alternates them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 3) return fprintf(stderr, "usage: tokenizer_speed TOKENIZER TEXT [REPEATS]\n"), 2;
  int repeats = argc > 3 ? atoi(argv[3]) : 3;
  moe_tokenizer *t;
  if (moe_tokenizer_load(&t, argv[1])) return fprintf(stderr, "tokenizer_speed: %s\n", moe_last_error()), 1;
  FILE *f = fopen(argv[2], "rb");
  if (!f) return fprintf(stderr, "tokenizer_speed: cannot open %s\n", argv[2]), 1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n + 1);
  if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) return fprintf(stderr, "tokenizer_speed: cannot read %s\n", argv[2]), 1;
  fclose(f);
  text[n] = 0;
  double best = 1e30;
  size_t total = 0;
  for (int r = 0; r < repeats; r++) {
    total = 0;
    double t0 = now();
    for (char *line = text, *end; line < text + n; line = end + 1) {
      end = memchr(line, '\n', (size_t)(text + n - line));
      if (!end) end = text + n;
      int32_t *ids;
      size_t k;
      if (moe_tokenizer_encode_alloc(t, line, (size_t)(end - line) + (end < text + n), 0, &ids, &k))
        return fprintf(stderr, "tokenizer_speed: %s\n", moe_last_error()), 1;
      total += k;
      free(ids);
    }
    double s = now() - t0;
    if (s < best) best = s;
  }
  printf("tokenizer_speed: %.2f MB/s %zu ids %ld bytes\n", (double)n / best / 1e6, total, n);
  moe_tokenizer_free(t);
  free(text);
  return 0;
}
