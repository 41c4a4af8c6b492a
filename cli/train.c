/* moe train: a classifier of L MoE blocks on IDX data (MNIST by default), with checkpoints every
 * epoch, --resume, expert traces, a progress line per epoch and --json logs. The last stdout line
 * is test_accuracy=0.xxxx ({"test_accuracy": 0.xxxx} with --json, whose stdout is JSON lines only). Data order and augmentation are functions of (seed, epoch, position),
 * so a resumed run sees exactly the batches the uninterrupted run would have seen. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "progress.h"
#include "rank_errors.h"
#include "train_adjust.h"
#include "train_data.h"
#include "train_flex.h"
#include "train_lm.h"

static const char *CMD = "train";
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

typedef struct {
  const char *data, *checkpoint, *resume, *trace;
  int json, log_steps, epochs, stop_after, batch, warmup, threads;
  moe_augment aug; /* --augment, --augment-rotate, --augment-scale */
  int val; /* --val N: evaluate on the last N training images, held out, instead of the test set */
  int skip_nan; /* --on-nan skip-step */
  train_adjust adj; /* --capacity dynamic, --cache-assignments */
  int replicas, slots, replica_horizon; /* --replicas auto, --slots, --replica-horizon: FlexMoE (train_flex.c) */
  float balance_threshold;
  const char *replica_ops;
  float lr;
  uint64_t seed;
  moe_model_config model;
  moe_optim_config optim;
  cli_progress progress; /* --progress, --quiet */
  int parallel_r[8], n_parallel_r; /* --parallel-r: Tutel's r, or several taken in turn step by step */
  moe_a2a a2a; /* --a2a linear|2dh (auto: model.moe.a2a_auto, on 2DH's grid) */
  int ranks_per_node; /* --ranks-per-node: 2DH's nodes */
} train_opts;

static void usage(FILE *f) {
  fprintf(f,
    "usage: moe train [--task classifier] [--data DIR] [--experts E] [--top-k K] [--hidden H] [--model D] [--blocks L]\n"
    "       [--hier-experts E2 [--hier-top-k K2]]   (hierarchical MoE: each expert an MoE of E2 experts)\n"
    "       [--capacity X|dynamic [--delta-launch N] [--headroom H]] [--dispatch dynamic|static]\n"
    "       [--priority index|score] [--router linear|cosine]\n"
    "       [--cache-assignments [--cache-on 0.96] [--cache-off 0.90] [--cache-min-epoch 10]]\n"
    "       (--delta-launch N: RECOMPILE decisions, capacity or caching, land N + 1 steps late)\n"
    "       [--activation relu|gelu|silu|swiglu] [--loss cooperation|specification] [--dtype f32|bf16]\n"
    "       [--aux-weight W] [--z-weight W] [--optimizer adam|sgd] [--lr LR] [--weight-decay W]\n"
    "       [--momentum M] [--warmup STEPS] [--batch B] [--epochs N] [--stop-after N]\n"
    "       [--augment PX] [--augment-rotate DEG] [--augment-scale F]   (training images shifted by up to PX\n"
    "       pixels, rotated by up to DEG degrees, scaled by 1 +- F: default 2, 15, 0.15; 0 turns one off)\n"
    "       [--seed S] [--threads N] [--checkpoint F] [--resume F] [--trace F] [--json] [--log-steps] [--val N]\n"
    "       [--on-nan stop|skip-step] [--progress|--quiet]\n"
    "       [--replicas auto|off [--slots E_v] [--balance-threshold 1.2] [--replica-horizon 10]\n"
    "       [--replica-ops OPS]]   (FlexMoE under mpirun: replicas of hot experts, a plan kept when the\n"
    "       model says --replica-horizon steps repay its copies; OPS, a test hook replacing the policy: STEP:expand:E:G,\n"
    "       STEP:shrink:E:G, STEP:migrate:A:I:B:J, comma-separated)\n"
    "       [--pipeline N|auto] [--memory-reuse none|s2|s3|s4|auto [--memory-budget MIB]]   (the experts as\n"
    "       N micro-batches; same bits; auto: MPipeMoE's adaptive search over timed steps; memory reuse\n"
    "       auto: the strategy Eq. 10 models fastest among those whose workspace fits the budget)\n"
    "       [--parallel-r N|auto|N1,N2,...]   (under mpirun: every expert sharded over the ranks, Tutel's r;\n"
    "       a list takes its values in turn, one per step; one process has no r and ignores it)\n"
    "       [--a2a linear|2dh|auto [--ranks-per-node G]]   (under mpirun: the exchanges' all-to-all; auto: the\n"
    "       layer's choice per capacity; --ranks-per-node G splits one machine into nodes of G ranks for 2DH)\n"
    "--epochs is the planned total (the learning-rate schedule's horizon); --stop-after N ends this run\n"
    "after epoch N, and --resume F continues from checkpoint F. --dtype bf16 runs the expert GEMMs in\n"
    "bf16 (fp32 accumulation, fp32 master weights); its checkpoints store the expert weights as BF16.\n"
    "A step whose activations, gradients or updated weights go NaN or Inf stops training with the epoch,\n"
    "step, block and tensor (--on-nan stop, the default); --on-nan skip-step drops that step's update\n"
    "instead and goes on, counting the steps skipped. A progress line (rate, ETA) goes to stderr on a\n"
    "terminal; --progress shows it anywhere, --quiet nowhere. --val N trains on all but the last N training\n"
    "images and reports the accuracy on those (val_acc, val_accuracy=) in place of the test set's.\n"
    "moe train --task lm --help: the language model's training.\n");
}

