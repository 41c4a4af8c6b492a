/* moe train --task lm: the Mixtral-architecture language model (moe_lm_*) on a text directory's token
 * stream. Each step takes B windows of context + 1 tokens in an order that is a function of seed and
 * step (lm_order: so a resumed run sees the batches the uninterrupted one would have), AdamW with
 * warm-up and cosine decay over the steps or, with --time-budget, over the training seconds; every
 * --eval-every steps the validation loss over a fixed set of windows, tokens/s and where the steps' time
 * went, and a checkpoint: a Hugging Face Mixtral directory (config.json, model.safetensors), its
 * tokenizer.json, and trainer_state.safetensors (Adam's moments, the step, the training seconds and
 * the training options). The MoE layers' options and RECOMPILE adjustments (dynamic capacity,
 * assignment caching) are the classifier's (train_adjust.h). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "lm_data.h"
#include "progress.h"
#include "rank_errors.h"
#include "text_io.h"
#include "train_cache.h"
#include "train_capacity.h"
#include "train_lm.h"

static const char *CMD = "train";
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

typedef struct {
  const char *data, *tokenizer, *checkpoint, *resume, *keep_best;
  int json, log_steps, dense, vocab, context, batch, steps, epochs, stop_after, warmup, eval_every, eval_windows;
  int threads, steps_given;
  float lr;
  float time_budget; /* seconds of training steps (0: --steps decides) */
  uint64_t seed;
  train_adjust adj;
  moe_lm_config model;
  moe_optim_config optim;
  cli_progress progress;
  int parallel_r[8], n_parallel_r; /* --parallel-r: Tutel's r, or several taken in turn step by step */
  moe_a2a a2a;                     /* --a2a linear|2dh (auto: model.moe.a2a_auto, on 2DH's grid) */
  int ranks_per_node;              /* --ranks-per-node: 2DH's nodes */
} lm_opts;

/* The synopsis, and with help the rest (after a bad flag only the synopsis, so the error stays in view). */
static void usage(FILE *f, int help) {
  fprintf(f,
    "usage: moe train --task lm [--data DIR] [--tokenizer F] [--vocab N] [--context T] [--batch B]\n"
    "       [--layers N] [--model D] [--heads NH] [--kv-heads NKV] [--experts E] [--top-k K] [--hidden H]\n"
    "       [--dense] [--family mixtral|qwen2_moe|qwen3_moe|olmoe] [--aux-weight W] [--lr LR] [--weight-decay W]\n"
    "       [--warmup S] [--steps S | --epochs N]\n"
    "       [--time-budget SECONDS] [--stop-after S] [--eval-every S] [--eval-windows N] [--seed S] [--threads N]\n"
    "       [--capacity X|dynamic [--delta-launch N] [--headroom H]] [--dispatch dynamic|static] [--dtype f32|bf16]\n"
    "       [--cache-assignments [--cache-on 0.96] [--cache-off 0.90] [--cache-min-epoch 10]]\n"
    "       [--checkpoint DIR] [--keep-best DIR] [--resume DIR] [--json] [--log-steps] [--progress|--quiet]\n"
    "       [--parallel-r N|auto|N1,N2,...] [--a2a linear|2dh|auto [--ranks-per-node G]]   (under mpirun)\n");
  if (!help) return;
  fprintf(f,
    "Trains a Mixtral-architecture decoder on DIR/train.txt (default data/brown: scripts/get-brown.sh),\n"
    "documents joined with <|endoftext|>. The tokenizer is --tokenizer's, or one of --vocab ids (default\n"
    "4096) learned from the training text. Defaults: context 64, batch 8, 2 layers, D 128, 4 heads,\n"
    "2 kv heads, 8 experts top-2 of H 256, lr 1e-3 (AdamW, weight decay 0.1, warm-up 5%% of the steps,\n"
    "cosine decay), 1000 steps. --epochs N: N passes' worth of tokens. --dense: the dense model of the\n"
    "same active size, one expert of H x K (the MoE's top-k experts' width). --family: the Hugging Face\n"
    "family of the model and its checkpoint (default mixtral): qwen2_moe adds q/k/v biases and a shared\n"
    "expert of width H with its sigmoid gate, qwen3_moe RMSNorms each head of q and k, olmoe the whole q\n"
    "and k (and does not renormalize the top-k weights, as its released config). Every --eval-every steps\n"
    "(default 100) and at the end: the validation loss and perplexity over --eval-windows (default 64)\n"
    "fixed windows of DIR/valid.txt, and a checkpoint in DIR (a Hugging Face directory of the family with\n"
    "tokenizer.json and trainer_state.safetensors). --keep-best DIR: the model and tokenizer of the lowest\n"
    "validation loss so far, rewritten when an evaluation improves on it (early stopping: moe eval and\n"
    "moe generate read it; a resume continues from --checkpoint). --resume DIR continues from one (its model, its\n"
    "options: only --stop-after, --threads, --checkpoint, --data, the output flags and the mpirun ones below\n"
    "may be given).\n"
    "--stop-after S ends this run after step S of the planned --steps. --time-budget SECONDS: train\n"
    "until the training steps have taken that long (evaluations and checkpoints not counted; --steps, if\n"
    "given, still stops it), the schedule (warm-up 5%%, cosine decay) running on training seconds.\n"
    "The MoE layers' options are moe train's: --capacity, --dispatch, --dtype bf16, --capacity dynamic\n"
    "(per-expert capacities, static dispatch), --cache-assignments (each window's tokens are the samples;\n"
    "an epoch is a pass over the windows). Each report gives tokens/s and the shares of the steps' time\n"
    "in attention, the MoE layers, the router (the layers' gates and the balance loss) and the rest, and\n"
    "the MoE layers' expert GFLOP/s. The last line is valid_loss=... valid_perplexity=... (a JSON line\n"
    "with --json, whose stdout is JSON lines only).\n"
    "Under mpirun the MoE layers run expert-parallel (each rank E/W experts), the rest data-parallel.\n"
    "--parallel-r N|auto: every expert sharded over the ranks instead (Tutel's r: 0 gathers the weights,\n"
    "1 and up exchange the tokens; auto: chosen per capacity; a list takes its values in turn, one per\n"
    "step); checkpoints keep the one-process format. --a2a: the exchanges' all-to-all (auto: the layers'\n"
    "choice per capacity; --ranks-per-node G splits one machine into nodes of G ranks for 2DH).\n");
}

