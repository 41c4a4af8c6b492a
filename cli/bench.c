/* moe bench: the standard cases of DESIGN 4.3 (S, M, L; uniform and skewed routing; dynamic and
 * static dispatch), forward and forward+backward medians, achieved GFLOP/s of the expert GEMMs
 * against an sgemm measured in the same run with the same BLAS and threads, the layer workspace's
 * peak bytes and the process's peak resident memory. Each case is checked against a double-
 * precision reference on a few tokens before it is timed. A table by default, --json lines.
 * --dtype f32,bf16 runs each case with the experts' GEMMs in fp32, then bf16 (fp32 accumulation); the
 * ratio stays the one to the fp32 sgemm, so bf16 rows can exceed 1. fwd_cached times the forward with
 * cached experts (sample-assignment caching), where the router runs alongside the experts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "bench_optim.h"
#include "progress.h"
#include "rank_errors.h"
#include "train_flex.h"

static const char *CMD = "bench";

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe bench [--cases S,M,L] [--routing uniform,skewed] [--dispatch dynamic,static]\n"
          "                 [--dtype f32,bf16] [--shape T,D,H,E,k] [--threads N] [--reps R] [--json]\n"
          "                 [--expert-parallel] [--pipeline N|auto,... [--memory-reuse none|s2|s3|s4|auto]]\n"
          "                 [--memory-budget MIB] [--parallel-r N|auto,...] [--replicas auto|off [--replica-horizon K]]\n"
          "                 [--a2a linear|2dh|auto [--ranks-per-node G]]\n"
          "                 [--progress|--quiet]\n"
          "       moe bench --optimizer-params N,... [--threads N] [--reps R] [--json]\n"
          "       moe bench --lm DIR [--prompt-tokens P] [--gen-tokens N] [--threads N] [--reps R]\n"
          "                 [--dtype f32|bf16] [--json]\n"
          "--cases, --routing, --dispatch and --dtype take a comma-separated subset (any order, each name\n"
          "once; default all, but --dtype f32). --dtype: the experts' compute dtypes; the ratio (roofline_ratio)\n"
          "is to the fp32 sgemm measured in the same run, so bf16 can exceed 1. --reps R: timed steps\n"
          "per case (default 3), medians reported. Under mpirun -np W, --expert-parallel spreads the\n"
          "experts over the ranks and reports time in exchanges and bytes sent. --shape: one case of your\n"
          "own (named custom) instead of --cases. fwd_cached (one process): the forward again with the\n"
          "router's last choice as cached experts, so that the router runs alongside the experts.\n"
          "--pipeline N,...: the cases run their experts as N micro-batches, once per N given (expert-\n"
          "parallel: each micro-batch's exchange overlapping the previous one's experts);\n"
          "auto: the layer's adaptive n, whose search (trial steps) runs before the timed steps, shown\n"
          "as auto:N.\n"
          "--memory-reuse: MPipeMoE's strategies (s3: one micro-batch's activations, recomputed; s2,\n"
          "expert-parallel: two micro-batches of the exchange's buffers, received again in backward; s4:\n"
          "both); peak_bytes shows the saving. auto (with --memory-budget, the layer's workspace in MiB):\n"
          "the strategy MPipeMoE's Eq. 10 models fastest among those that fit, from rates measured in the\n"
          "untimed first step, shown as auto:NAME.\n"
          "--parallel-r N,...: expert-parallel, dynamic dispatch: every expert sharded over the ranks (Tutel),\n"
          "each case once per r given (0: weights all-gathered; >= 1: tokens exchanged, clipped to ceil(W/E);\n"
          "auto: the layer's choice), shown in column n as n/rR (R: the r that ran).\n"
          "--a2a (expert-parallel): the exchanges' all-to-all; auto: the layer's choice per capacity, 2DH only\n"
          "over more than one node of more than one rank (--ranks-per-node G splits one machine into nodes).\n"
          "With any of --pipeline, --parallel-r or --a2a auto, a line (JSON: \"setup\") after each case shows\n"
          "the entry of the layer's dictionary of setups (Tutel): capacity, key, r, n, algorithm, trials.\n"
          "--replicas auto (expert-parallel, dynamic dispatch): FlexMoE's replicas, E/W + 1 slots a rank; the\n"
          "policy maker runs once on the warm-up step's counts (a plan kept when K steps, default 10, of its\n"
          "modelled gain repay its copies) and its balance ratio and modelled step are printed, and after the\n"
          "timed steps the modelled step over the measured one.\n"
          "Each case's timed steps show as a progress line on stderr on a terminal (--progress: anywhere,\n"
          "--quiet: nowhere).\n"
          "--lm DIR: a language model's speed as llama.cpp's llama-bench measures it: prefill, P tokens\n"
          "(default 512) through an empty KV cache in one call, and decode, N tokens (default 128) one\n"
          "call each from an empty cache; fixed pseudo-random tokens; tokens/s, medians of R runs after an\n"
          "untimed one, and the weight bytes a decode step reads (GB/s at the median); first the load's\n"
          "seconds (moe_lm_load, once) and the megabytes of weights mapped from the file (P and N both 0:\n"
          "the load alone).\n"
          "--optimizer-params N,...: instead of the cases, the time of one AdamW step over N parameters\n"
          "(median of --reps, default 3, after 3 untimed) and the memory bandwidth it reaches at 28 bytes a\n"
          "parameter: moe train's update after each backward, a memory stream for a model larger than the\n"
          "cache.\n");
}

typedef struct { const char *name; int T, D, H, E, k; } bench_case;
static const bench_case CASES[] = {
    {"S", 2048, 512, 2048, 8, 2}, {"M", 4096, 1024, 4096, 16, 2}, {"L", 4096, 768, 3072, 64, 1}};

static uint64_t rng = 88172645463325252ull;
static float urand(void) { /* xorshift64 -> [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) * 0x1.0p-23) - 1.0f;
}

/* dst = src (n values) rounded to bf16 as the layer rounds its GEMM inputs; tmp holds n bf16s. */
static void round_bf16(float *dst, const float *src, uint16_t *tmp, size_t n) {
  moe_bf16_from_f32(tmp, src, n);
  moe_bf16_to_f32(dst, tmp, n);
}

