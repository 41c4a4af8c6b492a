/* moe placement: expert placement over N devices from a trace (deployment paper VII). Fits greedy
 * or anti-correlation placement per layer on the first half of the trace's steps and evaluates it on
 * the second half against the contiguous expert-parallel layout (expert m on device m / (E/N)),
 * printing Max Load and Avg Max Load of both; --out writes the placement as JSON, atomically; --json
 * prints a JSON line per layer instead (and the heading to stderr). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "placement_flex.h"

static const char *CMD = "placement";

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe placement --trace T --devices N --method greedy|anticorr [--out placement.json]\n"
          "       [--layer L|all] [--experts E] [--corr-weight W] [--json]\n"
          "Fits on the first half of the trace's steps, evaluates on the second half. --experts E: the\n"
          "number of experts when the trace does not show the last ones (default: inferred); --corr-weight:\n"
          "the weight of the correlation term of anticorr (default 0.5, as in the paper). --json: one JSON\n"
          "object per layer on stdout: {\"layer\", \"test_batches\", \"max_load\" and \"avg_max_load\" (each\n"
          "{\"original\": x, METHOD: y}), \"expert_device\"}.\n");
  placement_flex_usage(f);
}

/* Writes the placement JSON (and a newline) to path atomically. */
static int save_json(const char *path, cJSON *root) {
  char *text = cJSON_Print(root), *line = text ? malloc(strlen(text) + 2) : NULL;
  if (!line) {
    cJSON_free(text);
    return cli_usage_error(CMD, "%s: out of memory formatting JSON", path);
  }
  size_t n = (size_t)sprintf(line, "%s\n", text);
  cJSON_free(text);
  moe_status st = moe_write_file_atomic(path, line, n);
  free(line);
  return st == MOE_OK ? 0 : cli_fail(CMD);
}

int cmd_placement(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  for (int i = 1; i + 1 < argc; i++) /* FlexMoE's replicas: its own flags and output */
    if (cli_flag_is(argv[i], "method") && !strcmp(argv[i + 1], "flexmoe")) return placement_flex(argc, argv);
  const char *trace = NULL, *method_s = NULL, *out = NULL, *layer_s = "all";
  int devices = 0, experts = 0, json = 0;
  float corr = 0.5f;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) {
      json = 1;
      continue;
    }
    if (i + 1 >= argc) { usage(stderr); return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f); }
    const char *v = argv[++i];
    int ok = 1;
    if (cli_flag_is(f, "trace")) trace = v;
    else if (cli_flag_is(f, "method")) method_s = v;
    else if (cli_flag_is(f, "out")) out = v;
    else if (cli_flag_is(f, "layer")) layer_s = v;
    else if (cli_flag_is(f, "devices")) ok = cli_parse_int(v, &devices) && devices >= 1;
    else if (cli_flag_is(f, "experts")) ok = cli_parse_int(v, &experts) && experts >= 1;
    else if (cli_flag_is(f, "corr_weight")) ok = cli_parse_float(v, &corr);
    else { usage(stderr); return cli_usage_error(CMD, "unknown flag '%s'", f); }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  if (!trace || !devices || !method_s) {
    usage(stderr);
    return cli_usage_error(CMD, "--trace, --devices and --method are required");
  }
  moe_placement_method method;
  if (moe_placement_method_parse(method_s, "--method", &method) != MOE_OK) return cli_fail(CMD);
  int layer = -1;
  if (strcmp(layer_s, "all") && (!cli_parse_int(layer_s, &layer) || layer < 0))
    return cli_usage_error(CMD, "--layer: bad value '%s' (want a layer number or all)", layer_s);

  moe_trace t;
  if (moe_trace_load(&t, trace, experts) != MOE_OK) return cli_fail(CMD);
  int rc = 0, E = t.experts;
  int *orig = NULL, *place = NULL;
  cJSON *root = NULL;
  if (t.steps < 2) {
    rc = cli_usage_error(CMD, "%s: %lld steps; need at least 2 (fit on the first half, evaluate on the second)",
                         trace, (long long)t.steps);
    goto done;
  }
  if (layer >= t.layers) {
    rc = cli_usage_error(CMD, "--layer %d: the trace has %d layers", layer, t.layers);
    goto done;
  }
  if (E % devices) {
    rc = cli_usage_error(CMD, "the number of experts (%d) is not a multiple of the number of devices (%d)", E, devices);
    goto done;
  }
  orig = malloc((size_t)E * sizeof *orig);
  place = malloc((size_t)E * sizeof *place);
  root = cJSON_CreateObject();
  cJSON *layers = root && cJSON_AddNumberToObject(root, "devices", devices) &&
                          cJSON_AddStringToObject(root, "method", moe_placement_method_name(method))
                      ? cJSON_AddArrayToObject(root, "layers")
                      : NULL;
  if (!orig || !place || !layers) {
    rc = cli_usage_error(CMD, "out of memory");
    goto done;
  }
  if (moe_placement_contiguous(E, devices, orig) != MOE_OK) { rc = cli_fail(CMD); goto done; }
  int64_t half = t.steps / 2;
  fprintf(json ? stderr : stdout, "placement: %d experts on %d devices (%d each), method %s; fit on steps [0, %lld), test on [%lld, %lld)\n",
         E, devices, E / devices, moe_placement_method_name(method), (long long)half, (long long)half,
         (long long)t.steps);
  for (int l = layer < 0 ? 0 : layer; l < (layer < 0 ? t.layers : layer + 1); l++) {
    double om, oa, pm, pa;
    int64_t nb;
    if (moe_placement_fit(&t, l, 0, half, devices, method, corr, place) != MOE_OK ||
        moe_placement_eval(&t, l, half, t.steps, devices, orig, &om, &oa, &nb) != MOE_OK ||
        moe_placement_eval(&t, l, half, t.steps, devices, place, &pm, &pa, &nb) != MOE_OK) {
      rc = cli_fail(CMD);
      goto done;
    }
    const char *name = moe_placement_method_name(method);
    if (json) {
      printf("{\"layer\": %d, \"test_batches\": %lld, \"max_load\": {\"original\": %.6f, \"%s\": %.6f}, "
             "\"avg_max_load\": {\"original\": %.6f, \"%s\": %.6f}, \"expert_device\": [", l, (long long)nb, om,
             name, pm, oa, name, pa);
      for (int e = 0; e < E; e++) printf("%s%d", e ? ", " : "", place[e]);
      printf("]}\n");
    } else
      printf("layer %d: original max_load %.4f avg_max_load %.4f | %s max_load %.4f avg_max_load %.4f (%lld test "
             "batches)\n", l, om, oa, name, pm, pa, (long long)nb);
    cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateIntArray(place, E);
    int ok = o && a && cJSON_AddNumberToObject(o, "layer", l);
    if (ok && cJSON_AddItemToObject(o, "expert_device", a)) a = NULL;
    else ok = 0;
    if (!ok || !cJSON_AddItemToArray(layers, o)) {
      cJSON_Delete(o), cJSON_Delete(a);
      rc = cli_usage_error(CMD, "out of memory");
      goto done;
    }
  }
  if (out) rc = save_json(out, root);
done:
  cJSON_Delete(root);
  free(orig), free(place);
  moe_trace_free(&t);
  return rc;
}
