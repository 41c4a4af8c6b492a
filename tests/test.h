/* A minimal test registry and assertion macros. Each test file defines tests with TEST(name) and
 * the runner (tests/main.c) runs them, printing "N passed, N failed, N skipped". An ASSERT prints both
 * expressions and values, then fails the current test. */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe.h"

typedef void (*test_fn)(int *failed);
void test_register(const char *name, test_fn fn);
/* Marks the running test skipped (it could not run here: a missing tool, CPU feature or data set),
 * printing why; a failure still counts as one. SKIP returns from the test too. */
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define SKIP(...) do { test_skip(__VA_ARGS__); return; } while (0)
/* The exit status of `moe_tests --run NAME` for a skipped test (ctest's SKIP_RETURN_CODE). */
#define TEST_SKIP_CODE 77

#define TEST(name)                                                              \
  static void test_##name(int *failed_);                                        \
  __attribute__((constructor)) static void register_##name(void) {              \
    test_register(#name, test_##name);                                          \
  }                                                                             \
  static void test_##name(int *failed_)

#define FAIL_(...)                                                              \
  do {                                                                          \
    fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                           \
    fprintf(stderr, __VA_ARGS__);                                               \
    fprintf(stderr, "\n");                                                      \
    *failed_ = 1;                                                               \
    return;                                                                     \
  } while (0)

#define ASSERT(c)                                                               \
  do { if (!(c)) FAIL_("ASSERT(%s) failed", #c); } while (0)
#define ASSERT_EQ_INT(a, b)                                                     \
  do { long long a_ = (long long)(a), b_ = (long long)(b);                      \
    if (a_ != b_) FAIL_("%s == %s: %lld != %lld", #a, #b, a_, b_); } while (0)
#define ASSERT_NEAR(a, b, tol)                                                  \
  do { double a_ = (double)(a), b_ = (double)(b);                               \
    if (!(fabs(a_ - b_) <= (tol)))                                              \
      FAIL_("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, a_, b_, (double)(tol)); } while (0)
/* A call that must succeed: prints moe_last_error() otherwise. */
#define ASSERT_OK(expr)                                                         \
  do { moe_status s_ = (expr);                                                  \
    if (s_ != MOE_OK) FAIL_("%s -> %s: %s", #expr, moe_status_name(s_), moe_last_error()); } while (0)
/* A call that must fail with status st. */
#define ASSERT_STATUS(expr, st)                                                 \
  do { moe_status s_ = (expr);                                                  \
    if (s_ != (st)) FAIL_("%s -> %s, want %s (%s)", #expr, moe_status_name(s_),  \
                          moe_status_name(st), moe_last_error()); } while (0)

/* Directory holding tests/fixtures, set by the runner from argv or MOE_FIXTURES. */
const char *test_fixture_dir(void);
/* A fresh scratch path "<tmpdir>/<name>" for files a test writes. */
const char *test_tmp_path(const char *name, char *buf, size_t n);
/* The whole file, NUL-terminated, in a malloc'd buffer (its length in *len if not NULL); NULL if it
 * cannot be read. */
char *test_read_file(const char *path, size_t *len);
/* Whether files a and b hold the same bytes; says which differ otherwise. */
int test_same_file(const char *a, const char *b);
/* At most n - 1 bytes of the file into dst, NUL-terminated (empty if it cannot be read). */
size_t test_read_text(const char *path, char *dst, size_t n);

#endif