/* Checks y for a few tokens against a double-precision evaluation of DESIGN 4.1 (relu experts). A
 * bf16 layer is checked against the same evaluation of its bf16-rounded GEMM inputs (x, W1, h, W2),
 * which leaves only the fp32 accumulation to the tolerance. */
static int check_tokens(moe_layer_t *l, const float *x, const float *y, const moe_layer_stats *st, int T) {
  int D = l->cfg.D, H = l->cfg.H, E = l->cfg.E, k = l->cfg.top_k, bf = l->cfg.dtype == MOE_DT_BF16;
  int R = D > H ? D : H;
  const float *gw = moe_layer_param(l, "gate.weight"), *gb = moe_layer_param(l, "gate.bias");
  const float *w1 = moe_layer_param(l, "experts.fc1.weight"), *b1 = moe_layer_param(l, "experts.fc1.bias");
  const float *w2 = moe_layer_param(l, "experts.fc2.weight"), *b2 = moe_layer_param(l, "experts.fc2.bias");
  double *acc = calloc((size_t)D + H + E, sizeof(double)), *h = acc + D, *p = h + H;
  float *xr = malloc(sizeof(float) * ((size_t)D + 2 * (size_t)R)), *wr = xr ? xr + D : NULL, *hr = wr ? wr + R : NULL;
  uint16_t *tmp = malloc(sizeof(uint16_t) * (size_t)R);
  int ok = acc && xr && tmp;
  for (int s = 0; s < 4 && ok; s++) {
    int t = (int)((size_t)s * 7919 % (size_t)T);
    const float *xt = x + (size_t)t * D;
    if (bf) {
      round_bf16(xr, xt, tmp, (size_t)D);
      xt = xr;
    }
    double mx = -1e300, sum = 0;
    for (int e = 0; e < E; e++) {
      double z = gb[e];
      for (int d = 0; d < D; d++) z += (double)gw[(size_t)e * D + d] * x[(size_t)t * D + d];
      p[e] = z;
      mx = fmax(mx, z);
    }
    for (int e = 0; e < E; e++) sum += (p[e] = exp(p[e] - mx));
    double wsum = 0;
    for (int j = 0; j < k; j++) wsum += p[st->experts[(size_t)t * k + j]] / sum;
    memset(acc, 0, (size_t)D * sizeof *acc);
    for (int j = 0; j < k; j++) {
      int e = st->experts[(size_t)t * k + j];
      double w = p[e] / sum / (k > 1 ? wsum : 1.0);
      for (int i = 0; i < H; i++) {
        const float *wi = w1 + ((size_t)e * H + i) * D;
        if (bf) {
          round_bf16(wr, wi, tmp, (size_t)D);
          wi = wr;
        }
        double a = b1[(size_t)e * H + i];
        for (int d = 0; d < D; d++) a += (double)wi[d] * xt[d];
        h[i] = a > 0 ? a : 0;
      }
      if (bf) {
        for (int i = 0; i < H; i++) hr[i] = (float)h[i];
        round_bf16(hr, hr, tmp, (size_t)H);
        for (int i = 0; i < H; i++) h[i] = hr[i];
      }
      for (int d = 0; d < D; d++) {
        const float *wd = w2 + ((size_t)e * D + d) * H;
        if (bf) {
          round_bf16(wr, wd, tmp, (size_t)H);
          wd = wr;
        }
        double o = b2[(size_t)e * D + d];
        for (int i = 0; i < H; i++) o += (double)wd[i] * h[i];
        acc[d] += w * o;
      }
    }
    for (int d = 0; d < D; d++) ok &= fabs(acc[d] - y[(size_t)t * D + d]) <= 1e-3 * (1 + fabs(acc[d]));
  }
  free(acc);
  free(xr);
  free(tmp);
  return ok;
}