static void defaults(train_opts *o) {
  memset(o, 0, sizeof *o);
  o->data = DEFAULT_DATA;
  o->epochs = 60; /* chosen on a validation split: BENCHMARKS "The recipe" */
  o->batch = 64;
  o->warmup = -1; /* one epoch */
  o->aug.shift = 2;
  o->aug.rotate = 15; /* chosen on a validation split: BENCHMARKS "The recipe" */
  o->aug.scale = 0.15f;
  o->lr = 2e-3f;
  train_adjust_defaults(&o->adj);
  o->balance_threshold = 1.2f;
  o->seed = 1;
  moe_model_config_default(&o->model);
  o->model.moe.D = 128;
  o->model.moe.H = 512;
  o->model.moe.E = 8;
  o->model.moe.top_k = 2;
  o->model.moe.act = MOE_ACT_GELU;
  o->model.moe.inner_top_k = 1;
  moe_optim_config_default(&o->optim);
  o->optim.weight_decay = 0.01f;
}

/* Parses flags into o. Architecture flags are recorded in `arch` so --resume can reject them. */
static int parse(int argc, char **argv, train_opts *o, int *arch) {
  moe_layer_config *m = &o->model.moe;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { o->json = 1; continue; }
    if (cli_flag_is(f, "log_steps")) { o->log_steps = 1; continue; }
    if (cli_flag_is(f, "cache_assignments")) { o->adj.cache_assignments = 1; continue; }
    if (cli_progress_flag(f, &o->progress)) continue;
    if (i + 1 >= argc) {
      if (!cli_quiet_rank()) usage(stderr);
      return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    }
    const char *v = argv[++i];
    int ok = 1, is_arch = 1;
    moe_status st = MOE_OK;
    int adjust = train_adjust_flag(f, v, m, &o->adj, &ok, &st); /* 1: the layer's options, architecture */
    if (adjust) is_arch = adjust == 1;
    else if (cli_flag_is(f, "experts")) ok = cli_parse_int(v, &m->E);
    else if (cli_flag_is(f, "top_k")) ok = cli_parse_int(v, &m->top_k);
    else if (cli_flag_is(f, "hidden")) ok = cli_parse_int(v, &m->H);
    else if (cli_flag_is(f, "model")) ok = cli_parse_int(v, &m->D);
    else if (cli_flag_is(f, "blocks")) ok = cli_parse_int(v, &o->model.blocks);
    else if (cli_flag_is(f, "hier_experts")) ok = cli_parse_int(v, &m->inner_experts);
    else if (cli_flag_is(f, "hier_top_k")) ok = cli_parse_int(v, &m->inner_top_k);
    else if (cli_flag_is(f, "priority")) st = moe_priority_parse(v, "--priority", &m->priority);
    else if (cli_flag_is(f, "router")) st = moe_router_parse(v, "--router", &m->router);
    else if (cli_flag_is(f, "activation")) st = moe_act_parse(v, "--activation", &m->act);
    else if (cli_flag_is(f, "loss")) st = moe_loss_parse(v, "--loss", &o->model.loss);
    else if (cli_flag_is(f, "aux_weight")) ok = cli_parse_float(v, &o->model.aux_weight);
    else if (cli_flag_is(f, "z_weight")) ok = cli_parse_float(v, &o->model.z_weight);
    else if (cli_flag_is(f, "optimizer")) st = moe_opt_parse(v, "--optimizer", &o->optim.kind);
    else if (cli_flag_is(f, "weight_decay")) ok = cli_parse_float(v, &o->optim.weight_decay);
    else if (cli_flag_is(f, "momentum")) ok = cli_parse_float(v, &o->optim.momentum);
    else {
      is_arch = 0;
      if (cli_flag_is(f, "data")) o->data = v;
      else if (cli_flag_is(f, "task")) ok = !strcmp(v, "classifier"); /* "lm": cmd_train_lm */
      else if (cli_flag_is(f, "checkpoint")) o->checkpoint = v;
      else if (cli_flag_is(f, "resume")) o->resume = v;
      else if (cli_flag_is(f, "trace")) o->trace = v;
      else if (cli_flag_is(f, "lr")) ok = cli_parse_float(v, &o->lr) && o->lr > 0;
      else if (cli_flag_is(f, "warmup")) ok = cli_parse_int(v, &o->warmup) && o->warmup >= 0;
      else if (cli_flag_is(f, "batch")) ok = cli_parse_int(v, &o->batch) && o->batch > 0;
      else if (cli_flag_is(f, "epochs")) ok = cli_parse_int(v, &o->epochs) && o->epochs > 0;
      else if (cli_flag_is(f, "stop_after")) ok = cli_parse_int(v, &o->stop_after) && o->stop_after > 0;
      else if (cli_flag_is(f, "augment")) ok = cli_parse_int(v, &o->aug.shift) && o->aug.shift >= 0 && o->aug.shift < 8;
      else if (cli_flag_is(f, "augment_rotate"))
        ok = cli_parse_float(v, &o->aug.rotate) && o->aug.rotate >= 0 && o->aug.rotate <= 90;
      else if (cli_flag_is(f, "augment_scale"))
        ok = cli_parse_float(v, &o->aug.scale) && o->aug.scale >= 0 && o->aug.scale < 1;
      else if (cli_flag_is(f, "val")) ok = cli_parse_int(v, &o->val) && o->val > 0;
      else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0;
      else if (cli_flag_is(f, "on_nan")) ok = (o->skip_nan = !strcmp(v, "skip-step")) || !strcmp(v, "stop");
      else if (cli_flag_is(f, "pipeline")) ok = cli_parse_pipeline(v, &m->pipeline);
      else if (cli_flag_is(f, "memory_reuse")) st = moe_reuse_parse(v, "--memory-reuse", &m->memory_reuse);
      else if (cli_flag_is(f, "memory_budget")) ok = cli_parse_mib(v, &m->memory_budget);
      else if (cli_flag_is(f, "parallel_r")) {
        ok = (o->n_parallel_r = cli_parse_parallel_rs(v, o->parallel_r, 8)) > 0;
        m->parallel_r = ok ? o->parallel_r[0] : m->parallel_r;
      }
      else if (cli_flag_is(f, "a2a")) ok = cli_parse_a2a(v, &o->a2a, &m->a2a_auto);
      else if (cli_flag_is(f, "ranks_per_node")) ok = cli_parse_int(v, &o->ranks_per_node) && o->ranks_per_node >= 0;
      else if (cli_flag_is(f, "replicas")) ok = (o->replicas = !strcmp(v, "auto")) || !strcmp(v, "off");
      else if (cli_flag_is(f, "slots")) ok = cli_parse_int(v, &o->slots) && o->slots >= 1;
      else if (cli_flag_is(f, "balance_threshold")) ok = cli_parse_float(v, &o->balance_threshold) && o->balance_threshold >= 1;
      else if (cli_flag_is(f, "replica_ops")) o->replica_ops = v;
      else if (cli_flag_is(f, "replica_horizon")) ok = cli_parse_int(v, &o->replica_horizon) && o->replica_horizon >= 1;
      else if (cli_flag_is(f, "seed")) {
        char *end;
        errno = 0;
        o->seed = strtoull(v, &end, 10);
        ok = *v && !*end && !errno;
      } else {
        if (!cli_quiet_rank()) usage(stderr);
        return cli_usage_error(CMD, "unknown flag '%s'", f);
      }
    }
    if (st != MOE_OK) return cli_fail(CMD);
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
    if (is_arch) *arch = 1;
  }
  return 0;
}