static void defaults(lm_opts *o) {
  memset(o, 0, sizeof *o);
  o->data = "data/brown";
  o->vocab = 4096;
  o->context = 64;
  o->batch = 8;
  o->steps = 1000;
  o->warmup = -1; /* 5% of the steps */
  o->eval_every = 100;
  o->eval_windows = 64;
  o->lr = 1e-3f;
  o->seed = 1;
  moe_lm_config_default(&o->model);
  o->model.n_layers = 2;
  o->model.n_heads = 4;
  o->model.n_kv_heads = 2;
  o->model.moe.D = 128;
  o->model.moe.H = 256;
  moe_optim_config_default(&o->optim);
  o->optim.weight_decay = 0.1f;
  train_adjust_defaults(&o->adj);
}

/* Flags into o; *fixed gets the first flag that --resume takes from the checkpoint instead. */
static int parse(int argc, char **argv, lm_opts *o, const char **fixed) {
  moe_lm_config *c = &o->model;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { o->json = 1; continue; }
    if (cli_flag_is(f, "log_steps")) { o->log_steps = 1; continue; }
    if (cli_flag_is(f, "dense")) { o->dense = 1; *fixed = *fixed ? *fixed : f; continue; }
    if (cli_flag_is(f, "cache_assignments")) { o->adj.cache_assignments = 1; *fixed = *fixed ? *fixed : f; continue; }
    if (cli_progress_flag(f, &o->progress)) continue;
    if (i + 1 >= argc) {
      usage(stderr, 0);
      return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    }
    const char *v = argv[++i];
    int ok = 1, kept = 0;
    moe_status st = MOE_OK;
    if (train_adjust_flag(f, v, &c->moe, &o->adj, &ok, &st)) {
      if (st != MOE_OK) return cli_fail(CMD);
    } else if (cli_flag_is(f, "task")) kept = 1; /* "lm": cmd_train dispatched on it */
    else if (cli_flag_is(f, "data")) o->data = v, kept = 1;
    else if (cli_flag_is(f, "checkpoint")) o->checkpoint = v, kept = 1;
    else if (cli_flag_is(f, "keep_best")) o->keep_best = v;
    else if (cli_flag_is(f, "resume")) o->resume = v, kept = 1;
    else if (cli_flag_is(f, "stop_after")) ok = cli_parse_int(v, &o->stop_after) && o->stop_after > 0, kept = 1;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0, kept = 1;
    else if (cli_flag_is(f, "parallel_r")) {
      ok = (o->n_parallel_r = cli_parse_parallel_rs(v, o->parallel_r, 8)) > 0, kept = 1;
      c->moe.parallel_r = ok ? o->parallel_r[0] : c->moe.parallel_r;
    } else if (cli_flag_is(f, "a2a")) ok = cli_parse_a2a(v, &o->a2a, &c->moe.a2a_auto), kept = 1;
    else if (cli_flag_is(f, "ranks_per_node"))
      ok = cli_parse_int(v, &o->ranks_per_node) && o->ranks_per_node >= 0, kept = 1;
    else if (cli_flag_is(f, "tokenizer")) o->tokenizer = v;
    else if (cli_flag_is(f, "family")) {
      ok = 0;
      for (int fam = 0; moe_lm_family_name(fam); fam++)
        if (!strcmp(v, moe_lm_family_name(fam))) c->family = fam, ok = 1;
    }
    else if (cli_flag_is(f, "vocab")) ok = cli_parse_int(v, &o->vocab) && o->vocab >= 257;
    else if (cli_flag_is(f, "context")) ok = cli_parse_int(v, &o->context) && o->context > 0 && o->context <= 65536;
    else if (cli_flag_is(f, "batch")) ok = cli_parse_int(v, &o->batch) && o->batch > 0 && o->batch <= 65536;
    else if (cli_flag_is(f, "layers")) ok = cli_parse_int(v, &c->n_layers) && c->n_layers > 0;
    else if (cli_flag_is(f, "model")) ok = cli_parse_int(v, &c->moe.D) && c->moe.D > 0;
    else if (cli_flag_is(f, "heads")) ok = cli_parse_int(v, &c->n_heads) && c->n_heads > 0;
    else if (cli_flag_is(f, "kv_heads")) ok = cli_parse_int(v, &c->n_kv_heads) && c->n_kv_heads > 0;
    else if (cli_flag_is(f, "experts")) ok = cli_parse_int(v, &c->moe.E) && c->moe.E > 0;
    else if (cli_flag_is(f, "top_k")) ok = cli_parse_int(v, &c->moe.top_k) && c->moe.top_k > 0;
    else if (cli_flag_is(f, "hidden")) ok = cli_parse_int(v, &c->moe.H) && c->moe.H > 0;
    else if (cli_flag_is(f, "aux_weight")) ok = cli_parse_float(v, &c->aux_coef) && c->aux_coef >= 0;
    else if (cli_flag_is(f, "lr")) ok = cli_parse_float(v, &o->lr) && o->lr > 0;
    else if (cli_flag_is(f, "weight_decay"))
      ok = cli_parse_float(v, &o->optim.weight_decay) && o->optim.weight_decay >= 0;
    else if (cli_flag_is(f, "warmup")) ok = cli_parse_int(v, &o->warmup) && o->warmup >= 0;
    else if (cli_flag_is(f, "steps"))
      ok = cli_parse_int(v, &o->steps) && o->steps > 0, o->epochs = 0, o->steps_given = 1;
    else if (cli_flag_is(f, "time_budget")) ok = cli_parse_float(v, &o->time_budget) && o->time_budget > 0;
    else if (cli_flag_is(f, "epochs")) ok = cli_parse_int(v, &o->epochs) && o->epochs > 0;
    else if (cli_flag_is(f, "eval_every")) ok = cli_parse_int(v, &o->eval_every) && o->eval_every > 0;
    else if (cli_flag_is(f, "eval_windows")) ok = cli_parse_int(v, &o->eval_windows) && o->eval_windows > 0;
    else if (cli_flag_is(f, "seed")) {
      char *end;
      errno = 0;
      o->seed = strtoull(v, &end, 10);
      ok = *v && *v != '-' && !*end && !errno;
    } else {
      usage(stderr, 0);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
    if (!kept && !*fixed) *fixed = f;
  }
  return 0;
}