typedef struct { int threads, reps, json, ncases, nrouting, ndispatch, ndtype; const bench_case *cases[3];
                 int routing[2], dispatch[2], dtypes[2], expert_parallel, npipe, pipes[8]; moe_reuse reuse;
                 size_t budget;
                 moe_dist *dist; cli_progress progress;
                 int nrs, rs[8], parallel_r; /* --parallel-r: Tutel's r of each run, and the current one */
                 moe_a2a a2a; int a2a_auto, ranks_per_node; /* --a2a, --ranks-per-node */
                 int replicas, horizon, profiled; moe_flex_env env; /* --replicas auto: FlexMoE */
                 double modelled_ms; /* the case's modelled step after the plan */
               } bench_opts;

static const moe_dtype DTYPES[2] = {MOE_DT_F32, MOE_DT_BF16}; /* the names in cmd_bench's dtn */

/* Expert-parallel: a barrier, so that every rank starts a timed step together. */
static void barrier(const moe_dist *d) {
  double z = 0;
  if (d) moe_dist_allreduce(d, &z, 1);
}

/* A forward with the router's last choice (fresh, from the forward just run) as cached experts, so that
 * the router runs alongside the experts: its time in *ms; its output (into yc) must be y bit for bit.
 * cache holds T k experts. */
static int cached_forward(moe_layer_t *l, const float *x, const float *y, float *yc, const int32_t *fresh,
                          int32_t *cache, const bench_case *c, double *ms) {
  moe_layer_stats st;
  memcpy(cache, fresh, (size_t)c->T * c->k * 4); /* fresh is in the workspace that the forward reuses */
  if (moe_layer_set_cached_experts(l, cache, c->T) != MOE_OK) return cli_fail(CMD);
  double s0 = cli_now();
  if (moe_layer_forward(l, x, c->T, yc, NULL, &st) != MOE_OK) return cli_fail(CMD);
  *ms = (cli_now() - s0) * 1e3;
  if (!st.router_overlapped || memcmp(y, yc, (size_t)c->T * c->D * 4))
    return cli_usage_error(CMD, "case %s: the forward with cached experts %s", c->name,
                           st.router_overlapped ? "differs from the plain one" : "did not run the router alongside");
  return 0;
}

/* --replicas auto: the policy maker once over the warm-up step's counts (the start-up profile on the
 * first case), its placement landing before the timed steps (and one more untimed step after it). */