/* The checkpoint's training options (moe_classifier_options_parse) into o; 0 if missing or out of range. */
static int load_extra(const char *s, train_opts *o) {
  moe_classifier_options c;
  if (!moe_classifier_options_parse(s, &c)) return 0;
  o->epochs = c.epochs, o->batch = c.batch, o->warmup = c.warmup, o->lr = c.lr, o->adj = c.adjust, o->aug = c.aug;
  return 1;
}

typedef struct {
  double loss, aux;
  long correct, seen, dropped, assigned;
  double load_ratio; /* sum over steps of max/mean expert load (all blocks) */
  int steps;
} epoch_acc;

static void accumulate(epoch_acc *a, const moe_model_t *m, const moe_train_batch_stats *s, int B) {
  a->loss += s->loss * B;
  a->aux += s->aux;
  a->correct += s->correct;
  a->seen += B;
  a->dropped += s->dropped;
  a->steps++;
  double worst = 0;
  for (int i = 0; i < m->cfg.blocks; i++) {
    const moe_layer_stats *ls = moe_model_layer_stats(m, i);
    long sum = 0, mx = 0;
    for (int e = 0; e < m->cfg.moe.E; e++) {
      sum += ls->expert_counts[e];
      mx = ls->expert_counts[e] > mx ? ls->expert_counts[e] : mx;
    }
    a->assigned += sum;
    if (sum) worst = (double)mx * m->cfg.moe.E / sum > worst ? (double)mx * m->cfg.moe.E / sum : worst;
  }
  a->load_ratio += worst;
}