/* ---- trainer state: DIR/trainer_state.safetensors ---- */

static void state_path(char *buf, size_t n, const char *dir) { snprintf(buf, n, "%s/trainer_state.safetensors", dir); }

/* The options a resumed run keeps, "key=value;..." in the file's __metadata__["train"]: the schedule,
 * the MoE layers' options (config.json has no place for them) and the adjustments. */
static void options_string(const lm_opts *o, char *buf, size_t n) {
  const moe_layer_config *l = &o->model.moe;
  const train_adjust *a = &o->adj;
  snprintf(buf, n,
           "context=%d;batch=%d;steps=%d;warmup=%d;lr=%.9g;weight_decay=%.9g;eval_every=%d;eval_windows=%d;"
           "time_budget=%.9g;capacity=%.9g;dispatch=%d;dtype=%d;dynamic_capacity=%d;delta_launch=%d;headroom=%.9g;"
           "cache_assignments=%d;cache_on=%.9g;cache_off=%.9g;cache_min_epoch=%d",
           o->context, o->batch, o->steps, o->warmup, (double)o->lr, (double)o->optim.weight_decay, o->eval_every,
           o->eval_windows, (double)o->time_budget, (double)l->capacity_setting, (int)l->dispatch, (int)l->dtype,
           a->dynamic_capacity, a->delta_launch, (double)a->headroom, a->cache_assignments, (double)a->cache.on,
           (double)a->cache.off, a->cache.min_epoch);
}

/* The options into o (the layer's into o->model.moe); 0 when missing or out of range. Checkpoints
 * from before the layers' options have the first 8 fields. */
static int options_parse(const char *s, lm_opts *o) {
  moe_layer_config *l = &o->model.moe;
  train_adjust *a = &o->adj;
  int dispatch = l->dispatch, dtype = l->dtype;
  int n = s ? sscanf(s,
                     "context=%d;batch=%d;steps=%d;warmup=%d;lr=%f;weight_decay=%f;eval_every=%d;eval_windows=%d;"
                     "time_budget=%f;capacity=%f;dispatch=%d;dtype=%d;dynamic_capacity=%d;delta_launch=%d;"
                     "headroom=%f;cache_assignments=%d;cache_on=%f;cache_off=%f;cache_min_epoch=%d",
                     &o->context, &o->batch, &o->steps, &o->warmup, &o->lr, &o->optim.weight_decay, &o->eval_every,
                     &o->eval_windows, &o->time_budget, &l->capacity_setting, &dispatch, &dtype,
                     &a->dynamic_capacity, &a->delta_launch, &a->headroom, &a->cache_assignments, &a->cache.on,
                     &a->cache.off, &a->cache.min_epoch)
              : 0;
  l->dispatch = dispatch == MOE_DISPATCH_STATIC ? MOE_DISPATCH_STATIC : MOE_DISPATCH_DYNAMIC;
  l->dtype = dtype == MOE_DT_BF16 ? MOE_DT_BF16 : MOE_DT_F32;
  return (n == 8 || n == 19) && o->context > 0 && o->batch > 0 && o->steps > 0 && o->warmup >= 0 && o->lr > 0 &&
         o->eval_every > 0 && o->eval_windows > 0 && o->optim.weight_decay >= 0 && o->time_budget >= 0 &&
         a->delta_launch >= 0 && a->delta_launch < 60 && a->headroom >= 0 && a->headroom <= 10;
}

/* The model (HF directory) and its tokenizer.json in dir, each file atomic: what eval and generate
 * read, the whole of a --keep-best directory. Expert-parallel, a collective (rank 0 writes). */
