/* --parallel-r (Tutel's adaptive parallelism r, moe_layer_config.parallel_r): its values. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_parse_parallel_r(const char *s, int *out) {
  if (!strcmp(s, "auto")) {
    *out = MOE_PARALLEL_AUTO;
    return 1;
  }
  return cli_parse_int(s, out) && *out >= 0;
}

int cli_parse_parallel_rs(const char *s, int *out, int max) {
  int n = 0;
  char buf[32];
  while (*s) {
    size_t len = strcspn(s, ",");
    if (n == max || len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, s, len);
    buf[len] = 0;
    if (!cli_parse_parallel_r(buf, &out[n++])) return 0;
    s += len;
    if (*s && !*++s) return 0; /* a trailing comma */
  }
  return n;
}