/* The progress line after step `step` (1-based) of epoch `epoch` (1-based), with the epoch's means. */
static void progress(cli_progress *p, int epoch, int epochs, int step, const epoch_acc *a) {
  char label[32], extra[128];
  snprintf(label, sizeof label, "epoch %d/%d", epoch, epochs);
  snprintf(extra, sizeof extra, "loss %.4f acc %.4f aux %.4f drop %.4f load %.2f", a->seen ? a->loss / a->seen : 0,
           a->seen ? (double)a->correct / a->seen : 0, a->steps ? a->aux / a->steps : 0,
           a->assigned ? (double)a->dropped / a->assigned : 0, a->steps ? a->load_ratio / a->steps : 0);
  cli_progress_update(p, step, label, extra);
}

/* ---- the run: the classifier behind the trainer's model interface (moe_train_classifier), the
 * printing, progress, trace, --parallel-r and FlexMoE in the trainer's callbacks ---- */

typedef struct {
  train_opts *o;
  moe_model_t *m;
  moe_trainer *tr;
  int steps, B;
  int epoch;                              /* of the epoch's report (-1: none yet) */
  moe_trace_writer *tw;
  moe_flex_trainer *ft;
  int caching;
  int64_t caching_from, skipped0;
  double frac_same, t0, rate, test_acc;   /* test_acc: of the test set, or with --val of the validation split */
  epoch_acc a;
  /* A callback's failure, its message printed or held; local: the other ranks may be in a collective
   * (left for cli_dist_end), else settled where every rank meets. interrupted: ^C before an evaluation. */
  int rc, local, interrupted;
} cls_run;

static moe_status cls_failed(cls_run *r, int rc, int local) {
  r->rc = rc;
  r->local = local;
  return MOE_ERR_STATE;
}

/* Before the step's forward: --parallel-r's r, and the adjustments due. */
static moe_status cls_on_batch(void *ctx, int64_t step, const int32_t *ids, int n) {
  cls_run *r = ctx;
  moe_model_t *m = r->m;
  int epoch = (int)(step / r->steps);
  if (epoch != r->epoch) { /* an epoch's start: its report reset */
    moe_trainer_info info;
    moe_trainer_get_info(r->tr, &info);
    r->a = (epoch_acc){0};
    r->skipped0 = info.skipped;
    r->t0 = cli_now();
    r->epoch = epoch;
    cli_progress_start(&r->o->progress, moe_dist_rank(m->cfg.moe.dist) == 0, "steps", r->steps); /* rank 0 reports */
  }
  for (int b = 0; m->cfg.moe.dist && r->o->n_parallel_r > 1 && b < m->cfg.blocks; b++) /* switching moves no weights */
    if (moe_layer_set_parallel_r(&m->layers[b], r->o->parallel_r[step % r->o->n_parallel_r]))
      return cls_failed(r, cli_fail(CMD), 1);
  (void)ids, (void)n;
  if (r->ft && moe_flex_trainer_begin(r->ft, m, moe_trainer_optim(r->tr), step) != MOE_OK)
    return cls_failed(r, cli_fail(CMD), 1);
  return MOE_OK;
}

/* After the update (or its skip): the records, the trace, the progress; at an epoch's end its rate. */
static moe_status cls_on_step(void *ctx, const moe_train_step *s) {
  cls_run *r = ctx;
  int64_t step = s->step - 1;
  int in_epoch = (int)(step % r->steps);
  if (s->skipped) {
    cli_progress_break(&r->o->progress);
    moe_trainer_info info;
    moe_trainer_get_info(r->tr, &info);
    if (info.skipped == 1 && moe_dist_rank(r->m->cfg.moe.dist) == 0)
      fprintf(stderr, "moe train: epoch %d, batch %d of %d (step %lld): update skipped: %s (further skips "
              "are counted)\n", r->epoch + 1, in_epoch + 1, r->steps, (long long)step, moe_last_error());
  } else {
    accumulate(&r->a, r->m, &s->batch, r->B);
    if (r->ft && moe_flex_trainer_push(r->ft, r->m, step, s->batch.loss) != MOE_OK)
      return cls_failed(r, cli_fail(CMD), 1);
    if (r->tw && moe_trace_writer_add_model(r->tw, r->m, step) != MOE_OK) return cls_failed(r, cli_fail(CMD), 1);
    progress(&r->o->progress, r->epoch + 1, r->o->epochs, in_epoch + 1, &r->a);
    if (r->o->log_steps) printf("{\"step\": %lld, \"loss\": %.9g}\n", (long long)step, s->batch.loss);
  }
  if (in_epoch + 1 < r->steps) return MOE_OK;
  r->frac_same = s->frac_same, r->caching = s->caching, r->caching_from = s->caching_from; /* for the report */
  cli_progress_break(&r->o->progress);
  if (interrupted) return r->interrupted = 1, MOE_ERR_STATE; /* no evaluation */
  r->rate = r->steps / (cli_now() - r->t0);
  return MOE_OK;
}