static int rebalance(bench_opts *o, moe_layer_t *l, const moe_layer_config *cfg, const bench_case *c, int skewed,
                     const float *x, int T, float *y, const float *dy, float *dx) {
  if (!o->profiled && moe_flex_profile(cfg, &o->env) != MOE_OK) return cli_fail(CMD);
  char prof[512];
  if (!o->profiled && moe_dist_rank(o->dist) == 0) {
    flex_profile_text(&o->env, prof, sizeof prof);
    fprintf(o->json ? stderr : stdout, "replicas: profiled %s\n", prof);
  }
  o->profiled = 1;
  moe_flex_step s;
  if (moe_layer_flex_rebalance(l, &o->env, 1.2, o->horizon, &s) != MOE_OK ||
      moe_layer_forward(l, x, T, y, NULL, NULL) != MOE_OK ||
      moe_layer_backward(l, dy, 0.01f, 0.0f, NULL, NULL, dx) != MOE_OK)
    return cli_fail(CMD);
  o->modelled_ms = s.time_after * 1e3;
  if (moe_dist_rank(o->dist) == 0)
    fprintf(o->json ? stderr : stdout, "replicas, case %s %s: balance ratio %.3f -> %.3f, modelled step %.2f -> %.2f ms "
            "(copies %.2f ms), expand %d shrink %d migrate %d\n", c->name, skewed ? "skewed" : "uniform",
            s.balance_before, s.balance_after, s.time_before * 1e3, s.time_after * 1e3, s.xfer_s * 1e3, s.expands,
            s.shrinks, s.migrates);
  return 0;
}

