/* Status names and the per-thread last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char last_error[1024];

const char *moe_status_name(moe_status s) {
  switch (s) {
#define MOE__NAME(e, str) case e: return #e;
    MOE_STATUS_LIST(MOE__NAME)
#undef MOE__NAME
    default: return "MOE_ERR_UNKNOWN";
  }
}

const char *moe_status_str(moe_status s) {
  switch (s) {
#define MOE__STR(e, str) case e: return str;
    MOE_STATUS_LIST(MOE__STR)
#undef MOE__STR
    default: return "unknown status";
  }
}

const char *moe_last_error(void) { return last_error; }

/* The arguments may include moe_last_error() itself (a prefix to it): formatted aside, then copied. */
static moe_status set_error(moe_status st, const char *fmt, va_list ap) {
  char msg[sizeof last_error];
  vsnprintf(msg, sizeof msg, fmt, ap);
  memcpy(last_error, msg, sizeof msg);
  return st;
}

moe_status moe__error(moe_status st, const char *file, int line, const char *fmt, ...) {
  (void)file;
  (void)line;
  va_list ap;
  va_start(ap, fmt);
  st = set_error(st, fmt, ap);
  va_end(ap);
  return st;
}

moe_status moe_last_error_set(moe_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st = set_error(st, fmt, ap);
  va_end(ap);
  return st;
}