static moe_status save_model(const char *dir, const moe_lm_t *m, const moe_tokenizer *t) {
  char path[4096];
  moe_status st = moe_lm_save(m, dir);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (st == MOE_OK && moe_dist_rank(m->cfg.moe.dist) == 0) st = moe_tokenizer_save(t, path);
  return st;
}

/* The whole checkpoint: the model (HF directory), the tokenizer, then the trainer state, each file
 * written atomically; the state last, so a state on disk never runs ahead of the weights. Expert-
 * parallel, every rank takes part in each gather (the model's, Adam's moments) and rank 0 writes:
 * its failure is settled by the caller. */
static int save(const lm_opts *o, const moe_lm_t *m, const moe_tokenizer *t, const moe_optim_t *opt,
                double train_s) {
  char path[4096], buf[32], opts[1024];
  int writer = moe_dist_rank(m->cfg.moe.dist) == 0;
  moe_status st = save_model(o->checkpoint, m, t);
  size_t n = moe_lm_whole_numel(m);
  float *mo = malloc(n * 4), *v = malloc(n * 4);
  moe_status ex = mo && v ? moe_lm_gather(m, opt->m, mo) : MOE_ERR_NOMEM; /* collectives: on every rank */
  if (ex == MOE_OK) ex = moe_lm_gather(m, opt->v, v);
  if (st != MOE_OK || (!mo || !v)) /* the model's message, or this one */
    return free(mo), free(v), st != MOE_OK ? cli_fail(CMD) : cli_usage_error(CMD, "out of memory for %zu moments", n);
  st = ex;
  moe_st_writer *w = NULL;
  if (st == MOE_OK && writer) st = moe_st_writer_new(&w);
  int64_t shape[1] = {(int64_t)n};
  options_string(o, opts, sizeof opts);
  if (w && st == MOE_OK) st = moe_st_writer_add_f32(w, "optim.m", MOE_DT_F32, 1, shape, mo);
  if (w && st == MOE_OK) st = moe_st_writer_add_f32(w, "optim.v", MOE_DT_F32, 1, shape, v);
  snprintf(buf, sizeof buf, "%lld", (long long)opt->step);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "step", buf);
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->seed);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "seed", buf);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "train", opts);
  snprintf(buf, sizeof buf, "%.17g", train_s);
  if (w && st == MOE_OK) st = moe_st_writer_meta(w, "train_seconds", buf);
  state_path(path, sizeof path, o->checkpoint);
  if (w && st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  free(mo);
  free(v);
  return st == MOE_OK ? 0 : cli_fail(CMD);
}

/* Adam's moments from the trainer state f, in the one-process order: this rank's part into opt. */
static int moments(const moe_st *f, const moe_lm_t *m, moe_optim_t *opt) {
  size_t n = moe_lm_whole_numel(m);
  float *mo = malloc(n * 4), *v = malloc(n * 4);
  int rc = !mo || !v ? cli_usage_error(CMD, "trainer state: out of memory for %zu moments", n)
           : moe_st_get_f32(f, "optim.m", mo, n) != MOE_OK || moe_st_get_f32(f, "optim.v", v, n) != MOE_OK ||
                   moe_lm_scatter(m, mo, opt->m) != MOE_OK || moe_lm_scatter(m, v, opt->v) != MOE_OK
               ? cli_fail(CMD)
               : 0;
  free(mo);
  free(v);
  return rc;
}

/* From DIR's trainer state: the options, the seed and the training seconds (then, given m and opt,
 * sized already: Adam's state and the step). */
static int load_state(const char *dir, lm_opts *o, const moe_lm_t *m, moe_optim_t *opt, double *train_s) {
  char path[4096];
  state_path(path, sizeof path, dir);
  moe_st *f;
  if (moe_st_open(&f, path) != MOE_OK) return cli_fail(CMD);
  const char *step = moe_st_meta(f, "step"), *seed = moe_st_meta(f, "seed"), *secs = moe_st_meta(f, "train_seconds");
  long long s = -1;
  unsigned long long sd = 0;
  int rc = 0;
  *train_s = 0; /* absent from checkpoints older than --time-budget */
  if (!step || sscanf(step, "%lld", &s) != 1 || s < 0 || !seed || sscanf(seed, "%llu", &sd) != 1 ||
      !options_parse(moe_st_meta(f, "train"), o) || (secs && (sscanf(secs, "%lf", train_s) != 1 || !(*train_s >= 0))))
    rc = cli_usage_error(CMD, "%s: __metadata__ step, seed, train or train_seconds is missing or not valid", path);
  else if (opt && moments(f, m, opt)) rc = 1;
  moe_st_close(f);
  if (opt) opt->step = s;
  o->seed = sd;
  return rc;
}

/* ---- set-up: the tokenizer, the model and the optimizer, new or from --resume ---- */

static int get_tokenizer(const lm_opts *o, moe_tokenizer **t) {
  char path[4096];
  if (o->resume || o->tokenizer) {
    if (o->resume) snprintf(path, sizeof path, "%s/tokenizer.json", o->resume);
    return moe_tokenizer_load(t, o->resume ? path : o->tokenizer) != MOE_OK ? cli_fail(CMD) : 0;
  }
  size_t n;
  char *text = cli_read_text(o->data, "train.txt", &n, path, sizeof path);
  if (!text)
    return cli_usage_error(CMD, "%s: cannot read: %s (scripts/get-brown.sh fetches data/brown)", path, strerror(errno));
  moe_status st = moe_tokenizer_train(t, text, n, o->vocab);
  free(text);
  return st != MOE_OK ? cli_fail(CMD) : 0;
}