static int run_case(bench_opts *o, const bench_case *c, int skewed, moe_dispatch disp, moe_dtype dtype,
                    int pipeline, double sg) {
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = c->D; cfg.H = c->H; cfg.E = c->E; cfg.top_k = c->k;
  cfg.dispatch = disp;
  cfg.capacity_setting = 1.25f;
  cfg.threads = o->threads;
  cfg.dtype = dtype;
  cfg.dist = o->dist; /* expert-parallel: this rank routes tokens [t0, t1) and owns E/W experts */
  cfg.parallel_r = o->parallel_r;
  cfg.a2a_auto = o->a2a_auto;
  cfg.pipeline = pipeline; /* micro-batches (moe_layer_config.pipeline) */
  cfg.memory_reuse = o->reuse;
  cfg.memory_budget = o->budget;
  int W = moe_dist_size(o->dist), rank = moe_dist_rank(o->dist);
  if (o->replicas && disp == MOE_DISPATCH_DYNAMIC) cfg.replica_slots = c->E / W + 1; /* one spare slot a rank */
  int t0 = (int)((int64_t)c->T * rank / W), Tl = (int)((int64_t)c->T * (rank + 1) / W) - t0;
  moe_layer_t l;
  if (moe_layer_init(&l, &cfg) != MOE_OK) return cli_fail(CMD);
  moe_layer_init_params(&l, 1);
  float *gb = moe_layer_param(&l, "gate.bias");
  for (int e = 0; e < c->E; e++) gb[e] = skewed ? -logf((float)e + 1.0f) : 0.0f;
  moe_layer_params_changed(&l);
  size_t td = (size_t)c->T * c->D;
  float *x = malloc(td * 4), *y = malloc(td * 4), *dy = malloc(td * 4), *dx = malloc(td * 4);
  double *tf = malloc(sizeof(double) * (size_t)o->reps), *tb = malloc(sizeof(double) * (size_t)o->reps);
  double *tc = malloc(sizeof(double) * (size_t)o->reps);
  int32_t *cache = malloc(sizeof(int32_t) * (size_t)c->T * c->k);
  int rc = 0;
  if (!x || !y || !dy || !dx || !tf || !tb || !tc || !cache) { rc = cli_usage_error(CMD, "out of memory"); goto done; }
  for (size_t i = 0; i < td; i++) { x[i] = urand(); dy[i] = urand(); }
  const float *xl = x + (size_t)t0 * c->D, *dyl = dy + (size_t)t0 * c->D;
  moe_layer_stats st;
  if (moe_layer_forward(&l, xl, Tl, y, NULL, &st) != MOE_OK) { rc = cli_fail(CMD); goto done; }
  /* expert-parallel outputs are checked against one process by the test suite (tests/test_ep.c) */
  if (!o->dist && disp == MOE_DISPATCH_DYNAMIC && !check_tokens(&l, x, y, &st, c->T)) {
    rc = cli_usage_error(CMD, "case %s (%s): the layer's output differs from the reference", c->name,
                         moe_compute_dtype_name(dtype));
    goto done;
  }
  if (moe_layer_backward(&l, dyl, 0.01f, 0.0f, NULL, NULL, dx) != MOE_OK) { rc = cli_fail(CMD); goto done; }
  for (int w = 0; w < 64 && (st.pipeline_trial || moe_layer_parallel_r_trial(&l)); w++) /* --pipeline auto,
     --parallel-r auto: the searches' trial steps, untimed */
    if (moe_layer_forward(&l, xl, Tl, y, NULL, &st) != MOE_OK ||
        moe_layer_backward(&l, dyl, 0.01f, 0.0f, NULL, NULL, dx) != MOE_OK) { rc = cli_fail(CMD); goto done; }
  if (cfg.replica_slots && (rc = rebalance(o, &l, &cfg, c, skewed, xl, Tl, y, dyl, dx))) goto done;
  moe_layer_comm_reset(&l);
  char label[64];
  snprintf(label, sizeof label, "case %s %s %s %s", c->name, skewed ? "skewed" : "uniform", moe_dispatch_name(disp),
           moe_compute_dtype_name(dtype));
  cli_progress_start(&o->progress, rank == 0, "steps", o->reps);
  for (int r = 0; r < o->reps; r++) {
    barrier(o->dist);
    double s0 = cli_now();
    if (moe_layer_forward(&l, xl, Tl, y, NULL, &st) != MOE_OK) { rc = cli_fail(CMD); goto done; }
    double s1 = cli_now();
    if (moe_layer_backward(&l, dyl, 0.01f, 0.0f, NULL, NULL, dx) != MOE_OK) { rc = cli_fail(CMD); goto done; }
    tf[r] = (s1 - s0) * 1e3;
    tb[r] = (cli_now() - s0) * 1e3;
    /* dx is free once backward has written it: it takes the cached forward's output */
    if (!o->dist && (rc = cached_forward(&l, x, y, dx, st.fresh, cache, c, tc + r))) goto done;
    cli_progress_update(&o->progress, r + 1, label, NULL);
  }
  cli_progress_break(&o->progress);
  double fwd = cli_median(tf, o->reps), fb = cli_median(tb, o->reps), fwd_cached = o->dist ? 0 : cli_median(tc, o->reps);
  moe_comm_stats cs;
  moe_layer_comm_stats(&l, &cs);
  double agg[4] = {fwd, fb, cs.seconds * 1e3 / o->reps, cs.bytes / o->reps}; /* means over ranks, bytes summed */
  if (o->dist && moe_dist_allreduce(o->dist, agg, 4) != MOE_OK) { rc = cli_fail(CMD); goto done; }
  fwd = agg[0] / W;
  fb = agg[1] / W;
  double comm_ms = agg[2] / W, bytes = agg[3];
  double kept = (double)c->T * c->k - st.dropped;
  double gflops = 12.0 * kept * c->D * c->H / (fb * 1e-3) / 1e9; /* 6 expert GEMMs of 2*rows*D*H */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  size_t peak = moe_layer_peak_bytes(&l), rss = (size_t)ru.ru_maxrss * 1024;
  const char *rt = skewed ? "skewed" : "uniform", *dn = moe_dispatch_name(disp);
  const char *dt = moe_compute_dtype_name(dtype);
  char pn[16]; /* the micro-batches, or auto:N */
  snprintf(pn, sizeof pn, cfg.pipeline ? "%d" : "auto:%d", st.pipeline);
  char rn[16]; /* the strategy, or auto:NAME */
  snprintf(rn, sizeof rn, "%s%s", cfg.memory_reuse == MOE_REUSE_AUTO ? "auto:" : "", moe_reuse_name(st.memory_reuse));
  if (cfg.parallel_r != MOE_PARALLEL_OFF) /* and Tutel's r that ran */
    snprintf(pn + strlen(pn), sizeof pn - strlen(pn), "/r%d", moe_layer_parallel_r(&l));
  if (rank != 0) goto done;
  char setup[768]; /* the dictionary's entry, if the layer has one */
  cli_setup_text(&l, o->json, setup, sizeof setup);
  if (o->dist && o->json)
    printf("{\"case\": \"%s\", \"T\": %d, \"D\": %d, \"H\": %d, \"E\": %d, \"k\": %d, \"dispatch\": \"%s\", "
           "\"routing\": \"%s\", \"dtype\": \"%s\", \"ranks\": %d, \"fwd_ms\": %.3f, \"fwdbwd_ms\": %.3f, "
           "\"comm_ms\": %.3f, \"compute_ms\": %.3f, \"bytes_per_step\": %.0f, \"gflops\": %.2f, \"peak_bytes\": %zu, "
           "\"dropped\": %d, \"threads\": %d, \"pipeline\": \"%s\", \"memory_reuse\": \"%s\", \"blas\": \"%s\", "
           "\"cpu\": %s%s}\n",
           c->name, c->T, c->D, c->H, c->E, c->k, dn, rt, dt, W, fwd, fb, comm_ms, fb - comm_ms, bytes, gflops,
           peak, st.dropped, o->threads, pn, rn, moe_blas_info(), moe_cpu_json(), setup);
  else if (o->dist)
    printf("%-4s %-8s %-8s %-5s %6s %9.1f %11.1f %9.1f %10.1f %12.1f %8d\n", c->name, rt, dn, dt, pn, fwd, fb,
           comm_ms, fb - comm_ms, bytes / 1048576.0, st.dropped);
  else if (o->json)
    printf("{\"case\": \"%s\", \"T\": %d, \"D\": %d, \"H\": %d, \"E\": %d, \"k\": %d, \"dispatch\": \"%s\", "
           "\"routing\": \"%s\", \"dtype\": \"%s\", \"fwd_ms\": %.3f, \"fwd_cached_ms\": %.3f, \"fwdbwd_ms\": %.3f, "
           "\"gflops\": %.2f, \"sgemm_gflops\": %.2f, \"roofline_ratio\": %.4f, \"peak_bytes\": %zu, "
           "\"peak_rss_bytes\": %zu, \"dropped\": %d, \"capacity\": %d, \"threads\": %d, \"pipeline\": \"%s\", "
           "\"memory_reuse\": \"%s\", \"blas\": \"%s\", \"cpu\": %s%s}\n",
           c->name, c->T, c->D, c->H, c->E, c->k, dn, rt, dt, fwd, fwd_cached, fb, gflops, sg, gflops / sg, peak, rss,
           st.dropped, st.capacity, o->threads, pn, rn, moe_blas_info(), moe_cpu_json(), setup);
  else
    printf("%-4s %-8s %-8s %-5s %6s %9.1f %10.1f %11.1f %9.1f %7.3f %10.1f %10.1f %8d\n", c->name, rt, dn, dt,
           pn, fwd, fwd_cached, fb, gflops, gflops / sg, peak / 1048576.0, rss / 1048576.0, st.dropped);
  if (!o->json && *setup) printf("%s\n", setup);
  if (cfg.replica_slots)
    fprintf(o->json ? stderr : stdout, "replicas, case %s %s: modelled step %.1f ms, measured %.1f ms: %.3f\n", c->name,
            rt, o->modelled_ms, fb, o->modelled_ms / fb);
  fflush(stdout);
done:
  free(x); free(y); free(dy); free(dx); free(tf); free(tb); free(tc); free(cache);
  moe_layer_free(&l);
  return rc;
}

