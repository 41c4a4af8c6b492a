/* moe simulate: one training step of one MoE layer over a simulated cluster (DESIGN 4.6): the step
 * time, its breakdown, the peak memory and each adaptive policy's choice; --sweep writes CSV;
 * --calibrate measures this machine's GEMM and exchange rates into a config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe_plot.h"

static const char *CMD = "simulate";

static void usage(FILE *f) {
  fprintf(f, "usage: moe simulate --config F.json [--json]\n"
             "                    [--sweep devices|batch|capacity=V1,V2,... [-o OUT.csv] [--plot OUT.svg|OUT.png]]\n"
             "       [mpirun -np W] moe simulate --calibrate [--threads N] [-o MACHINE.json]\n"
             "Text by default, --json one JSON line per run. --sweep runs the config once per value and writes\n"
             "CSV (to OUT.csv, else stdout) and with --plot a chart of the step, compute and exposed\n"
             "communication (SVG with its labels, or a PNG raster without text); devices keeps the experts per device. --calibrate measures this machine (the\n"
             "sgemm rate of each kind of the experts' GEMMs on each rank, N threads each, default the CPUs\n"
             "over the ranks, the bandwidth of the layer's memory-bound passes, and the exchange between the\n"
             "W ranks) and writes a config of W devices on one node with those rates (a layer of case S to\n"
             "change) to MACHINE.json, else stdout.\n");
}

static void print_text(const moe_sim_result *r) {
  printf("%d devices (%d node%s x %d), %d experts, %d tokens per device, capacity factor %g\n", r->devices,
         r->nodes, r->nodes == 1 ? "" : "s", r->devices / r->nodes, r->experts, r->tokens, r->capacity_factor);
  printf("step %.6g ms: compute %.6g ms (busiest device %d; least busy %.6g ms), exposed communication %.6g ms "
         "(communication stream busy %.6g ms)\n",
         r->step_s * 1e3, r->compute_s * 1e3, r->slowest, r->compute_min_s * 1e3, r->exposed_comm_s * 1e3,
         r->comm_s * 1e3);
  printf("pipeline n = %d%s, all-to-all %s (%d messages per device), memory reuse %s\n", r->n,
         r->auto_n ? " (Algorithm 1 over simulated trial steps)" : "", r->a2a, r->a2a_msgs, r->reuse);
  printf("peak memory %.4g GiB per device%s", r->peak_bytes / (1 << 30), r->fits ? "" : ": DOES NOT FIT");
  if (r->eq6_phi > 0) printf(" (Eq. 6 bounds the saving of reuse %s at %.4g)", r->reuse, r->eq6_phi);
  printf("\n");
  printf("parallelism r = %d; policies: Eq. 10 picks %s; Tutel's dictionary picks r = %d, degree %d with %s\n",
         r->r, r->eq10_reuse, r->tutel_r, r->tutel_d, r->tutel_a2a);
  if (r->flex)
    printf("FlexMoE: balance ratio %.4g -> %.4g (%d operations, %.6g ms of transfers), step %.6g ms -> %.6g ms\n",
           r->balance_before, r->balance_after, r->flex_ops, r->flex_xfer_s * 1e3, r->step_before_s * 1e3,
           r->step_s * 1e3);
}

static void print_json(const moe_sim_result *r) {
  printf("{\"devices\":%d,\"nodes\":%d,\"experts\":%d,\"tokens\":%d,\"capacity_factor\":%.17g,\"n\":%d,"
         "\"auto_n\":%s,\"a2a\":\"%s\",\"a2a_msgs\":%d,\"reuse\":\"%s\",\"step_s\":%.17g,\"compute_s\":%.17g,"
         "\"compute_min_s\":%.17g,\"slowest\":%d,\"exposed_comm_s\":%.17g,\"comm_s\":%.17g,\"peak_bytes\":%.17g,"
         "\"fits\":%s,\"eq6_phi\":%.17g,\"r\":%d,\"eq10_reuse\":\"%s\",\"tutel_r\":%d,\"tutel_d\":%d,\"tutel_a2a\":\"%s\"",
         r->devices, r->nodes, r->experts, r->tokens, r->capacity_factor, r->n, r->auto_n ? "true" : "false", r->a2a,
         r->a2a_msgs, r->reuse, r->step_s, r->compute_s, r->compute_min_s, r->slowest, r->exposed_comm_s, r->comm_s,
         r->peak_bytes, r->fits ? "true" : "false", r->eq6_phi, r->r, r->eq10_reuse, r->tutel_r, r->tutel_d, r->tutel_a2a);
  if (r->flex)
    printf(",\"balance_before\":%.17g,\"balance_after\":%.17g,\"flex_ops\":%d,\"flex_xfer_s\":%.17g,"
           "\"step_before_s\":%.17g",
           r->balance_before, r->balance_after, r->flex_ops, r->flex_xfer_s, r->step_before_s);
  printf("}\n");
}

/* The serving run of a config with "serve_trace": its trace's decode steps with the config's cache. */
static int serve_run(const moe_sim_config *c, int json) {
  moe_sim_serve_result r;
  if (moe_sim_serve(c, &r) != MOE_OK) return cli_fail(CMD);
  if (json)
    printf("{\"steps\":%lld,\"layers\":%d,\"tokens\":%lld,\"cache_experts\":%d,\"cache_policy\":\"%s\","
           "\"accesses\":%lld,\"misses\":%lld,\"hit_rate\":%.17g,\"time_s\":%.17g,\"token_s\":%.17g,"
           "\"fetch_s\":%.17g,\"fetch_wait_s\":%.17g}\n",
           (long long)r.steps, r.layers, (long long)r.tokens, r.cache_experts, r.cache_policy,
           (long long)r.accesses, (long long)r.misses, r.hit_rate, r.time_s, r.token_s, r.fetch_s, r.fetch_wait_s);
  char cache[64] = "every expert resident";
  if (r.cache_experts)
    snprintf(cache, sizeof cache, "%d expert slots per layer, %s", r.cache_experts, r.cache_policy);
  if (!json)
    printf("serving %lld decode steps of %d layer%s, %lld tokens; %s\n"
           "hit rate %.4f (%lld misses of %lld expert accesses); %.6g ms per token (run %.6g ms; fetches %.6g ms, "
           "%.6g ms of them waited for)\n",
           (long long)r.steps, r.layers, r.layers == 1 ? "" : "s", (long long)r.tokens,
           cache, r.hit_rate, (long long)r.misses, (long long)r.accesses,
           r.token_s * 1e3, r.time_s * 1e3, r.fetch_s * 1e3, r.fetch_wait_s * 1e3);
  return 0;
}