/* The model and optimizer, new or --resume's (with *train_s, the training seconds so far). */
static int setup(lm_opts *o, const moe_tokenizer *t, moe_lm_t *m, moe_optim_t *opt, double *train_s) {
  moe_lm_config *c = &o->model;
  *train_s = 0;
  if (o->resume) {
    moe_layer_config run = c->moe; /* the run's choices: dist, --parallel-r, --a2a */
    if (moe_lm_read_config(o->resume, c) != MOE_OK) return cli_fail(CMD);
    if (load_state(o->resume, o, NULL, NULL, train_s)) return 1; /* the layers' options, before the layers */
    c->moe.threads = o->threads;
    c->moe.dist = run.dist; /* each rank reads its own experts (or its shards of each) */
    c->moe.parallel_r = run.parallel_r;
    c->moe.a2a_auto = run.a2a_auto;
    if (moe_lm_load(m, o->resume, c) != MOE_OK) return cli_fail(CMD);
  } else {
    if (o->dense) c->moe.H *= c->moe.top_k, c->moe.E = c->moe.top_k = 1;
    if (c->moe.D % c->n_heads)
      return cli_usage_error(CMD, "--model %d is not a multiple of --heads %d", c->moe.D, c->n_heads);
    c->head_dim = c->moe.D / c->n_heads;
    c->max_seq = o->context;
    c->qkv_bias = c->family == MOE_LM_QWEN2_MOE;
    c->qk_norm = c->family == MOE_LM_QWEN3_MOE ? MOE_QK_NORM_HEAD
                 : c->family == MOE_LM_OLMOE   ? MOE_QK_NORM_FULL
                                               : MOE_QK_NORM_NONE;
    c->moe.shared_H = c->family == MOE_LM_QWEN2_MOE ? c->moe.H : 0;
    c->moe.shared_gate = c->family == MOE_LM_QWEN2_MOE;
    if (c->family == MOE_LM_OLMOE) c->moe.normalize_topk = 0;
    c->vocab = moe_tokenizer_vocab_size(t); /* fewer than --vocab when the text runs out of pairs */
    c->moe.threads = o->threads;
    if (moe_lm_init(m, c) != MOE_OK) return cli_fail(CMD);
    moe_lm_init_params(m, o->seed);
  }
  if (m->cfg.vocab != moe_tokenizer_vocab_size(t))
    return cli_usage_error(CMD, "the model has %d token ids, its tokenizer %d", m->cfg.vocab,
                           moe_tokenizer_vocab_size(t));
  if (moe_optim_init_n(opt, &o->optim, m->numel) != MOE_OK) return cli_fail(CMD);
  if (o->resume && load_state(o->resume, o, m, opt, train_s)) return 1;
  if (o->context > m->cfg.max_seq)
    return cli_usage_error(CMD, "context %d exceeds the model's max_position_embeddings %d", o->context,
                           m->cfg.max_seq);
  return 0;
}

/* ---- the loop ---- */

typedef struct {
  const int32_t *train, *valid;
  size_t ntrain, nvalid;
} lm_streams;

/* What the steps since the last report did and took. */
typedef struct {
  double ce, secs, flops, dropped, assigned;
  moe_lm_times t;
  int steps;
} lm_acc;

/* A step of N tokens (over all W ranks: the dropped count is the layers' over all of them, and this
 * rank's experts take 1/W of the assignments, about) that took secs. */
static void accumulate(lm_acc *a, const moe_lm_t *m, const moe_lm_stats *st, int N, int W, double secs) {
  const moe_layer_config *l = &m->cfg.moe;
  int moe_layers = 0;
  for (int i = 0; i < m->cfg.n_layers; i++) moe_layers += !moe_lm_layer_dense(&m->cfg, i);
  double kept = (double)N * l->top_k * moe_layers - st->dropped;
  moe_lm_times t;
  moe_lm_times_get(m, &t);
  a->ce += st->ce;
  a->secs += secs;
  a->flops += 18.0 * kept * l->D * l->H / W; /* SwiGLU: 3 GEMMs of 2 D H a row forward, 6 backward */
  a->dropped += st->dropped;
  a->assigned += (double)N * l->top_k * moe_layers;
  a->t.attention += t.attention;
  a->t.experts += t.experts;
  a->t.router += t.router;
  a->steps++;
}

