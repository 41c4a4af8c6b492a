/* The language-model tests' corpus and JSON numbers (lm_corpus.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_corpus.h"
#include "test.h"

static const char *const SENTENCES[] = {
    "the cat sat on the mat.", "a dog ran to the park.", "the experts route every token.",
    "she read the old book by the fire.", "we walked home in the rain.",
};

/* DIR/{train,valid,test}.txt: 40, 6 and 6 documents of 5 lines, each line a sentence picked by an LCG. */
const char *lm_corpus(void) {
  static char dir[512];
  static int done;
  if (done) return dir;
  char cmd[1024], path[600];
  test_tmp_path("lm_corpus", dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  if (system(cmd)) return dir;
  static const char *const splits[] = {"train", "valid", "test"};
  static const int docs[] = {40, 6, 6};
  uint32_t s = 7;
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s.txt", dir, splits[i]);
    FILE *f = fopen(path, "wb");
    if (!f) return dir;
    for (int d = 0; d < docs[i]; d++)
      for (int l = 0; l < 5; l++) {
        s = s * 1664525u + 1013904223u;
        fprintf(f, "%s%s", d && !l ? "\n" : "", SENTENCES[(s >> 16) % 5]);
        fputs(l < 4 || d + 1 < docs[i] ? "\n" : "", f);
      }
    fclose(f);
  }
  done = 1;
  return dir;
}

/* The value of "key": in the first line of text (from p on) that has it; NAN when none. */
double json_num(const char *text, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\": ", key);
  const char *p = strstr(text, k);
  return p ? strtod(p + strlen(k), NULL) : NAN;
}

/* The lines of text holding "valid_loss", their values in v (at most n); their count. */
int valid_losses(const char *text, double *v, int n) {
  int k = 0;
  for (const char *p = text; k < n && (p = strstr(p, "\"valid_loss\": ")); p++) v[k++] = json_num(p, "valid_loss");
  return k;
}

/* The --log-steps lines of text ({"step": N, "loss": X}, not the reports) appended to dst. */
void step_lines(const char *text, char *dst, size_t n) {
  for (const char *p = text; (p = strstr(p, "{\"step\": ")); p++) {
    const char *e = strchr(p, '\n'), *lr = strstr(p, "\"lr\"");
    size_t k = strlen(dst);
    if (e && (!lr || lr > e) && k + (size_t)(e - p) + 2 < n) strncat(dst, p, (size_t)(e - p + 1));
  }
}
