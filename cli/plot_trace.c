/* moe plot-trace: the expert-load heatmap of a trace (DESIGN 4.4; the deployment paper's Figure 6):
 * x = step, y = expert, color = the share of the step's tokens routed to the expert (linear viridis
 * scale from 0 to the largest share), one panel per layer or the one chosen with --layer. Traces
 * longer than 1200 steps (PNG) or 600 (SVG) are averaged into that many columns. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "moe_plot.h"

static const char *CMD = "plot-trace";

static void usage(FILE *f) {
  fprintf(f, "usage: moe plot-trace TRACE.csv -o HEAT.png|HEAT.svg [--layer L] [--experts E] [--json]\n"
                  "--layer L plots layer L only (default: every layer, one panel each); --experts E\n"
                  "shows E experts when the trace never routes to the last ones. --json: what was drawn as\n"
                  "one JSON line.\n");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n > k && !strcasecmp(s + n - k, suffix);
}

int cmd_plot_trace(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  const char *trace = NULL, *out = NULL;
  int layer = -1, experts = 0, json = 0;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) {
      json = 1;
      continue;
    }
    if (f[0] != '-' || !f[1]) {
      if (trace) { usage(stderr); return cli_usage_error(CMD, "one trace only ('%s' and '%s')", trace, f); }
      trace = f;
      continue;
    }
    if (i + 1 >= argc) { usage(stderr); return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f); }
    const char *v = argv[++i];
    if (!strcmp(f, "-o") || cli_flag_is(f, "out")) out = v;
    else if (cli_flag_is(f, "layer")) {
      if (!cli_parse_int(v, &layer) || layer < 0) return cli_usage_error(CMD, "--layer: bad value '%s' (want >= 0)", v);
    } else if (cli_flag_is(f, "experts")) {
      if (!cli_parse_int(v, &experts) || experts <= 0) return cli_usage_error(CMD, "--experts: bad value '%s' (want > 0)", v);
    } else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
  }
  if (!trace) { usage(stderr); return cli_usage_error(CMD, "a trace file is required"); }
  if (!out) { usage(stderr); return cli_usage_error(CMD, "-o HEAT.png|HEAT.svg is required"); }
  int svg = ends_with(out, ".svg");
  if (!svg && !ends_with(out, ".png"))
    return cli_usage_error(CMD, "%s: unknown image type (want a name ending in .png or .svg)", out);

  moe_trace t = {0};
  if (moe_trace_load(&t, trace, experts) != MOE_OK) return cli_fail(CMD);
  int rc = 0;
  moe_heatmap h = {0};
  if (t.steps <= 0 || t.layers <= 0 || t.experts <= 0)
    rc = cli_usage_error(CMD, "%s: empty trace (no rows), nothing to plot", trace);
  else if (layer >= t.layers)
    rc = cli_usage_error(CMD, "--layer %d out of range: %s has %d layer%s (0..%d)", layer, trace, t.layers,
                         t.layers == 1 ? "" : "s", t.layers - 1);
  else if (moe_heatmap_build(&h, &t, layer, svg ? MOE_HEATMAP_SVG_COLS : MOE_HEATMAP_PNG_COLS) != MOE_OK ||
           (svg ? moe_heatmap_write_svg(&h, out) : moe_heatmap_write_png(&h, out)) != MOE_OK)
    rc = cli_fail(CMD);
  else if (json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "image", out);
    cJSON_AddNumberToObject(o, "layers", h.panels);
    cJSON_AddNumberToObject(o, "experts", h.experts);
    cJSON_AddNumberToObject(o, "steps", (double)h.steps);
    cJSON_AddNumberToObject(o, "columns", h.cols);
    cJSON_AddNumberToObject(o, "largest_share", h.vmax);
    cJSON_AddNumberToObject(o, "width", h.width);
    cJSON_AddNumberToObject(o, "height", h.height);
    cli_json_line(o);
  } else
    printf("%s: %d layer%s x %d experts x %lld steps in %d columns, largest share %.4f, %d x %d pixels\n", out,
           h.panels, h.panels == 1 ? "" : "s", h.experts, (long long)h.steps, h.cols, h.vmax, h.width, h.height);
  moe_heatmap_free(&h);
  moe_trace_free(&t);
  return rc;
}