/* Appends one CSV row (the header first when *len is 0) to the growing buffer. */
static int csv_row(char **buf, size_t *len, const char *key, double v, const moe_sim_result *r) {
  char row[1024];
  int n = 0;
  if (!*len)
    n = snprintf(row, sizeof row, "%s,devices,nodes,experts,tokens,capacity_factor,n,a2a,reuse,step_s,compute_s,"
                 "exposed_comm_s,comm_s,peak_bytes,r,eq10_reuse,tutel_r,tutel_d,tutel_a2a,balance_before,balance_after,"
                 "step_before_s\n", key);
  n += snprintf(row + n, sizeof row - (size_t)n,
                "%g,%d,%d,%d,%d,%g,%d,%s,%s,%.9g,%.9g,%.9g,%.9g,%.9g,%d,%s,%d,%d,%s,%.6g,%.6g,%.9g\n", v, r->devices,
                r->nodes, r->experts, r->tokens, r->capacity_factor, r->n, r->a2a, r->reuse, r->step_s,
                r->compute_s, r->exposed_comm_s, r->comm_s, r->peak_bytes, r->r, r->eq10_reuse, r->tutel_r, r->tutel_d,
                r->tutel_a2a, r->flex ? r->balance_before : 0, r->flex ? r->balance_after : 0,
                r->flex ? r->step_before_s : r->step_s);
  char *p = realloc(*buf, *len + (size_t)n + 1);
  if (!p) return 0;
  memcpy(p + *len, row, (size_t)n + 1);
  *buf = p, *len += (size_t)n;
  return 1;
}

/* One run per value of "key=v1,v2,...", as CSV to out (NULL: stdout) and a chart to plot (or NULL),
 * a PNG when png, else an SVG. */