/* "1,4,auto..." -> out (at most 8 micro-batch counts, auto as 0, each once); the count, or 0 when one is bad. */
static int parse_pipes(const char *v, int *out) {
  int n = 0;
  for (char buf[16];; v++) {
    size_t len = strcspn(v, ",");
    if (n == 8 || len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, v, len);
    buf[len] = 0;
    if (!cli_parse_pipeline(buf, &out[n])) return 0;
    for (int j = 0; j < n; j++)
      if (out[j] == out[n]) return 0;
    n++;
    v += len;
    if (!*v) return n;
  }
}

/* "T,D,H,E,k" -> c; 0 when a value is missing, not a positive integer, or k > E. */
static int parse_shape(const char *v, bench_case *c) {
  int *f[5] = {&c->T, &c->D, &c->H, &c->E, &c->k};
  char buf[32];
  for (int i = 0; i < 5; i++) {
    size_t len = strcspn(v, ",");
    if (len == 0 || len >= sizeof buf || (i < 4) != (v[len] == ',')) return 0;
    memcpy(buf, v, len);
    buf[len] = 0;
    if (!cli_parse_int(buf, f[i]) || *f[i] < 1) return 0;
    v += len + (i < 4);
  }
  return c->k <= c->E;
}

/* Comma-separated names -> indices into names[], each name at most once; returns the count, or
 * prints what is wrong (naming flag f and the name) and returns -1. what: "case", "routing"... */