static int report(const lm_opts *o, moe_lm_t *m, const lm_streams *d, int64_t step, const lm_acc *a, float lr,
                  double train_s, double *valid) {
  if (lm_eval_loss(CMD, m, d->valid, d->nvalid, o->context, o->batch, o->eval_windows, valid)) return 1;
  double secs = a->secs > 0 ? a->secs : 1e-9, tok_s = (double)o->batch * o->context * a->steps / secs;
  double att = a->t.attention / secs, exp_ = a->t.experts / secs, rt = a->t.router / secs;
  double rest = 1 - att - exp_ - rt, gf = a->t.experts > 0 ? a->flops / a->t.experts / 1e9 : 0;
  double loss = a->ce / a->steps, drop = a->assigned > 0 ? a->dropped / a->assigned : 0;
  if (o->json)
    printf("{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"valid_loss\": %.6f, \"valid_perplexity\": %.4f, "
           "\"tokens_per_s\": %.1f, \"train_seconds\": %.3f, \"attention_share\": %.4f, \"experts_share\": %.4f, "
           "\"router_share\": %.4f, \"rest_share\": %.4f, \"experts_gflops\": %.2f, \"dropped_fraction\": %.6f}\n",
           (long long)step, loss, (double)lr, *valid, exp(*valid), tok_s, train_s, att, exp_, rt, rest, gf, drop);
  else
    printf("step %lld: loss %.4f lr %.3g valid_loss %.4f valid_perplexity %.2f %.0f tokens/s %.1f s; time: "
           "attention %.0f%% experts %.0f%% router %.0f%% rest %.0f%%; experts %.1f GFLOP/s; dropped %.4f\n",
           (long long)step, loss, (double)lr, *valid, exp(*valid), tok_s, train_s, 100 * att, 100 * exp_, 100 * rt,
           100 * rest, gf, drop);
  fflush(stdout);
  return 0;
}

/* The learning rate of a step that begins with train_s seconds of training behind it: over the steps,
 * or with --time-budget over the seconds (in millionths of the budget, warm-up the first 5%). */
static float rate(const lm_opts *o, int64_t step, double train_s) {
  if (!o->time_budget) return moe_lr_schedule(o->lr, step, o->warmup, o->steps);
  return moe_lr_schedule(o->lr, (int64_t)(1e6 * train_s / o->time_budget), 50000, 1000000);
}

/* The RECOMPILE adjustments of the run (either NULL when off), over the model's layers. */
typedef struct {
  dyncap *dc;
  assign_cache *ac;
  double frac_same;
  int caching;
  int64_t caching_from;
} lm_adjust;

static int adjust_start(lm_adjust *j, const lm_opts *o, moe_lm_t *m, const lm_order *ord) {
  train_blocks b = train_blocks_of_lm(m);
  *j = (lm_adjust){NULL, NULL, -1, 0, -1};
  int dense = 0; /* Qwen's dense layers (mlp_only_layers, decoder_sparse_step) have no MoE layer to adjust */
  for (int i = 0; i < m->cfg.n_layers; i++) dense |= moe_lm_layer_dense(&m->cfg, i);
  if (dense && (o->adj.dynamic_capacity || o->adj.cache_assignments || o->n_parallel_r > 1))
    return cli_usage_error(CMD, "--capacity dynamic, --cache-assignments and several --parallel-r need every layer "
                                "to be MoE; %s has dense layers", o->resume ? o->resume : "the model");
  if (o->adj.dynamic_capacity && dyncap_start(&j->dc, &b, o->batch * o->context, o->adj.delta_launch, o->adj.headroom))
    return cli_fail(CMD);
  if (o->adj.cache_assignments && assign_cache_new(&j->ac, &b, ord->nwin * o->context, ord->per_epoch,
                                                    o->adj.delta_launch, &o->adj.cache))
    return cli_usage_error(CMD, "--cache-assignments: out of memory for %d windows", ord->nwin);
  if ((j->dc || j->ac) && o->resume)
    fprintf(stderr, "moe train: resuming with %s: its state starts afresh\n",
            j->dc ? "--capacity dynamic" : "--cache-assignments");
  return 0;
}

static void adjust_end(lm_adjust *j, int rc, int json) {
  if (j->dc && !rc) dyncap_report(j->dc, json ? stderr : stdout);
  dyncap_free(j->dc);
  assign_cache_free(j->ac);
}

/* After step `step` (0-based), the last of an epoch: the caching switch, and a line on it. */
static int adjust_epoch(lm_adjust *j, const lm_opts *o, int64_t step, int per_epoch) {
  if (!j->ac || (step + 1) % per_epoch) return 0;
  if (assign_cache_epoch(j->ac, &j->frac_same, &j->caching, &j->caching_from)) return cli_fail(CMD);
  if (o->json)
    printf("{\"epoch\": %lld, \"frac_same\": %.4f, \"caching\": %d, \"caching_from_step\": %lld}\n",
           (long long)((step + 1) / per_epoch), j->frac_same, j->caching, (long long)j->caching_from);
  else
    printf("  epoch %lld: samples not reassigned since the last epoch: %.4f; caching %s (on from step %lld)\n",
           (long long)((step + 1) / per_epoch), j->frac_same, j->caching ? "on" : "off", (long long)j->caching_from);
  return 0;
}

/* Rank 0's training seconds on every rank (expert-parallel): where the schedule is, when the budget ends. */
static int agreed_seconds(const moe_dist *d, double *train_s) {
  double v = moe_dist_rank(d) == 0 ? *train_s : 0;
  if (moe_dist_size(d) < 2) return 0;
  if (moe_dist_allreduce(d, &v, 1) != MOE_OK) return cli_fail(CMD);
  *train_s = v;
  return 0;
}