static int sweep(moe_sim_config *c, const char *spec, const char *out, const char *plot, int png, int json) {
  const char *eq = strchr(spec, '=');
  if (!eq || eq == spec || !eq[1])
    return cli_usage_error(CMD, "--sweep: '%s' is not KEY=V1,V2,... (KEY devices, batch or capacity)", spec);
  char key[32];
  snprintf(key, sizeof key, "%.*s", (int)(eq - spec) < 31 ? (int)(eq - spec) : 31, spec);
  char *csv = NULL;
  size_t len = 0;
  int rc = 0, n = 0;
  double xs[64];
  moe_sim_result rs[64];
  for (const char *p = eq + 1; *p && !rc; n++) {
    if (n == 64) {
      rc = cli_usage_error(CMD, "--sweep %s: more than 64 values", key);
      break;
    }
    char *end;
    xs[n] = strtod(p, &end);
    if (end == p || (*end && *end != ','))
      rc = cli_usage_error(CMD, "--sweep %s: bad value '%s'", key, p);
    if (!rc && (moe_sim_config_set(c, key, xs[n]) != MOE_OK || moe_sim_run(c, &rs[n]) != MOE_OK)) rc = cli_fail(CMD);
    if (!rc && json) print_json(&rs[n]);
    if (!rc && !csv_row(&csv, &len, key, xs[n], &rs[n])) rc = cli_usage_error(CMD, "out of memory");
    p = *end ? end + 1 : end;
  }
  if (!rc && out && moe_write_file_atomic(out, csv, len) != MOE_OK) rc = cli_fail(CMD);
  else if (!rc && !out && !json) fputs(csv, stdout);
  if (!rc && plot && (png ? moe_sim_plot_png : moe_sim_plot_svg)(plot, key, xs, rs, n) != MOE_OK) rc = cli_fail(CMD);
  free(csv);
  return rc;
}

/* --calibrate: every rank measures (moe_sim_calibrate); rank 0 writes the machine's config. */
static int calibrate_machine(const char *out, int threads) {
  moe_dist *d;
  if (moe_dist_init(&d, NULL, NULL) != MOE_OK) return cli_fail(CMD);
  int W = moe_dist_size(d);
  if (!threads) threads = cli_cpu_count() / W > 0 ? cli_cpu_count() / W : 1;
  char text[1024];
  int rc = moe_sim_calibrate_config(d, threads, text, sizeof text) != MOE_OK ? cli_fail(CMD) : 0;
  if (!rc && moe_dist_rank(d) == 0) {
    if (!out) fputs(text, stdout);
    else if (moe_write_file_atomic(out, text, strlen(text)) != MOE_OK) rc = cli_fail(CMD);
  }
  moe_dist_finalize(d);
  return rc;
}

int cmd_simulate(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  const char *config = NULL, *spec = NULL, *out = NULL, *plot = NULL;
  int json = 0, calibrate = 0, threads = 0;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { json = 1; continue; }
    if (cli_flag_is(f, "calibrate")) { calibrate = 1; continue; }
    if (i + 1 >= argc) { usage(stderr); return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f); }
    const char *v = argv[++i];
    if (cli_flag_is(f, "config")) config = v;
    else if (cli_flag_is(f, "sweep")) spec = v;
    else if (!strcmp(f, "-o") || cli_flag_is(f, "out")) out = v;
    else if (cli_flag_is(f, "plot")) plot = v;
    else if (cli_flag_is(f, "threads")) {
      if (!cli_parse_int(v, &threads) || threads < 1) return cli_usage_error(CMD, "--threads: bad value '%s'", v);
    }
    else { usage(stderr); return cli_usage_error(CMD, "unknown flag '%s'", f); }
  }
  if (calibrate) return calibrate_machine(out, threads);
  if (!config) { usage(stderr); return cli_usage_error(CMD, "--config F.json is required"); }
  if ((out || plot) && !spec) return cli_usage_error(CMD, "-o / --plot: only a --sweep or --calibrate writes files");
  size_t pl = plot ? strlen(plot) : 0;
  int png = pl >= 4 && !strcmp(plot + pl - 4, ".png");
  if (plot && !png && (pl < 4 || strcmp(plot + pl - 4, ".svg")))
    return cli_usage_error(CMD, "--plot %s: unknown image type (want a name ending in .png or .svg)", plot);
  moe_sim_config *c;
  if (moe_sim_config_load(config, &c) != MOE_OK) return cli_fail(CMD);
  int rc = 0;
  moe_sim_result r;
  if (moe_sim_config_serves(c) && spec) rc = cli_usage_error(CMD, "--sweep: a serving run (\"serve_trace\") is not swept");
  else if (moe_sim_config_serves(c)) rc = serve_run(c, json);
  else if (spec) rc = sweep(c, spec, out, plot, png, json);
  else if (moe_sim_run(c, &r) != MOE_OK) rc = cli_fail(CMD);
  else if (json) print_json(&r);
  else print_text(&r);
  moe_sim_config_free(c);
  return rc;
}
