/* moe placement --method flexmoe: FlexMoE's scheduler and policy maker (DESIGN 3.4) over the steps of
 * a recorded trace, the placement carrying over from step to step as in training. The trace holds
 * each step's counts over all ranks; each rank is taken to route an equal share of every expert's
 * tokens (the trace does not say which rank a token came from). Prints per step the balance ratio and
 * the modelled step time before and after the step's plan, and its operations; --json one JSON line
 * per step; --plot OUT.png draws both over the steps. The model's terms are flags (defaults: the order of what `moe train --replicas auto`
 * profiles on a 2-core CPU at D=128, H=512). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe_plot.h"
#include "placement_flex.h"

static const char *CMD = "placement";

void placement_flex_usage(FILE *f) {
  fprintf(f,
          "       moe placement --trace T --devices N --method flexmoe [--slots E_v] [--balance-threshold X]\n"
          "       [--layer L] [--experts E] [--model D] [--hidden H] [--tps TOKENS_PER_S] [--bandwidth BYTES_PER_S]\n"
          "       [--latency S] [--json] [--plot OUT.png]\n"
          "flexmoe runs FlexMoE's policy maker over every step of one layer (default 0): per step the balance\n"
          "ratio and the modelled step time before and after its plan, and the plan's expand / shrink /\n"
          "migrate counts (--json: one object per step). --slots defaults to E/N + 1, the threshold to 1.2.\n"
          "--plot draws the balance ratio (top) and the modelled step time (bottom) over the steps as a PNG.\n");
}

typedef struct {
  int devices, slots, layer, experts, D, H, json;
  float threshold, tps, bw, lat;
  const char *plot;
} flex_opts;

static int parse(int argc, char **argv, flex_opts *o, const char **trace) {
  *o = (flex_opts){.threshold = 1.2f, .D = 128, .H = 512, .tps = 1e5f, .bw = 2e9f, .lat = 2e-5f};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) {
      o->json = 1;
      continue;
    }
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    const char *v = argv[++i];
    int ok = 1;
    if (cli_flag_is(f, "trace")) *trace = v;
    else if (cli_flag_is(f, "plot")) o->plot = v;
    else if (cli_flag_is(f, "method")) ok = !strcmp(v, "flexmoe");
    else if (cli_flag_is(f, "devices")) ok = cli_parse_int(v, &o->devices) && o->devices >= 1;
    else if (cli_flag_is(f, "slots")) ok = cli_parse_int(v, &o->slots) && o->slots >= 1;
    else if (cli_flag_is(f, "layer")) ok = cli_parse_int(v, &o->layer) && o->layer >= 0;
    else if (cli_flag_is(f, "experts")) ok = cli_parse_int(v, &o->experts) && o->experts >= 1;
    else if (cli_flag_is(f, "model")) ok = cli_parse_int(v, &o->D) && o->D >= 1;
    else if (cli_flag_is(f, "hidden")) ok = cli_parse_int(v, &o->H) && o->H >= 1;
    else if (cli_flag_is(f, "balance_threshold")) ok = cli_parse_float(v, &o->threshold) && o->threshold >= 1;
    else if (cli_flag_is(f, "tps")) ok = cli_parse_float(v, &o->tps) && o->tps > 0;
    else if (cli_flag_is(f, "bandwidth")) ok = cli_parse_float(v, &o->bw) && o->bw > 0;
    else if (cli_flag_is(f, "latency")) ok = cli_parse_float(v, &o->lat) && o->lat >= 0;
    else return cli_usage_error(CMD, "unknown flag '%s' (with --method flexmoe)", f);
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  if (!*trace || !o->devices) return cli_usage_error(CMD, "--trace and --devices are required");
  return 0;
}

static void print_step(const flex_opts *o, int64_t step, const moe_flex_step *r) {
  if (o->json)
    printf("{\"step\": %lld, \"balance_before\": %.6f, \"balance_after\": %.6f, \"time_before\": %.9g, "
           "\"time_after\": %.9g, \"xfer_s\": %.9g, \"expand\": %d, \"shrink\": %d, \"migrate\": %d}\n",
           (long long)step, r->balance_before, r->balance_after, r->time_before, r->time_after, r->xfer_s,
           r->expands, r->shrinks, r->migrates);
  else
    printf("step %lld: balance %.4f -> %.4f, modelled step %.6f -> %.6f s, expand %d shrink %d migrate %d\n",
           (long long)step, r->balance_before, r->balance_after, r->time_before, r->time_after, r->expands,
           r->shrinks, r->migrates);
}

/* Each rank's equal share of every expert's tokens (the first ranks take the remainder). */
static void split_counts(const int32_t *Ie, int E, int W, int64_t *src) {
  for (int g = 0; g < W; g++)
    for (int e = 0; e < E; e++) src[(size_t)g * E + e] = Ie[e] / W + (g < Ie[e] % W);
}

