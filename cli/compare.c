/* moe compare: checks every tensor of a reference file against the same tensor of another file
 * (floats within --rtol of the reference's largest magnitude, integers exactly), prints one line
 * per tensor (--json: a JSON line per tensor, then one of the totals) and exits non-zero on any
 * difference or missing tensor. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *CMD = "compare";

/* Largest |a - b| over the tensor, and the largest |b|. */
static void diff(const moe_tensor_view *a, const moe_tensor_view *b, double *err, double *mag) {
  size_t n = b->nbytes / moe_dtype_size(b->dtype);
  *err = *mag = 0;
  for (size_t i = 0; i < n; i++) {
    double x, y;
    if (b->dtype == MOE_DT_F32) {
      x = ((const float *)a->data)[i];
      y = ((const float *)b->data)[i];
    } else {
      x = ((const int32_t *)a->data)[i];
      y = ((const int32_t *)b->data)[i];
    }
    double e = fabs(x - y);
    *err = e > *err || isnan(e) ? e : *err;
    *mag = fabs(y) > *mag ? fabs(y) : *mag;
  }
}

/* A tensor of REF that cannot be compared: the reason on stderr, and under --json as its line too. */
static void uncomparable(int json, const char *name, const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  fprintf(stderr, "moe compare: %s\n", why);
  if (!json) return;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "tensor", name);
  cJSON_AddBoolToObject(o, "ok", 0);
  cJSON_AddStringToObject(o, "error", why);
  cli_json_line(o);
}

static int compare(const moe_st *got, const moe_st *ref, float rtol, int json) {
  int bad = 0;
  for (int i = 0; i < moe_st_count(ref); i++) {
    moe_tensor_view b, a;
    if (moe_st_at(ref, i, &b) != MOE_OK) return cli_fail(CMD);
    if (b.dtype != MOE_DT_F32 && b.dtype != MOE_DT_I32) {
      uncomparable(json, b.name, "%s: cannot compare dtype %s", b.name, moe_dtype_name(b.dtype));
      bad++;
      continue;
    }
    if (moe_st_get(got, b.name, &a) != MOE_OK) {
      uncomparable(json, b.name, "%s", moe_last_error());
      bad++;
      continue;
    }
    int same = a.dtype == b.dtype && a.ndim == b.ndim;
    for (int d = 0; same && d < a.ndim; d++) same = a.shape[d] == b.shape[d];
    if (!same) {
      uncomparable(json, b.name, "%s: dtype or shape differs (%s, %d dims, %zu bytes vs %s, %d dims, %zu bytes)", b.name,
                   moe_dtype_name(a.dtype), a.ndim, a.nbytes, moe_dtype_name(b.dtype), b.ndim, b.nbytes);
      bad++;
      continue;
    }
    double err, mag;
    diff(&a, &b, &err, &mag);
    double rel = mag > 0 ? err / mag : err;
    int ok = b.dtype == MOE_DT_I32 ? err == 0 : rel <= rtol;
    if (json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "tensor", b.name);
      cJSON_AddNumberToObject(o, "max_abs_err", isfinite(err) ? err : -1);
      cJSON_AddNumberToObject(o, "rel", isfinite(rel) ? rel : -1);
      cJSON_AddBoolToObject(o, "ok", ok);
      cli_json_line(o);
    } else {
      printf("%-28s max abs err %.3g  rel %.3g  %s\n", b.name, err, rel, ok ? "ok" : "DIFFERS");
    }
    bad += !ok;
  }
  if (json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tensors", moe_st_count(ref));
    cJSON_AddNumberToObject(o, "differ", bad);
    cJSON_AddNumberToObject(o, "rtol", rtol);
    cli_json_line(o);
  }
  return bad ? 1 : 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: moe compare OUT.safetensors REF.safetensors [--rtol X] [--json]\n"
             "Compares every tensor of REF with OUT's (floats within X relative, default 1e-5; integers\n"
             "exactly); exits 1 when one differs. --json: a JSON line per tensor (max_abs_err and rel -1\n"
             "when not finite), then {\"tensors\", \"differ\", \"rtol\"}.\n");
}

int cmd_compare(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  float rtol = 1e-5f;
  const char *files[2] = {NULL, NULL};
  int nf = 0, json = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_flag_is(argv[i], "json")) {
      json = 1;
    } else if (cli_flag_is(argv[i], "rtol") && i + 1 < argc) {
      if (!cli_parse_float(argv[++i], &rtol) || rtol < 0)
        return cli_usage_error(CMD, "--rtol: '%s' is not a non-negative number", argv[i]);
    } else if (nf < 2 && strncmp(argv[i], "--", 2)) {
      files[nf++] = argv[i];
    } else {
      return cli_usage_error(CMD, "unexpected argument '%s'", argv[i]);
    }
  }
  if (nf != 2) {
    usage(stderr);
    return cli_usage_error(CMD, "two files are needed, OUT and REF");
  }
  moe_st *got = NULL, *ref = NULL;
  int rc = (moe_st_open(&got, files[0]) || moe_st_open(&ref, files[1])) ? cli_fail(CMD) : compare(got, ref, rtol, json);
  moe_st_close(got);
  moe_st_close(ref);
  return rc;
}
