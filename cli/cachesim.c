/* moe cachesim: replays an expert trace (DESIGN 4.4) through a K-slot expert cache per layer
 * (deployment paper VI) and prints the miss rate (misses / accesses) of every layer, the overall rate
 * (all layers' misses over all accesses) and the worst layer's rate (the paper's metric). With
 * --policy all, a table of the six policies side by side (Belady's MIN the bound of the others). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *CMD = "cachesim";

static void usage(FILE *f) {
  fprintf(f, "usage: moe cachesim --trace T --policy lifo|lru|fifo|lfu|lfru|belady|all --cache K [--experts E] [--json]\n"
                  "Simulates a cache of K experts per layer over the whole trace; --experts E checks that every\n"
                  "expert id is below E (default: inferred from the trace). --json: one JSON object per layer,\n"
                  "then one for all layers (\"layer\": \"overall\"), with the miss rate of each policy run.\n");
}

#define NP (MOE_CACHE_LFRU + 1) /* the policies, in moe_cache_policy's order */

static void print_rates(const double *r) {
  for (int k = 0; k < NP; k++) printf(" %8.4f", r[k]);
  printf("\n");
}

static double rate(int64_t misses, int64_t accesses) { return accesses ? (double)misses / accesses : 0; }

/* {"layer": LAYER, "accesses": N, "miss_rate": {"lifo": r, ...}} for the np policies from p0 on. */
static void json_line(const char *layer, int64_t accesses, const double *r, int np, moe_cache_policy p0) {
  printf("{\"layer\": %s, \"accesses\": %lld, \"miss_rate\": {", layer, (long long)accesses);
  for (int k = 0; k < np; k++)
    printf("%s\"%s\": %.6f", k ? ", " : "", moe_cache_policy_name((moe_cache_policy)(p0 + k)), r[k]);
  printf("}}\n");
}

int cmd_cachesim(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  const char *trace = NULL, *policy = NULL;
  int K = 0, experts = 0, json = 0;
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
    else if (cli_flag_is(f, "policy")) policy = v;
    else if (cli_flag_is(f, "cache")) ok = cli_parse_int(v, &K) && K >= 1;
    else if (cli_flag_is(f, "experts")) ok = cli_parse_int(v, &experts) && experts >= 1;
    else { usage(stderr); return cli_usage_error(CMD, "unknown flag '%s'", f); }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  if (!trace || !policy || !K) {
    usage(stderr);
    return cli_usage_error(CMD, "--trace, --policy and --cache are required");
  }
  int all = !strcmp(policy, "all");
  moe_cache_policy p = MOE_CACHE_LIFO;
  if (!all && moe_cache_policy_parse(policy, "--policy", &p) != MOE_OK) return cli_fail(CMD);
  moe_trace t;
  if (moe_trace_load(&t, trace, experts) != MOE_OK) return cli_fail(CMD);
  if (K > t.experts) {
    int E = t.experts;
    moe_trace_free(&t);
    return cli_usage_error(CMD, "--cache %d: more slots than the trace's %d experts per layer", K, E);
  }

  int np = all ? NP : 1, rc = 0;
  int64_t acc_all = 0, miss_all[NP] = {0}, acc = 0, miss = 0;
  double worst[NP] = {0};
  int worst_layer[NP] = {0};
  if (all && !json) {
    printf("%-8s %10s", "layer", "accesses");
    for (int k = 0; k < NP; k++) printf(" %8s", moe_cache_policy_name((moe_cache_policy)k));
    printf("\n");
  }
  for (int l = 0; l < t.layers && !rc; l++) {
    double r[NP];
    for (int k = 0; k < np && !rc; k++) {
      moe_cache_policy q = all ? (moe_cache_policy)k : p;
      if (moe_cachesim(&t, l, 0, t.steps, q, K, &acc, &miss) != MOE_OK) { rc = cli_fail(CMD); break; }
      miss_all[k] += miss;
      r[k] = rate(miss, acc);
      if (r[k] > worst[k] || l == 0) worst[k] = r[k], worst_layer[k] = l;
    }
    if (rc) break;
    acc_all += acc;
    if (json) {
      char name[16];
      snprintf(name, sizeof name, "%d", l);
      json_line(name, acc, r, np, all ? MOE_CACHE_LIFO : p);
    } else if (all) {
      printf("%-8d %10lld", l, (long long)acc);
      print_rates(r);
    }
    else printf("layer %d: accesses %lld misses %lld miss_rate %.4f\n", l, (long long)acc, (long long)miss, r[0]);
  }
  if (!rc && json) {
    double r[NP];
    for (int k = 0; k < np; k++) r[k] = rate(miss_all[k], acc_all);
    json_line("\"overall\"", acc_all, r, np, all ? MOE_CACHE_LIFO : p);
  } else if (!rc && all) {
    double r[NP];
    for (int k = 0; k < NP; k++) r[k] = rate(miss_all[k], acc_all);
    printf("%-8s %10lld", "overall", (long long)acc_all);
    print_rates(r);
    printf("%-8s %10s", "worst", "");
    print_rates(worst);
  } else if (!rc) {
    printf("overall: accesses %lld misses %lld miss_rate %.4f\n", (long long)acc_all, (long long)miss_all[0],
           rate(miss_all[0], acc_all));
    if (t.layers) printf("worst: layer %d miss_rate %.4f\n", worst_layer[0], worst[0]);
  }
  moe_trace_free(&t);
  return rc;
}
