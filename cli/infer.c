/* moe infer: batch inference of a checkpoint on a data split, reporting accuracy, throughput and
 * per-batch latency percentiles; with --cache K the experts stay in the checkpoint file and pass
 * through K slots per block (expert buffering), and the hit rate and resident expert memory are
 * reported against the all-resident model. --dtype f32|bf16 picks the experts' compute dtype (default:
 * the checkpoint's); the fast tier (K slots, or every expert) is reported in bytes of that dtype, so
 * that a bf16 slot, half an f32 one, shows. moe trace: the same run, writing the expert trace
 * (DESIGN 4.4) of the checkpoint over the data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "progress.h"
#include "train_data.h"

typedef struct {
  const char *ck, *data, *split, *trace;
  int batch, cache, threads, json;
  int dtype; /* -1: the checkpoint's */
  moe_cache_policy policy;
  cli_progress progress; /* --progress, --quiet */
} infer_opts;

static void usage(FILE *f, const char *cmd) {
  fprintf(f, "usage: moe %s --checkpoint F [--data DIR] [--split t10k|train] [--batch B]\n"
             "       [--cache K [--policy lifo|lru|fifo]] [--dtype f32|bf16] [--threads N] [%s F] [--json]\n"
             "       [--progress|--quiet]   (a progress line on stderr: on a terminal, anywhere, nowhere)\n",
          cmd, strcmp(cmd, "trace") ? "--trace" : "--out");
}

static int parse(const char *cmd, int argc, char **argv, infer_opts *o) {
  *o = (infer_opts){.data = DEFAULT_DATA, .split = "t10k", .batch = 64, .dtype = -1, .policy = MOE_CACHE_LIFO};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { o->json = 1; continue; }
    if (cli_progress_flag(f, &o->progress)) continue;
    if (i + 1 >= argc) return cli_usage_error(cmd, "%s: missing value (or unknown flag)", f);
    const char *v = argv[++i];
    int ok = 1;
    if (cli_flag_is(f, "checkpoint")) o->ck = v;
    else if (cli_flag_is(f, "data")) o->data = v;
    else if (cli_flag_is(f, "split")) ok = !strcmp(v, "t10k") || !strcmp(v, "train"), o->split = v;
    else if (cli_flag_is(f, "trace") || cli_flag_is(f, "out")) o->trace = v;
    else if (cli_flag_is(f, "batch")) ok = cli_parse_int(v, &o->batch) && o->batch > 0;
    else if (cli_flag_is(f, "cache")) ok = cli_parse_int(v, &o->cache) && o->cache > 0;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0;
    else if (cli_flag_is(f, "policy")) {
      if (moe_cache_policy_parse(v, "--policy", &o->policy) != MOE_OK || o->policy == MOE_CACHE_BELADY)
        return cli_usage_error(cmd, "--policy: '%s' (want lifo|lru|fifo; belady needs the future: moe cachesim)", v);
    } else if (cli_flag_is(f, "dtype")) {
      moe_dtype dt;
      if (moe_dtype_parse(v, "--dtype", &dt) != MOE_OK) return cli_fail(cmd);
      o->dtype = (int)dt;
    } else {
      usage(stderr, cmd);
      return cli_usage_error(cmd, "unknown flag '%s'", f);
    }
    if (!ok) return cli_usage_error(cmd, "%s: bad value '%s'", f, v);
  }
  if (!o->ck) return cli_usage_error(cmd, "--checkpoint is required");
  for (int i = 1; i < argc; i++)
    if (cli_flag_is(argv[i], "policy") && !o->cache) return cli_usage_error(cmd, "--policy needs --cache K");
  if (!strcmp(cmd, "trace") && !o->trace) return cli_usage_error(cmd, "--out is required");
  return 0;
}