static int run(lm_opts *o, moe_lm_t *m, const moe_tokenizer *t, moe_optim_t *opt, const lm_streams *d,
               double train_s) {
  int B = o->batch, T = o->context, N = B * T;
  const moe_dist *dist = m->cfg.moe.dist; /* expert-parallel: rank r takes rows [b0, b1) of every batch */
  int W = moe_dist_size(dist), r = moe_dist_rank(dist), b0 = B * r / W, b1 = B * (r + 1) / W;
  int64_t last = o->stop_after && o->stop_after < o->steps ? o->stop_after : o->steps, step = opt->step;
  int32_t *x = malloc((size_t)N * sizeof *x), *y = malloc((size_t)N * sizeof *y), *ids = malloc((size_t)N * 4);
  lm_order ord = {0};
  lm_adjust adj = {0};
  int rc = x && y && ids && !lm_order_init(&ord, d->train, d->ntrain, T, B, o->seed)
               ? adjust_start(&adj, o, m, &ord)
               : cli_usage_error(CMD, "out of memory for a batch of %d x %d", B, T);
  double valid = NAN, best = INFINITY;
  lm_acc acc = {0};
  float lr = 0;
  cli_progress_start(&o->progress, 1, "steps", last);
  for (; !rc && step < last && !interrupted && !(o->time_budget && train_s >= o->time_budget); step++) {
    double t0 = cli_now();
    lm_order_fill(&ord, step, x, y, ids);
    for (int i = 0; dist && o->n_parallel_r > 1 && i < m->cfg.n_layers && !rc; i++) /* switching moves no weights */
      if (moe_layer_set_parallel_r(&m->layers[i], o->parallel_r[step % o->n_parallel_r]) != MOE_OK) rc = cli_fail(CMD);
    if (rc) break;
    if ((adj.dc && dyncap_begin(adj.dc, step)) || (adj.ac && assign_cache_before(adj.ac, step, ids, N))) {
      rc = cli_fail(CMD);
      break;
    }
    moe_lm_stats st;
    moe_lm_zero_grad(m);
    moe_lm_times_reset(m);
    lr = rate(o, step, train_s);
    if (moe_lm_forward(m, x + (size_t)b0 * T, y + (size_t)b0 * T, b1 - b0, T, &st) != MOE_OK ||
        moe_lm_backward(m) != MOE_OK) {
      rc = cli_fail(CMD);
      break;
    }
    if (!isfinite(st.loss)) {
      rc = cli_usage_error(CMD, "step %lld: training diverged (loss %g); lower --lr", (long long)step + 1, st.loss);
      break;
    }
    moe_optim_step_refs(opt, m->refs, m->nrefs, lr, m->cfg.moe.threads);
    moe_lm_params_changed(m);
    double secs = cli_now() - t0;
    train_s += secs;
    if (o->time_budget && (rc = agreed_seconds(dist, &train_s))) break;
    accumulate(&acc, m, &st, N, W, secs);
    if ((adj.ac && assign_cache_after(adj.ac, step, ids, N)) || (adj.dc && dyncap_push(adj.dc, step, st.ce)) ||
        adjust_epoch(&adj, o, step, ord.per_epoch)) {
      rc = rc ? rc : cli_fail(CMD);
      break;
    }
    if (o->log_steps) printf("{\"step\": %lld, \"loss\": %.9g}\n", (long long)step + 1, st.ce);
    char extra[64];
    snprintf(extra, sizeof extra, "loss %.4f", acc.ce / acc.steps);
    cli_progress_update(&o->progress, step + 1, NULL, extra);
    int out_of_time = o->time_budget && train_s >= o->time_budget;
    if ((step + 1) % o->eval_every && step + 1 != last && !out_of_time) continue;
    cli_progress_break(&o->progress);
    rc = report(o, m, d, step + 1, &acc, lr, train_s, &valid);
    if (!rc && o->checkpoint) rc = cli_settle(dist, CMD, save(o, m, t, opt, train_s));
    if (!rc && o->keep_best && valid < best)
      best = valid, rc = cli_settle(dist, CMD, save_model(o->keep_best, m, t) == MOE_OK ? 0 : cli_fail(CMD));
    acc = (lm_acc){0};
  }
  cli_progress_break(&o->progress);
  adjust_end(&adj, rc, o->json);
  lm_order_free(&ord);
  free(x);
  free(y);
  free(ids);
  if (rc) return rc;
  if (interrupted) {
    fprintf(stderr, "\nmoe train: interrupted at step %lld; %s\n", (long long)step,
            o->checkpoint ? "the last complete checkpoint is intact" : "no checkpoint was requested");
    return 130;
  }
  if (isnan(valid) && lm_eval_loss(CMD, m, d->valid, d->nvalid, T, B, o->eval_windows, &valid)) return 1;
  if (o->json) printf("{\"valid_loss\": %.6f, \"valid_perplexity\": %.4f}\n", valid, exp(valid));
  else printf("valid_loss=%.6f valid_perplexity=%.4f\n", valid, exp(valid));
  return 0;
}

/* Under mpirun: what expert parallelism does not run yet, and every rank's options and data against
 * rank 0's (moe_dist_agree), before the first collective of the model. */
