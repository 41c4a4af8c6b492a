/* --parallel-r (Tutel's adaptive parallelism r, moe_layer_config.parallel_r) and --a2a: their values,
 * and the entry of the layer's dictionary of setups that the commands print. */
#include <stdio.h>
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

int cli_parse_a2a(const char *s, moe_a2a *algo, int *autom) {
  *autom = !strcmp(s, "auto");
  *algo = strcmp(s, "linear") ? MOE_A2A_2DH : MOE_A2A_LINEAR;
  return *autom || !strcmp(s, "linear") || !strcmp(s, "2dh");
}

void cli_setup_text(const moe_layer_t *l, int json, char *buf, size_t n) {
  moe_layer_setup_info i;
  *buf = 0;
  if (!moe_layer_setup(l, &i)) return;
  if (!json) {
    char line[512];
    moe_layer_setup_format(&i, line, sizeof line);
    snprintf(buf, n, "     dictionary: %s", line);
    return;
  }
  snprintf(buf, n, ", \"setup\": {\"capacity\": %d, \"key\": %d, \"window\": %d, \"r\": %d, \"n\": %d, \"a2a\": \"%s\", "
           "\"trial\": %s, \"searched\": \"%s%s%s\", \"trials\": %lld, \"entries\": %d, \"bound\": %.1f, \"note\": \"%s\"}",
           i.capacity, i.key, i.window, i.r, i.n, i.a2a == MOE_A2A_2DH ? "2dh" : "linear", i.trial ? "true" : "false",
           i.searched & 1 ? "r" : "", i.searched & 2 ? "n" : "", i.searched & 4 ? "a2a" : "", i.trials, i.entries,
           i.bound, i.note);
}