static int parse_list(const char *f, const char *v, const char *const *names, int n, int *out, const char *what) {
  char want[64] = "";
  for (int i = 0; i < n; i++) {
    strcat(want, names[i]);
    if (i + 1 < n) strcat(want, ",");
  }
  int cnt = 0;
  for (const char *t = v;; t++) {
    int len = (int)strcspn(t, ","), found = -1;
    for (int i = 0; i < n; i++)
      if ((int)strlen(names[i]) == len && !strncmp(t, names[i], (size_t)len)) found = i;
    if (found < 0) {
      cli_usage_error(CMD, "%s: unknown %s '%.*s' in '%s' (want a comma-separated subset of %s)", f, what, len, t,
                      v, want);
      return -1;
    }
    for (int j = 0; j < cnt; j++)
      if (out[j] == found) {
        cli_usage_error(CMD, "%s: %s '%s' given twice in '%s'", f, what, names[found], v);
        return -1;
      }
    out[cnt++] = found;
    t += len;
    if (!*t) return cnt;
  }
}

int cmd_bench(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  for (int i = 1; i < argc; i++)
    if (cli_flag_is(argv[i], "lm")) return cmd_bench_lm(argc, argv);
  bench_opts o = {.threads = 0, .reps = 3, .ncases = 3, .nrouting = 2, .ndispatch = 2, .ndtype = 1, .npipe = 1,
                  .pipes = {1}, .nrs = 1, .rs = {MOE_PARALLEL_OFF},
                  .routing = {0, 1}, .dispatch = {0, 1}, .dtypes = {0, 1}};
  int idx[3] = {0, 1, 2};
  bench_case custom = {"custom", 0, 0, 0, 0, 0};
  int given_cases = 0; /* 1: --cases, 2: --shape */
  long opt_params[8];
  int nopt = 0; /* --optimizer-params: that bench alone */
  static const char *const cn[] = {"S", "M", "L"}, *const rn[] = {"uniform", "skewed"},
                           *const dn[] = {"dynamic", "static"}, *const dtn[] = {"f32", "bf16"};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { o.json = 1; continue; }
    if (cli_flag_is(f, "expert_parallel")) { o.expert_parallel = 1; continue; }
    if (cli_progress_flag(f, &o.progress)) continue;
    if (i + 1 >= argc) { usage(stderr); return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f); }
    const char *v = argv[++i];
    int ok = 1, listed = 0; /* listed < 0: parse_list has said what is wrong */
    if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o.threads) && o.threads >= 0;
    else if (cli_flag_is(f, "reps")) ok = cli_parse_int(v, &o.reps) && o.reps >= 1 && o.reps <= 100;
    else if (cli_flag_is(f, "pipeline")) ok = (o.npipe = parse_pipes(v, o.pipes)) > 0;
    else if (cli_flag_is(f, "parallel_r")) ok = (o.nrs = cli_parse_parallel_rs(v, o.rs, 8)) > 0;
    else if (cli_flag_is(f, "a2a")) ok = cli_parse_a2a(v, &o.a2a, &o.a2a_auto);
    else if (cli_flag_is(f, "ranks_per_node")) ok = cli_parse_int(v, &o.ranks_per_node) && o.ranks_per_node >= 0;
    else if (cli_flag_is(f, "memory_reuse")) {
      if (moe_reuse_parse(v, "--memory-reuse", &o.reuse) != MOE_OK) return cli_fail(CMD);
    }
    else if (cli_flag_is(f, "memory_budget")) ok = cli_parse_mib(v, &o.budget);
    else if (cli_flag_is(f, "cases")) listed = o.ncases = parse_list(f, v, cn, 3, idx, "case");
    else if (cli_flag_is(f, "routing")) listed = o.nrouting = parse_list(f, v, rn, 2, o.routing, "routing");
    else if (cli_flag_is(f, "dispatch")) listed = o.ndispatch = parse_list(f, v, dn, 2, o.dispatch, "dispatch");
    else if (cli_flag_is(f, "dtype")) listed = o.ndtype = parse_list(f, v, dtn, 2, o.dtypes, "dtype");
    else if (cli_flag_is(f, "replicas")) ok = (o.replicas = !strcmp(v, "auto")) || !strcmp(v, "off");
    else if (cli_flag_is(f, "replica_horizon")) ok = cli_parse_int(v, &o.horizon) && o.horizon >= 1;
    else if (cli_flag_is(f, "optimizer_params")) ok = (nopt = bench_optim_parse(v, opt_params, 8)) > 0;
    else if (cli_flag_is(f, "shape")) {
      ok = parse_shape(v, &custom);
      o.ncases = 1;
      idx[0] = -1; /* the custom case */
    }
    else { usage(stderr); return cli_usage_error(CMD, "unknown flag '%s'", f); }
    if (listed < 0) return 1;
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
    if (cli_flag_is(f, "shape") || cli_flag_is(f, "cases")) given_cases |= cli_flag_is(f, "shape") ? 2 : 1;
  }
  if (given_cases == 3) return cli_usage_error(CMD, "--shape and --cases: give one or the other");
  if (o.replicas && !o.expert_parallel) return cli_usage_error(CMD, "--replicas auto needs --expert-parallel");
  if (nopt && o.expert_parallel) return cli_usage_error(CMD, "--optimizer-params runs in one process: not with --expert-parallel");
  if (nopt) return bench_optim_run(opt_params, nopt, o.threads ? o.threads : cli_cpu_count(), o.reps, o.json);
  for (int i = 0; i < o.ncases; i++) o.cases[i] = idx[i] < 0 ? &custom : &CASES[idx[i]];
  if (o.expert_parallel && moe_dist_init(&o.dist, &argc, &argv) != MOE_OK) return cli_fail(CMD);
  cli_hold_errors(o.dist); /* a failure in a case: the failing ranks say so, then every rank stops */
  if (o.dist && moe_dist_set_a2a(o.dist, o.a2a, o.ranks_per_node) != MOE_OK) return cli_dist_end(o.dist, CMD, cli_fail(CMD));
  int W = moe_dist_size(o.dist), root = moe_dist_rank(o.dist) == 0;
  if (!o.threads) o.threads = cli_cpu_count() / W > 0 ? cli_cpu_count() / W : 1;
  double sg = moe_sgemm_gflops(2048, o.threads, 3);
  /* for bf16, whether oneDNN runs it on the CPU's bf16 instructions */
  int any_bf16 = 0;
  for (int t = 0; t < o.ndtype; t++) any_bf16 |= DTYPES[o.dtypes[t]] == MOE_DT_BF16;
  const char *bfi = !any_bf16 ? "" : moe_bf16_native() ? "; bf16 on oneDNN, native AVX512-BF16"
                                                       : "; bf16 on oneDNN, not native: no AVX512-BF16";
  if (!o.json && root && o.dist) {
    printf("moe %s, %s%s, %d ranks x %d threads; per step: fwd+bwd, time in exchanges, bytes sent "
           "(all ranks)\n%s\n", MOE_VERSION, moe_blas_info(), bfi, W, o.threads, moe_cpu_info());
    printf("%-4s %-8s %-8s %-5s %6s %9s %11s %9s %10s %12s %8s\n", "case", "routing", "dispatch", "dtype", "n",
           "fwd_ms", "fwdbwd_ms", "comm_ms", "compute_ms", "MiB_sent", "dropped");
  } else if (!o.json && root) {
    printf("moe %s, %s%s, %d threads; fp32 sgemm 2048^3: %.1f GFLOP/s\n%s\n", MOE_VERSION, moe_blas_info(), bfi,
           o.threads, sg, moe_cpu_info());
    printf("%-4s %-8s %-8s %-5s %6s %9s %10s %11s %9s %7s %10s %10s %8s\n", "case", "routing", "dispatch", "dtype",
           "n", "fwd_ms", "fwd_cached", "fwdbwd_ms", "GFLOP/s", "ratio", "peak_MiB", "rss_MiB", "dropped");
  }
  int rc = 0;
  for (int c = 0; c < o.ncases && !rc; c++)
    for (int r = 0; r < o.nrouting && !rc; r++)
      for (int d = 0; d < o.ndispatch && !rc; d++)
        for (int t = 0; t < o.ndtype && !rc; t++)
          for (int n = 0; n < o.npipe && !rc; n++)
            for (int q = 0; q < o.nrs && !rc; q++) { /* the sharded layout: dynamic dispatch */
              o.parallel_r = o.dist ? o.rs[q] : MOE_PARALLEL_OFF;
              if ((q == 0 || o.parallel_r != MOE_PARALLEL_OFF) &&
                  (o.parallel_r == MOE_PARALLEL_OFF || o.dispatch[d] == MOE_DISPATCH_DYNAMIC))
                rc = run_case(&o, o.cases[c], o.routing[r], (moe_dispatch)o.dispatch[d], DTYPES[o.dtypes[t]],
                              o.pipes[n], sg);
            }
  return cli_dist_end(o.dist, CMD, rc);
}
