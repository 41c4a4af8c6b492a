/* The wrappers and the loop of alloc_fail.h. The counter is atomic: OpenMP threads may allocate. */
#include "alloc_fail.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
ssize_t __real_getline(char **line, size_t *cap, FILE *f);
ssize_t __real___getdelim(char **line, size_t *cap, int delim, FILE *f); /* getline, inlined by glibc at -O2 */

static long counting, fail_at, seen; /* seen: allocations counted since counting began */

/* Whether this allocation is the one to fail. */
static int fail_now(void) {
  if (!__atomic_load_n(&counting, __ATOMIC_SEQ_CST)) return 0;
  if (__atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST) != fail_at) return 0;
  errno = ENOMEM;
  return 1;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t k, size_t n) { return fail_now() ? NULL : __real_calloc(k, n); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { return fail_now() ? NULL : __real_aligned_alloc(a, n); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : __real_strdup(s); }
char *__wrap_strndup(const char *s, size_t n) { return fail_now() ? NULL : __real_strndup(s, n); }
ssize_t __wrap_getline(char **line, size_t *cap, FILE *f) { return fail_now() ? -1 : __real_getline(line, cap, f); }
ssize_t __wrap___getdelim(char **line, size_t *cap, int delim, FILE *f) {
  return fail_now() ? -1 : __real___getdelim(line, cap, delim, f);
}

static void count_from(long n) {
  __atomic_store_n(&seen, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&fail_at, n, __ATOMIC_SEQ_CST);
  __atomic_store_n(&counting, 1, __ATOMIC_SEQ_CST);
}

/* Allocations made since count_from; counting stops. */
static long count_stop(void) {
  __atomic_store_n(&counting, 0, __ATOMIC_SEQ_CST);
  return __atomic_load_n(&seen, __ATOMIC_SEQ_CST);
}

long alloc_fail_run(const alloc_path *p) {
  static int hooked;
  if (!hooked) { /* cJSON's allocations for libmoe (headers, placements) are counted too */
    cJSON_InitHooks(&(cJSON_Hooks){.malloc_fn = __wrap_malloc, .free_fn = free});
    hooked = 1;
  }
  for (long n = 1;; n++) {
    if (p->setup && p->setup() != MOE_OK) {
      fprintf(stderr, "  %s: setup failed: %s\n", p->name, moe_last_error());
      return -1;
    }
    count_from(n);
    moe_status st = p->op();
    const long made = count_stop();
    if (p->teardown) p->teardown();
    if (made < n) { /* nothing failed: the call must have succeeded */
      if (st == MOE_OK) return n - 1;
      fprintf(stderr, "  %s: %s with no allocation failing: %s\n", p->name, moe_status_name(st), moe_last_error());
      return -1;
    }
    if (st != MOE_ERR_NOMEM || !moe_last_error()[0]) {
      fprintf(stderr, "  %s: allocation %ld of %ld failed but the call gave %s (%s), want MOE_ERR_NOMEM\n", p->name,
              n, made, moe_status_name(st), moe_last_error());
      return -1;
    }
  }
}
