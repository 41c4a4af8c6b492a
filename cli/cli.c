/* Helpers shared by the subcommands (see cli.h). */
#include <math.h>
#include <sched.h>
#include <time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "rank_errors.h"

int cli_fail(const char *cmd) {
  cli_report(cmd, moe_last_error());
  return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cli_report(cmd, msg);
  return 1;
}

int cli_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
  return 0;
}

int cli_flag_is(const char *arg, const char *name) {
  if (strncmp(arg, "--", 2)) return 0;
  arg += 2;
  for (; *arg && *name; arg++, name++) {
    char a = *arg == '-' ? '_' : *arg, b = *name == '-' ? '_' : *name;
    if (a != b) return 0;
  }
  return !*arg && !*name;
}

int cli_parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < -1000000000L || v > 1000000000L) return 0;
  *out = (int)v;
  return 1;
}

void cli_json_line(cJSON *o) {
  char *text = cJSON_PrintUnformatted(o);
  if (text) printf("%s\n", text);
  cJSON_free(text);
  cJSON_Delete(o);
}

int cli_parse_pipeline(const char *s, int *out) {
  if (!strcmp(s, "auto")) {
    *out = 0;
    return 1;
  }
  return cli_parse_int(s, out) && *out >= 1;
}

int cli_parse_float(const char *s, float *out) {
  char *end;
  float v = strtof(s, &end);
  if (!*s || *end || !isfinite(v)) return 0;
  *out = v;
  return 1;
}

int cli_parse_mib(const char *s, size_t *bytes) {
  float v;
  if (!cli_parse_float(s, &v) || v <= 0 || v > 1e9) return 0;
  *bytes = (size_t)((double)v * 1048576.0);
  return 1;
}

int cli_task_is_lm(const char *cmd, int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i++)
    if (cli_flag_is(argv[i], "task")) {
      if (!strcmp(argv[i + 1], "lm") || !strcmp(argv[i + 1], "classifier")) return !strcmp(argv[i + 1], "lm");
      return cli_usage_error(cmd, "--task: '%s' is not lm or classifier", argv[i + 1]), -1;
    }
  return 0;
}

double cli_hash(const void *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
  return (double)(h >> 12);
}

int cli_cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void cli_sort_doubles(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

double cli_median(double *v, int n) {
  cli_sort_doubles(v, n);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double cli_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
