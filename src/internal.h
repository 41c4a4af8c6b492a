/* Internal helpers shared by the library's files: error recording and the check macro.
 * Nothing here is exported; internal non-static symbols start with moe__. */
#ifndef MOE_INTERNAL_H
#define MOE_INTERNAL_H

#include "moe.h"

/* Records "file:line: message" as the thread's last error and returns st. */
moe_status moe__error(moe_status st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Check cond; on failure record the message and return st from the calling function. */
#define MOE_TRY(cond, st, ...)                                                  \
  do {                                                                          \
    if (!(cond)) return moe__error((st), __FILE__, __LINE__, __VA_ARGS__);      \
  } while (0)

/* Propagate a failing status unchanged (the callee already set the message). */
#define MOE_CHECK(expr)                                                         \
  do {                                                                          \
    moe_status moe__s = (expr);                                                 \
    if (moe__s != MOE_OK) return moe__s;                                        \
  } while (0)

#endif