static int ep_check(const moe_dist *d, const lm_opts *o, const lm_streams *s) {
  if (o->adj.dynamic_capacity || o->adj.cache_assignments)
    return cli_usage_error(CMD, "under mpirun --task lm takes no --capacity dynamic or --cache-assignments yet");
  if (o->batch < moe_dist_size(d))
    return cli_usage_error(CMD, "--batch %d is fewer than the %d ranks: each takes a slice of it", o->batch,
                           moe_dist_size(d));
  const moe_lm_config *c = &o->model;
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
  const moe_dist_setting v[] = {
      {"--experts", c->moe.E, NULL}, {"--top-k", c->moe.top_k, NULL}, {"--hidden", c->moe.H, NULL},
      {"--model", c->moe.D, NULL}, {"--layers", c->n_layers, NULL}, {"--heads", c->n_heads, NULL},
      {"--kv-heads", c->n_kv_heads, NULL}, {"--dense", o->dense, NULL}, {"--capacity", c->moe.capacity_setting, NULL},
      {"--dispatch", c->moe.dispatch, NULL}, {"--dtype", c->moe.dtype, NULL}, {"--aux-weight", c->aux_coef, NULL},
      {"--context", o->context, NULL}, {"--batch", o->batch, NULL}, {"--steps", o->steps, NULL},
      {"--stop-after", o->stop_after, NULL}, {"--time-budget", o->time_budget, NULL}, {"--lr", o->lr, NULL},
      {"--warmup", o->warmup, NULL}, {"--weight-decay", o->optim.weight_decay, NULL},
      {"--eval-every", o->eval_every, NULL}, {"--eval-windows", o->eval_windows, NULL},
      {"--seed", cli_hash(&o->seed, sizeof o->seed), seed},
      {"--parallel-r", cli_hash(o->parallel_r, sizeof(int) * (size_t)o->n_parallel_r) + c->moe.parallel_r, NULL},
      {"--a2a", o->a2a + 2 * c->moe.a2a_auto, c->moe.a2a_auto ? "auto" : o->a2a ? "2dh" : "linear"},
      {"--ranks-per-node", o->ranks_per_node, NULL}, /* both before 2DH's split, where a difference hangs */
      {"training tokens", (double)s->ntrain, NULL},
      {"training tokens (hash)", cli_hash(s->train, s->ntrain * sizeof *s->train), NULL},
      {"validation tokens", (double)s->nvalid, NULL},
  };
  return moe_dist_agree(d, v, (int)(sizeof v / sizeof v[0])) != MOE_OK ? cli_fail(CMD) : 0;
}

int cmd_train_lm(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout, 1); return 0; }
  moe_dist *dist; /* under mpirun: experts over the ranks, the rest data-parallel */
  int rc = lm_dist_start(CMD, &dist, &argc, &argv);
  lm_opts o;
  defaults(&o);
  const char *fixed = NULL;
  if (!rc) rc = parse(argc, argv, &o, &fixed);
  o.model.moe.dist = dist;
  if (!rc && o.resume && fixed)
    rc = cli_usage_error(CMD, "--resume takes the model, tokenizer and schedule from %s; drop %s", o.resume, fixed);
  moe_tokenizer *t = NULL;
  moe_lm_t m = {0};
  moe_optim_t opt = {0};
  lm_streams d = {0};
  if (!rc) rc = get_tokenizer(&o, &t);
  if (!rc) rc = lm_stream_load(CMD, t, o.data, "train", o.context, (int32_t **)&d.train, &d.ntrain);
  if (!rc) rc = lm_stream_load(CMD, t, o.data, "valid", o.context, (int32_t **)&d.valid, &d.nvalid);
  if (dist && !(rc = cli_settle(dist, CMD, rc))) rc = cli_settle(dist, CMD, ep_check(dist, &o, &d));
  if (!rc && dist && moe_dist_set_a2a(dist, o.a2a, o.ranks_per_node) != MOE_OK)
    rc = cli_fail(CMD); /* other ranks may be inside the split: stopped by cli_dist_end */
  double train_s = 0;
  if (!rc && !o.resume && o.time_budget && o.warmup >= 0)
    rc = cli_usage_error(CMD, "--warmup counts steps; with --time-budget the warm-up is the budget's first 5%%");
  if (!rc && !o.resume && o.time_budget && !o.steps_given && !o.epochs) o.steps = INT32_MAX; /* time decides */
  if (!rc) rc = cli_settle(dist, CMD, setup(&o, t, &m, &opt, &train_s));
  if (!rc && (d.ntrain < (size_t)o.context + 1 || d.nvalid < (size_t)o.context + 1)) /* --resume's context */
    rc = cli_usage_error(CMD, "%s: %zu training and %zu validation tokens, fewer than one window of context %d + 1",
                         o.data, d.ntrain, d.nvalid, o.context);
  if (!rc && o.keep_best && o.checkpoint && !strcmp(o.keep_best, o.checkpoint))
    rc = cli_usage_error(CMD, "--keep-best %s is the --checkpoint directory: the best model would overwrite the "
                         "latest one its trainer state belongs to", o.keep_best);
  if (!rc && o.resume && !o.checkpoint) { /* a resumed run goes on saving where it came from */
    o.checkpoint = o.resume;
    if (!cli_quiet_rank()) fprintf(stderr, "moe train: --resume without --checkpoint: saving to %s\n", o.resume);
  }
  if (!rc && o.epochs) { /* N passes' worth of windows, a schedule fixed from here on */
    size_t per = (size_t)o.batch * o.context;
    o.steps = (int)((d.ntrain * (size_t)o.epochs + per - 1) / per);
  }
  if (o.warmup < 0) o.warmup = o.steps / 20;
  if (!rc && opt.step > o.steps)
    rc = cli_usage_error(CMD, "%s: already at step %lld of %d", o.resume, (long long)opt.step, o.steps);
  if (!rc) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    rc = run(&o, &m, t, &opt, &d, train_s);
  }
  free((void *)d.train);
  free((void *)d.valid);
  moe_optim_free(&opt);
  if (m.st) moe_lm_free(&m);
  moe_tokenizer_free(t);
  return cli_dist_end(dist, CMD, rc); /* a failure not settled stops every rank: some may be in a collective */
}
