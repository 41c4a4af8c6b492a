/* Allocation-failure injection (libuv's habit): this executable is linked with
 * -Wl,--wrap=malloc,... so that every allocation libmoe's objects (and cJSON, through its hooks) make
 * goes through counting wrappers, which can make the n-th one fail. */
#ifndef MOE_ALLOC_FAIL_H
#define MOE_ALLOC_FAIL_H

#include "moe.h"

/* One public path: setup (not counted; may be NULL) prepares the test's state, op is the call
 * under test, teardown (may be NULL) frees what setup and a successful op made. */
typedef struct {
  const char *name;
  moe_status (*setup)(void);
  moe_status (*op)(void);
  void (*teardown)(void);
} alloc_path;

/* Runs p with allocation n failing for n = 1, 2, ... until op makes no n-th allocation and then
 * succeeds. Each injected failure must give MOE_ERR_NOMEM and a message; leaks are ASan's to find.
 * Returns the number of failures injected, or -1 after printing what went wrong. */
long alloc_fail_run(const alloc_path *p);

#endif