/* After the epoch's evaluation: the caching switch and the report (the trainer writes the checkpoint). */
static moe_status cls_on_eval(void *ctx, const moe_train_step *s) {
  cls_run *r = ctx;
  r->test_acc = s->valid_accuracy;
  train_opts *o = r->o;
  epoch_acc *a = &r->a;
  int epoch = r->epoch;
  const char *split = o->val ? "val" : "test";
  double seen = a->seen ? a->seen : 1, nsteps = a->steps ? a->steps : 1; /* every step skipped: zeros */
  double loss = a->loss / seen, acc = a->correct / seen, aux = a->aux / nsteps;
  double drop = a->assigned ? (double)a->dropped / a->assigned : 0, load = a->load_ratio / nsteps;
  if (o->json)
    printf("{\"epoch\": %d, \"steps\": %lld, \"loss\": %.6f, \"train_accuracy\": %.4f, \"aux_loss\": %.6f, "
           "\"dropped_fraction\": %.6f, \"max_mean_load\": %.4f, \"steps_per_s\": %.2f, \"%s_accuracy\": %.4f}\n",
           epoch + 1, (long long)s->step, loss, acc, aux, drop, load, r->rate, split, r->test_acc);
  else
    printf("epoch %d/%d: loss %.4f train_acc %.4f aux %.4f dropped %.4f max/mean load %.2f %.1f steps/s "
           "%s_acc %.4f\n", epoch + 1, o->epochs, loss, acc, aux, drop, load, r->rate, split, r->test_acc);
  moe_trainer_info info;
  moe_trainer_get_info(r->tr, &info);
  if (o->skip_nan && o->json)
    printf("{\"epoch\": %d, \"skipped_steps\": %lld}\n", epoch + 1, (long long)(info.skipped - r->skipped0));
  else if (o->skip_nan)
    printf("  steps skipped (non-finite, --on-nan skip-step): %lld\n", (long long)(info.skipped - r->skipped0));
  if (o->adj.cache_assignments && !o->json)
    printf("  samples not reassigned since the last epoch: %.4f; caching %s (on from step %lld)\n", r->frac_same,
           r->caching ? "on" : "off", (long long)r->caching_from);
  if (o->adj.cache_assignments && o->json)
    printf("{\"epoch\": %d, \"frac_same\": %.4f, \"caching\": %d, \"caching_from_step\": %lld}\n", epoch + 1,
           r->frac_same, r->caching, (long long)r->caching_from);
  fflush(stdout);
  return MOE_OK;
}

/* The epochs from step (an epoch's first: 0, or a checkpoint's) on the trainer, which takes over opt's
 * state. */