static int run(const char *cmd, infer_opts *o, moe_model_t *m, moe_dataset *d) {
  int F = d->rows * d->cols, nb = d->n / o->batch + (d->n % o->batch != 0);
  if (F != m->cfg.in_dim)
    return cli_usage_error(cmd, "%s: the model takes %d features, the data has %d", o->ck, m->cfg.in_dim, F);
  double *lat = malloc(sizeof(double) * (size_t)(nb ? nb : 1));
  if (!lat) return cli_usage_error(cmd, "out of memory");
  moe_trace_writer *tw = NULL;
  int rc = o->trace && moe_trace_writer_open(&tw, o->trace, 0) != MOE_OK ? cli_fail(cmd) : 0;
  long hits = 0;
  double t0 = cli_now();
  cli_progress_start(&o->progress, 1, "batches", nb);
  for (int b = 0; b < nb && !rc; b++) {
    int s = b * o->batch, n = d->n - s < o->batch ? d->n - s : o->batch;
    double tb = cli_now();
    if (moe_model_forward(m, d->images + (size_t)s * F, NULL, n, NULL) != MOE_OK) { rc = cli_fail(cmd); break; }
    lat[b] = (cli_now() - tb) * 1e3;
    const int32_t *p = moe_model_predictions(m);
    for (int i = 0; i < n; i++) hits += p[i] == d->labels[s + i];
    if (tw && moe_trace_writer_add_model(tw, m, b) != MOE_OK) rc = cli_fail(cmd);
    cli_progress_update(&o->progress, b + 1, cmd, NULL);
  }
  cli_progress_break(&o->progress);
  double wall = cli_now() - t0;
  if (moe_trace_writer_close(tw) != MOE_OK && !rc) rc = cli_fail(cmd);
  if (rc) {
    free(lat);
    return rc;
  }
  cli_sort_doubles(lat, nb);
  double acc = d->n ? (double)hits / d->n : 0, tput = wall > 0 ? d->n / wall : 0;
  double p50 = nb ? lat[nb / 2] : 0, p90 = nb ? lat[(nb * 9) / 10] : 0, p99 = nb ? lat[(nb * 99) / 100] : 0;
  free(lat);
  /* expert memory, the fast tier: resident slots (or every expert) against every expert of every block,
   * in bytes of the compute dtype (bf16 matrices at 2 bytes, biases at 4); slot: one expert's bytes */
  moe_dtype dt = m->cfg.moe.dtype;
  int E = m->cfg.moe.E, L = m->cfg.blocks, slots = o->cache ? o->cache : E;
  double resident = 0, all = 0, slot = 0, acc_n = 0, miss_n = 0;
  for (int i = 0; i < L; i++) {
    if (m->caches) {
      moe_expert_cache_stats cs;
      moe_expert_cache_get_stats(m->caches[i], &cs);
      resident += (double)cs.resident_bytes;
      all += (double)cs.expert_bytes * E;
      slot = (double)cs.expert_bytes;
      acc_n += (double)cs.accesses;
      miss_n += (double)cs.misses;
    } else {
      double block = 0;
      for (int j = 0; j < m->layers[i].nparams; j++) {
        const moe_param_info *p = &m->layers[i].info[j];
        if (!strncmp(p->name, "experts.", 8)) block += p->numel * (p->ndim == 3 && dt == MOE_DT_BF16 ? 2.0 : 4.0);
      }
      resident += block;
      all = resident;
      slot = block / E;
    }
  }
  double hit_rate = acc_n > 0 ? 1.0 - miss_n / acc_n : 1.0, mib = 1048576.0;
  if (o->json)
    printf("{\"accuracy\": %.4f, \"samples\": %d, \"samples_per_s\": %.1f, \"latency_ms_p50\": %.3f, "
           "\"latency_ms_p90\": %.3f, \"latency_ms_p99\": %.3f, \"batch\": %d, \"cache_slots\": %d, "
           "\"experts\": %d, \"policy\": \"%s\", \"hit_rate\": %.4f, \"resident_expert_bytes\": %.0f, "
           "\"all_expert_bytes\": %.0f, \"dtype\": \"%s\", \"expert_slot_bytes\": %.0f}\n",
           acc, d->n, tput, p50, p90, p99, o->batch, slots, E,
           o->cache ? moe_cache_policy_name(o->policy) : "all-resident", hit_rate, resident, all,
           moe_compute_dtype_name(dt), slot);
  else if (strcmp(cmd, "trace")) {
    printf("samples %d, batch %d: %.1f samples/s, latency per batch p50 %.2f ms, p90 %.2f ms, p99 %.2f ms\n", d->n,
           o->batch, tput, p50, p90, p99);
    if (o->cache)
      printf("expert cache: %d of %d experts per block (%s), hit rate %.4f, resident expert memory %.2f MiB of "
             "%.2f MiB (%.1f%%)\n", o->cache, E, moe_cache_policy_name(o->policy), hit_rate, resident / mib,
             all / mib, all > 0 ? 100.0 * resident / all : 0);
    printf("experts %s: fast tier %d %s x %.4f MiB (%.0f bytes) = %.4f MiB per block, %.4f MiB over %d block%s\n",
           moe_compute_dtype_name(dt), slots, o->cache ? "slots" : "resident experts", slot / mib, slot,
           slots * slot / mib, resident / mib, L, L == 1 ? "" : "s");
    printf("accuracy=%.4f\n", acc);
  } else {
    printf("wrote %s: %d steps (batches of %d) over %d samples\n", o->trace, nb, o->batch, d->n);
  }
  return 0;
}

static int infer_main(const char *cmd, int argc, char **argv) {
  if (cli_wants_help(argc, argv)) {
    usage(stdout, cmd);
    return 0;
  }
  infer_opts o;
  int rc = parse(cmd, argc, argv, &o);
  if (rc) return rc;
  char cfg[4096];
  snprintf(cfg, sizeof cfg, "%s/config.json", o.ck);
  FILE *lm = fopen(cfg, "r");
  if (lm) { /* a language model of any family: moe serve (and generate, eval) keep only some experts */
    fclose(lm);
    return cli_usage_error(cmd, "%s is a language model's directory (config.json): moe %s runs a moe train checkpoint "
                           "of the classifier; for a language model use moe serve --cache K, or moe generate, eval or "
                           "serve --memory-budget SIZE", o.ck, cmd);
  }
  moe_model_t m;
  moe_dataset d = {0};
  /* without --cache: every expert resident (K = 0), in the dtype asked for, as moe_checkpoint_load */
  moe_status st = moe_checkpoint_load_serving(o.ck, &m, o.cache, o.policy, o.dtype);
  if (st != MOE_OK) return cli_fail(cmd);
  moe_model_set_threads(&m, o.threads);
  if (load_split(o.data, o.split, &d) != MOE_OK) rc = cli_fail(cmd);
  else rc = run(cmd, &o, &m, &d);
  moe_dataset_free(&d);
  moe_model_free(&m);
  return rc;
}

int cmd_infer(int argc, char **argv) { return infer_main("infer", argc, argv); }
int cmd_trace(int argc, char **argv) { return infer_main("trace", argc, argv); }
