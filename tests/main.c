/* Test runner: runs every registered test (or those whose name contains argv[1]) and prints
 * "N passed, N failed"; exits non-zero on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

#define MAX_TESTS 512
static struct { const char *name; test_fn fn; } tests[MAX_TESTS];
static int ntests;
static char tmpdir[256];

void test_register(const char *name, test_fn fn) {
  if (ntests == MAX_TESTS) { fprintf(stderr, "too many tests\n"); abort(); }
  tests[ntests].name = name;
  tests[ntests].fn = fn;
  ntests++;
}

const char *test_fixture_dir(void) {
  const char *d = getenv("MOE_FIXTURES");
  return d ? d : MOE_FIXTURE_DIR;
}

const char *test_tmp_path(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s/%s", tmpdir, name);
  return buf;
}

char *test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  char *b = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (!b) return NULL;
  b[n] = 0;
  if (len) *len = (size_t)n;
  return b;
}

int test_same_file(const char *a, const char *b) {
  size_t na, nb;
  char *da = test_read_file(a, &na), *db = test_read_file(b, &nb);
  int same = da && db && na == nb && !memcmp(da, db, na);
  if (!same) fprintf(stderr, "  %s and %s differ (or cannot be read)\n", a, b);
  free(da);
  free(db);
  return same;
}

size_t test_read_text(const char *path, char *dst, size_t n) {
  FILE *f = fopen(path, "r");
  size_t got = f && n ? fread(dst, 1, n - 1, f) : 0;
  if (n) dst[got] = 0;
  if (f) fclose(f);
  return got;
}

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/moe-tests-XXXXXX");
  if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
  int passed = 0, failed = 0;
  for (int i = 0; i < ntests; i++) {
    if (filter && !strstr(tests[i].name, filter)) continue;
    int f = 0;
    tests[i].fn(&f);
    printf("%s %s\n", f ? "FAIL" : "ok  ", tests[i].name);
    fflush(stdout);
    if (f) failed++; else passed++;
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
