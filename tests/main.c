/* Test runner. `moe_tests` runs every registered test (`moe_tests TEXT`: those whose name contains
 * TEXT) and prints "N passed, N failed, N skipped", exiting non-zero on any failure; `--list` prints
 * the names, one a line; `--run NAME` runs that test alone and exits 0 (passed), 1 (failed) or
 * TEST_SKIP_CODE (skipped), which is how ctest runs each (cmake/discover_tests.cmake). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

#define MAX_TESTS 1024
static struct { const char *name; test_fn fn; } tests[MAX_TESTS];
static int ntests;
static char tmpdir[256];
static int skipped; /* the running test called test_skip */

void test_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  SKIP: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  skipped = 1;
}

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

static int run_one(int i) {
  int f = 0;
  skipped = 0;
  tests[i].fn(&f);
  printf("%s %s\n", f ? "FAIL" : skipped ? "skip" : "ok  ", tests[i].name);
  fflush(stdout);
  return f ? 1 : skipped ? TEST_SKIP_CODE : 0;
}

static int usage(void) {
  fprintf(stderr, "usage: moe_tests [TEXT | --list | --run NAME]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--list")) {
    for (int i = 0; i < ntests; i++) printf("%s\n", tests[i].name);
    return 0;
  }
  int exact = argc > 1 && !strcmp(argv[1], "--run");
  if (exact && argc != 3) return usage();
  const char *filter = argc > 1 + exact ? argv[1 + exact] : NULL;
  if (filter && filter[0] == '-') return usage();
  snprintf(tmpdir, sizeof tmpdir, "/tmp/moe-tests-XXXXXX");
  if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
  /* Open MPI's session directories under this process's own: two tests starting mpirun at once
   * raced creating the shared /tmp/ompi.HOST.UID ("mkdir: File exists", orte_init failed). */
  setenv("OMPI_MCA_orte_tmpdir_base", tmpdir, 1);
  int passed = 0, failed = 0, skips = 0, last = 0;
  for (int i = 0; i < ntests; i++) {
    if (filter && (exact ? strcmp(tests[i].name, filter) : !strstr(tests[i].name, filter))) continue;
    last = run_one(i);
    if (last == 1) failed++; else if (last) skips++; else passed++;
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skips);
  if (exact && passed + failed + skips == 0) {
    fprintf(stderr, "no test named %s (--list lists them)\n", filter);
    return 1;
  }
  return failed ? 1 : exact ? last : 0;
}