static int run(train_opts *o, moe_model_t *m, moe_optim_t *opt, moe_dataset *train, moe_dataset *test,
               int64_t step) {
  int B = o->batch, steps = train->n / B;
  const moe_dist *dist = m->cfg.moe.dist;
  int rank = moe_dist_rank(dist);
  cls_run r = {.o = o, .m = m, .steps = steps, .B = B, .epoch = -1, .caching_from = -1, .frac_same = -1,
               .test_acc = -1};
  /* Under mpirun a failure that every rank meets at the same point (set-up, divergence, a checkpoint
   * rank 0 could not write) is settled there; any other (local: the others may be in a collective)
   * leaves the loops unsettled, for cli_dist_end to stop every rank. */
  int rc = steps ? 0 : cli_usage_error(CMD, "--batch %d is larger than the training set (%d)", B, train->n), local = 0;
  if (!rc && o->trace && rank == 0 && moe_trace_writer_open(&r.tw, o->trace, step) != MOE_OK) /* rank 0 writes: */
    rc = cli_fail(CMD);                                                                       /* the whole batch's */
  moe_trainer_config tc;
  moe_trainer_config_default(&tc);
  tc.lr = o->lr;
  tc.steps = o->epochs * steps;
  tc.warmup = o->warmup < 0 ? steps : o->warmup; /* one epoch */
  tc.stop_after = o->stop_after && o->stop_after < o->epochs ? o->stop_after * steps : 0;
  tc.eval_every = steps ? steps : 1; /* an evaluation each epoch */
  tc.optim = opt->cfg;
  tc.on_nan = o->skip_nan ? MOE_ON_NAN_SKIP : MOE_ON_NAN_STOP;
  tc.checkpoint = o->checkpoint; /* after each evaluation */
  tc.batch = B;
  tc.seed = o->seed;
  tc.adjust = o->adj;
  tc.on_batch = cls_on_batch;
  tc.on_step = cls_on_step;
  tc.on_eval = cls_on_eval;
  tc.ctx = &r;
  moe_train_model model;
  if (!rc && (moe_train_classifier(&model, m, train, test, &o->aug, &tc) != MOE_OK ||
              moe_trainer_new(&r.tr, &tc, &model) != MOE_OK))
    rc = cli_usage_error(CMD, "%s", moe_last_error());
  if (r.tr) { /* the optimizer's state, new or the checkpoint's, becomes the trainer's */
    moe_optim_t *to = moe_trainer_optim(r.tr);
    moe_optim_free(to);
    *to = *opt;
    memset(opt, 0, sizeof *opt);
    moe_trainer_set_step(r.tr, step);
  }
  rc = cli_settle(dist, CMD, rc);
  if (!rc && m->cfg.moe.replica_slots)
    rc = cli_settle(dist, CMD, flex_start(&r.ft, m, o->balance_threshold, o->replica_horizon, o->adj.delta_launch,
                                          o->replica_ops, stdout));
  while (!rc && !moe_trainer_done(r.tr) && !interrupted) {
    moe_trainer_info info;
    moe_trainer_get_info(r.tr, &info);
    moe_train_step s;
    moe_status st = moe_trainer_step(r.tr, &s);
    if (st == MOE_OK) continue;
    if (r.interrupted) break;
    int e = (int)(info.step / steps) + 1, b = (int)(info.step % steps) + 1;
    if (r.rc) rc = r.rc, local = r.local;
    else if (s.evaluated && isnan(s.valid_accuracy)) /* the evaluation itself failed */
      rc = cli_usage_error(CMD, "epoch %d: evaluating the test set: %s", e, moe_last_error()), local = 1;
    else if (s.evaluated) rc = cli_fail(CMD); /* the checkpoint, its failure settled by the trainer */
    else if (st == MOE_ERR_VALUE) /* a divergence is found on every rank at the same step; anything else is local */
      rc = cli_usage_error(CMD, "epoch %d, batch %d of %d (step %lld): training diverged: %s; lower --lr, or "
                           "--on-nan skip-step drops such steps", e, b, steps, (long long)info.step, moe_last_error());
    else
      rc = cli_fail(CMD), local = 1;
    if (rc && !local && r.rc == 0) rc = cli_settle(dist, CMD, rc);
  }
  cli_progress_break(&o->progress);
  moe_trainer_info info = {0};
  if (r.tr) moe_trainer_get_info(r.tr, &info);
  if (moe_trace_writer_close(r.tw) != MOE_OK && !rc) rc = cli_fail(CMD);
  if (!local && !interrupted) rc = cli_settle(dist, CMD, rc); /* rank 0's trace file */
  if (r.tr && !rc && rank == 0) train_capacity_report(r.tr, o->json ? stderr : stdout); /* rank 0 reports, as on stdout */
  if (r.ft && !rc) flex_report(r.ft, m, o->json ? stderr : stdout, o->json);
  moe_flex_trainer_free(r.ft);
  moe_trainer_free(r.tr);
  if (rc) return rc;
  if (interrupted) {
    fprintf(stderr, "\nmoe train: interrupted at step %lld; %s\n", (long long)info.step,
            o->checkpoint ? "the last complete checkpoint is intact" : "no checkpoint was requested");
    return 130;
  }
  const char *split = o->val ? "val" : "test";
  if (r.test_acc < 0 && moe_model_accuracy(m, test, 500, &r.test_acc) != MOE_OK) return cli_fail(CMD);
  if (o->json) printf("{\"%s_accuracy\": %.4f}\n", split, r.test_acc); /* --json: JSON lines only on stdout */
  else printf("%s_accuracy=%.4f\n", split, r.test_acc);
  return 0;
}

/* Under mpirun every rank must train the same model on the same data: its options, data sizes and
 * labels against rank 0's (moe_dist_agree), before the first collective. */