/* --plot: the steps' ratios and times (4 series of n in v) drawn to o->plot, their scales printed. */
static int plot(const flex_opts *o, const double *v, int64_t n) {
  moe_flex_plot d = {.n = n, .ratio_before = v, .ratio_after = v + n, .time_before = v + 2 * n,
                     .time_after = v + 3 * n, .threshold = o->threshold, .ratio_max = o->threshold};
  for (int64_t i = 0; i < 2 * n; i++) {
    d.ratio_max = v[i] > d.ratio_max ? v[i] : d.ratio_max;
    d.time_max = v[2 * n + i] > d.time_max ? v[2 * n + i] : d.time_max;
  }
  if (moe_flex_plot_png(o->plot, &d) != MOE_OK) return cli_fail(CMD);
  fprintf(o->json ? stderr : stdout, "plot: %s: balance ratio 1 to %.4g (top, threshold %.3g in grey), modelled "
          "step 0 to %.6g s (bottom); light before each step's plan, dark after\n", o->plot, d.ratio_max,
          o->threshold, d.time_max);
  return 0;
}

int placement_flex(int argc, char **argv) {
  const char *trace = NULL;
  flex_opts o;
  if (parse(argc, argv, &o, &trace)) return 1;
  moe_trace t;
  if (moe_trace_load(&t, trace, o.experts) != MOE_OK) return cli_fail(CMD);
  int E = t.experts, W = o.devices, rc = 0;
  int slots = o.slots ? o.slots : (E + W - 1) / W + 1;
  moe_flex_env env = {.tps = o.tps, .a2a_lat = o.lat, .a2a_bw = o.bw, .ar_lat = o.lat, .ar_bw = o.bw,
                      .token_bytes = 4.0 * o.D, .expert_bytes = 4.0 * (2.0 * o.D * o.H + o.D + o.H)};
  moe_flex_sim *s = NULL;
  int64_t *src = malloc(sizeof *src * (size_t)W * (size_t)E), n = t.steps;
  double *v = o.plot ? malloc(sizeof *v * 4 * (size_t)(n ? n : 1)) : NULL; /* --plot's 4 series */
  if (o.layer >= t.layers) rc = cli_usage_error(CMD, "--layer %d: the trace has %d layers", o.layer, t.layers);
  else if (!src || (o.plot && !v)) rc = cli_usage_error(CMD, "out of memory");
  else if (moe_flex_sim_new(&s, W, slots, E, &env, o.threshold) != MOE_OK) rc = cli_fail(CMD);
  if (!rc)
    fprintf(o.json ? stderr : stdout,
            "placement: flexmoe, %d experts on %d devices with %d slots each, threshold %.3g, layer %d, %lld steps\n",
            E, W, slots, o.threshold, o.layer, (long long)t.steps);
  for (int64_t step = 0; !rc && step < t.steps; step++) {
    moe_flex_step r;
    split_counts(t.tokens + ((size_t)step * t.layers + o.layer) * E, E, W, src);
    if (moe_flex_sim_step(s, src, &r) != MOE_OK) rc = cli_fail(CMD);
    else print_step(&o, step, &r);
    if (v) v[step] = r.balance_before, v[n + step] = r.balance_after, v[2 * n + step] = r.time_before,
           v[3 * n + step] = r.time_after;
  }
  if (!rc && o.plot) rc = plot(&o, v, n);
  moe_flex_sim_free(s);
  free(src);
  free(v);
  moe_trace_free(&t);
  return rc;
}