static moe_status agree(const moe_dist *d, const train_opts *o, const moe_dataset *train, const moe_dataset *test) {
  const moe_layer_config *l = &o->model.moe;
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
  const moe_dist_setting s[] = {
      {"--experts", l->E, NULL}, {"--top-k", l->top_k, NULL}, {"--hidden", l->H, NULL}, {"--model", l->D, NULL},
      {"--blocks", o->model.blocks, NULL}, {"--hier-experts", l->inner_experts, NULL},
      {"--hier-top-k", l->inner_top_k, NULL}, {"--capacity", l->capacity_setting, NULL},
      {"--capacity dynamic", o->adj.dynamic_capacity, NULL}, {"--delta-launch", o->adj.delta_launch, NULL},
      {"--headroom", o->adj.headroom, NULL}, {"--dispatch", l->dispatch, moe_dispatch_name(l->dispatch)},
      {"--priority", l->priority, moe_priority_name(l->priority)}, {"--router", l->router, moe_router_name(l->router)},
      {"--activation", l->act, moe_act_name(l->act)}, {"--dtype", l->dtype, moe_compute_dtype_name(l->dtype)},
      {"--loss", o->model.loss, moe_loss_name(o->model.loss)}, {"--aux-weight", o->model.aux_weight, NULL},
      {"--z-weight", o->model.z_weight, NULL}, {"--optimizer", o->optim.kind, moe_opt_name(o->optim.kind)},
      {"--lr", o->lr, NULL}, {"--weight-decay", o->optim.weight_decay, NULL}, {"--momentum", o->optim.momentum, NULL},
      {"--warmup", o->warmup, NULL}, {"--batch", o->batch, NULL}, {"--epochs", o->epochs, NULL},
      {"--stop-after", o->stop_after, NULL}, {"--augment", o->aug.shift, NULL}, {"--val", o->val, NULL},
      {"--augment-rotate", o->aug.rotate, NULL}, {"--augment-scale", o->aug.scale, NULL},
      {"--seed", cli_hash(&o->seed, sizeof o->seed), seed}, {"--cache-assignments", o->adj.cache_assignments, NULL},
      {"--cache-on", o->adj.cache.on, NULL}, {"--cache-off", o->adj.cache.off, NULL},
      {"--cache-min-epoch", o->adj.cache.min_epoch, NULL}, {"--on-nan skip-step", o->skip_nan, NULL},
      {"--pipeline", l->pipeline, NULL}, /* each micro-batch is an exchange: the counts must match */
      {"--parallel-r", cli_hash(o->parallel_r, sizeof(int) * (size_t)o->n_parallel_r) + l->parallel_r, NULL},
      {"--a2a", o->a2a + 2 * l->a2a_auto, l->a2a_auto ? "auto" : o->a2a ? "2dh" : "linear"},
      {"--ranks-per-node", o->ranks_per_node, NULL},
      {"--slots", l->replica_slots, NULL}, {"--balance-threshold", o->balance_threshold, NULL},
      {"--replica-horizon", o->replica_horizon, NULL},
      {"--replica-ops", o->replica_ops ? cli_hash(o->replica_ops, strlen(o->replica_ops)) : 0, NULL},
      {"--checkpoint", o->checkpoint != NULL, NULL}, {"--resume", o->resume != NULL, NULL}, /* collectives */
      {"training images", train->n, NULL}, {"image rows", train->rows, NULL}, {"image columns", train->cols, NULL},
      {"training labels (hash)", cli_hash(train->labels, (size_t)train->n), NULL}, {"test images", test->n, NULL},
      {"test labels (hash)", cli_hash(test->labels, (size_t)test->n), NULL},
  };
  return moe_dist_agree(d, s, (int)(sizeof s / sizeof s[0]));
}

/* The model and optimizer: from --resume's checkpoint (its training options, the flags given now
 * winning), or new. 0 or the exit status, its message held or printed. */
static int setup(int argc, char **argv, train_opts *o, int arch, const moe_dataset *train, const moe_dataset *test,
                 moe_model_t *m, moe_optim_t *opt, int64_t *step) {
  if (!o->resume) {
    o->model.in_dim = train->rows * train->cols;
    o->model.classes = train->classes > test->classes ? train->classes : test->classes;
    o->model.moe.threads = o->threads;
    if (moe_model_init(m, &o->model) != MOE_OK || moe_optim_init(opt, &o->optim, m) != MOE_OK) return cli_fail(CMD);
    moe_model_init_params(m, o->seed);
    return 0;
  }
  moe_train_state ts;
  if (arch) return cli_usage_error(CMD, "--resume takes the model and optimizer from the checkpoint; drop the architecture flags");
  /* under mpirun each rank keeps its own experts, whatever number of ranks saved the file */
  if ((o->model.moe.replica_slots
           ? moe_checkpoint_load_replicas(o->resume, o->model.moe.dist, o->model.moe.replica_slots, m, opt, &ts)
           : moe_checkpoint_load_sharded(o->resume, o->model.moe.dist, o->model.moe.parallel_r, m, opt, &ts)) != MOE_OK)
    return cli_fail(CMD);
  if (!opt->m) return cli_usage_error(CMD, "%s: has no optimizer state to resume from", o->resume);
  if (!load_extra(ts.extra, o))
    return cli_usage_error(CMD, "%s: __metadata__ train='%s' is not a valid set of training options", o->resume, ts.extra);
  int saved_batch = o->batch;
  parse(argc, argv, o, &arch); /* flags given now win over the checkpoint's (they parsed once already) */
  if (o->batch != saved_batch && train->n / o->batch != train->n / saved_batch) /* the trainer's epochs are steps */
    return cli_usage_error(CMD, "--batch %d on --resume: %s's %d epochs are %lld steps of batch %d; resume with "
                           "its batch", o->batch, o->resume, ts.epoch, (long long)ts.step, saved_batch);
  if ((o->adj.dynamic_capacity || o->adj.cache_assignments) && !cli_quiet_rank())
    fprintf(stderr, "moe train: resuming with %s: the trigger's state (smoothed counts, last epoch's "
                    "assignments) starts afresh, so this run is not bit-identical to one without a break\n",
            o->adj.dynamic_capacity ? "--capacity dynamic" : "--cache-assignments");
  if (!o->checkpoint) { /* a resumed run goes on saving where it came from, not nowhere */
    o->checkpoint = o->resume;
    if (!cli_quiet_rank()) fprintf(stderr, "moe train: --resume without --checkpoint: saving to %s\n", o->resume);
  }
  if (m->cfg.in_dim != train->rows * train->cols)
    return cli_usage_error(CMD, "the model takes %d features, the data has %d", m->cfg.in_dim, train->rows * train->cols);
  o->seed = ts.seed;
  *step = ts.step;
  moe_model_set_threads(m, o->threads);
  for (int b = 0; b < m->cfg.blocks; b++) { /* runtime choices, like the threads: not in the checkpoint */
    if (moe_layer_set_pipeline(&m->layers[b], o->model.moe.pipeline, o->model.moe.memory_reuse) != MOE_OK)
      return cli_fail(CMD);
    m->layers[b].cfg.a2a_auto = o->model.moe.a2a_auto; /* read at each forward */
  }
  return 0;
}

int cmd_train(int argc, char **argv) {
  int lm = cli_task_is_lm(CMD, argc, argv);
  if (lm) return lm < 0 ? 1 : cmd_train_lm(argc, argv);
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  moe_dist *dist = NULL; /* under mpirun: data + expert parallel over the ranks */
  if (moe_dist_init(&dist, &argc, &argv) != MOE_OK) return cli_fail(CMD);
  if (moe_dist_size(dist) > 1) cli_hold_errors(dist); /* printed once, by rank 0, where every rank meets */
  else {
    moe_dist_finalize(dist);
    dist = NULL;
  }
  train_opts o;
  defaults(&o);
  int arch = 0, rc = parse(argc, argv, &o, &arch);
  o.model.moe.dist = dist;
  if (o.replicas && dist) /* one spare slot per rank by default; resuming, the checkpoint's (train_flex.c) */
    o.model.moe.replica_slots = o.slots ? o.slots : flex_default_slots(o.resume, o.model.moe.E, moe_dist_size(dist));
  else if (!rc && o.replicas)
    fprintf(stderr, "moe train: --replicas auto: one process holds every expert; replicas need mpirun\n");
  if (!rc && dist && moe_dist_rank(dist) != 0 && !freopen("/dev/null", "w", stdout)) /* rank 0 reports */
    rc = cli_usage_error(CMD, "rank %d: cannot silence stdout", moe_dist_rank(dist));
  moe_dataset train = {0}, test = {0};
  moe_model_t m = {0};
  moe_optim_t opt = {0};
  if (!rc && (load_split(o.data, "train", &train) || load_split(o.data, "t10k", &test)))
    rc = cli_fail(CMD);
  else if (!rc && (test.rows != train.rows || test.cols != train.cols)) /* the model's input is sized from training's */
    rc = cli_usage_error(CMD, "%s/t10k-images-idx3-ubyte has %dx%d images, %s/train-images-idx3-ubyte %dx%d: the test "
                         "set's images must have training's size", o.data, test.rows, test.cols, o.data, train.rows,
                         train.cols);
  else if (!rc && o.val) { /* the test set makes way for the validation split */
    moe_dataset_free(&test);
    if (moe_dataset_hold_out(&train, o.val, &test) != MOE_OK)
      rc = cli_usage_error(CMD, "--val %d: want fewer than the %d training images (or out of memory)", o.val, train.n);
  }
  rc = cli_settle(dist, CMD, rc);
  if (!rc && agree(dist, &o, &train, &test) != MOE_OK) rc = cli_fail(CMD); /* every rank knows: none is left waiting */
  rc = cli_settle(dist, CMD, rc);
  if (!rc && dist && moe_dist_set_a2a(dist, o.a2a, o.ranks_per_node) != MOE_OK)
    rc = cli_fail(CMD); /* other ranks may be inside the split: stopped by cli_dist_end */
  int64_t step = 0;
  if (!rc) rc = cli_settle(dist, CMD, setup(argc, argv, &o, arch, &train, &test, &m, &opt, &step));
  if (!rc) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    rc = run(&o, &m, &opt, &train, &test, step);
  }
  moe_optim_free(&opt);
  moe_model_free(&m);
  moe_dataset_free(&train);
  moe_dataset_free(&test);
  return cli_dist_end(dist, CMD, rc); /* a failure not settled stops every rank: some may be in a collective */
}
