/* moe train --task lm: the Mixtral-architecture language model (moe_lm_*) on a text directory's token
 * stream, trained by the library's moe_trainer (its batch order, schedule, evaluations, checkpoints
 * with trainer_state.safetensors, keep-best and resume): this file is the flags, the files and the
 * printing. The MoE layers' options and RECOMPILE adjustments (dynamic capacity, assignment caching)
 * are the classifier's (train_adjust.h), driven from the trainer's callbacks. */
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
#include "train_adjust.h"
#include "train_lm.h"

static const char *CMD = "train";
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

typedef struct {
  const char *data, *tokenizer, *resume;
  int json, log_steps, dense, vocab, epochs, threads, steps_given;
  float aux_weight; /* --aux-weight, over the family's default (-1: not given) */
  moe_trainer_config tc; /* the schedule, the data's windows, the seed, --checkpoint and --keep-best */
  train_adjust *adj;     /* tc.adjust */
  moe_lm_config model;
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
    "       [--dense] [--family mixtral|qwen2_moe|qwen3_moe|olmoe|gpt_oss|deepseek_v2|deepseek_v3] [--aux-weight W]\n"
    "       [--bias-rate G]\n"
    "       [--lr LR] [--weight-decay W]\n"
    "       [--warmup S] [--steps S | --epochs N]\n"
    "       [--time-budget SECONDS] [--stop-after S] [--eval-every S] [--eval-windows N] [--seed S] [--threads N]\n"
    "       [--capacity X|dynamic [--delta-launch N] [--headroom H]] [--dispatch dynamic|static] [--dtype f32|bf16]\n"
    "       [--cache-assignments [--cache-on 0.96] [--cache-off 0.90] [--cache-min-epoch 10]]\n"
    "       [--checkpoint DIR] [--keep-best DIR] [--resume DIR] [--on-nan stop|skip-step] [--json] [--log-steps]\n"
    "       [--progress|--quiet]\n"
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
    "and k (and does not renormalize the top-k weights, as its released config), gpt_oss q/k/v/o biases,\n"
    "attention sinks, the router's and experts' biases and the clamped SwiGLU (no balance loss unless\n"
    "--aux-weight W: then transformers' GptOss one, over the router's top-k scores; under mpirun no\n"
    "--parallel-r); deepseek_v2 and deepseek_v3 the latent attention (D/NH-wide keys and values beside a rotary\n"
    "part half as wide, a kv latent of D/4, V3's q latent D/2), a dense first layer, shared experts, and\n"
    "V2's softmax or V3's grouped sigmoid routing (moe_lm_config_set_family); no balance loss. --bias-rate G\n"
    "(deepseek_v3): DeepSeek-V3's aux-loss-free balancing, after each step every MoE layer's selection bias\n"
    "(e_score_correction_bias) moves down by G for an expert given more than the mean of the step's\n"
    "assignments (over all ranks) and up by G for one given fewer; default 0, the bias left as it is\n"
    "(DeepSeek-V3 trained with 0.001; config.json carries no rate). Kept in the trainer state.\n"
    "Every --eval-every steps\n"
    "(default 100) and at the end: the validation loss and perplexity over --eval-windows (default 64)\n"
    "fixed windows of DIR/valid.txt, and a checkpoint in DIR (a Hugging Face directory of the family with\n"
    "tokenizer.json and trainer_state.safetensors). --keep-best DIR: the model and tokenizer of the lowest\n"
    "validation loss so far, rewritten when an evaluation improves on it (early stopping: moe eval and\n"
    "moe generate read it; a resume continues from --checkpoint). --resume DIR continues from one (its model, its\n"
    "options: only --stop-after, --threads, --checkpoint, --data, the output flags and the mpirun ones below\n"
    "may be given).\n"
    "A step whose loss, gradients or updated weights go NaN or Inf stops training (--on-nan stop, the\n"
    "default); --on-nan skip-step drops that step's update instead (undoing it when it made a weight or\n"
    "Adam's state non-finite) and goes on, each report counting the steps skipped since the last.\n"
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
  o->aux_weight = -1;
  moe_trainer_config_default(&o->tc); /* context 64, batch 8, 1000 steps, warm-up 5%, lr 1e-3, AdamW 0.1 */
  o->adj = &o->tc.adjust;
  moe_lm_config_default(&o->model);
  o->model.n_layers = 2;
  o->model.n_heads = 4;
  o->model.n_kv_heads = 2;
  o->model.moe.D = 128;
  o->model.moe.H = 256;
}

/* Flags into o; *fixed gets the first flag that --resume takes from the checkpoint instead. */
static int parse(int argc, char **argv, lm_opts *o, const char **fixed) {
  moe_lm_config *c = &o->model;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { o->json = 1; continue; }
    if (cli_flag_is(f, "log_steps")) { o->log_steps = 1; continue; }
    if (cli_flag_is(f, "dense")) { o->dense = 1; *fixed = *fixed ? *fixed : f; continue; }
    if (cli_flag_is(f, "cache_assignments")) { o->adj->cache_assignments = 1; *fixed = *fixed ? *fixed : f; continue; }
    if (cli_progress_flag(f, &o->progress)) continue;
    if (i + 1 >= argc) {
      usage(stderr, 0);
      return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    }
    const char *v = argv[++i];
    int ok = 1, kept = 0;
    moe_status st = MOE_OK;
    if (train_adjust_flag(f, v, &c->moe, o->adj, &ok, &st)) {
      if (st != MOE_OK) return cli_fail(CMD);
    } else if (cli_flag_is(f, "task")) kept = 1; /* "lm": cmd_train dispatched on it */
    else if (cli_flag_is(f, "data")) o->data = v, kept = 1;
    else if (cli_flag_is(f, "checkpoint")) o->tc.checkpoint = v, kept = 1;
    else if (cli_flag_is(f, "keep_best")) o->tc.keep_best = v;
    else if (cli_flag_is(f, "resume")) o->resume = v, kept = 1;
    else if (cli_flag_is(f, "stop_after")) ok = cli_parse_int(v, &o->tc.stop_after) && o->tc.stop_after > 0, kept = 1;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0, kept = 1;
    else if (cli_flag_is(f, "on_nan")) /* not in the trainer state: a resumed run takes it again */
      ok = (o->tc.on_nan = !strcmp(v, "skip-step")) || !strcmp(v, "stop"), kept = 1;
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
    else if (cli_flag_is(f, "context")) ok = cli_parse_int(v, &o->tc.context) && o->tc.context > 0 && o->tc.context <= 65536;
    else if (cli_flag_is(f, "batch")) ok = cli_parse_int(v, &o->tc.batch) && o->tc.batch > 0 && o->tc.batch <= 65536;
    else if (cli_flag_is(f, "layers")) ok = cli_parse_int(v, &c->n_layers) && c->n_layers > 0;
    else if (cli_flag_is(f, "model")) ok = cli_parse_int(v, &c->moe.D) && c->moe.D > 0;
    else if (cli_flag_is(f, "heads")) ok = cli_parse_int(v, &c->n_heads) && c->n_heads > 0;
    else if (cli_flag_is(f, "kv_heads")) ok = cli_parse_int(v, &c->n_kv_heads) && c->n_kv_heads > 0;
    else if (cli_flag_is(f, "experts")) ok = cli_parse_int(v, &c->moe.E) && c->moe.E > 0;
    else if (cli_flag_is(f, "top_k")) ok = cli_parse_int(v, &c->moe.top_k) && c->moe.top_k > 0;
    else if (cli_flag_is(f, "hidden")) ok = cli_parse_int(v, &c->moe.H) && c->moe.H > 0;
    else if (cli_flag_is(f, "aux_weight")) ok = cli_parse_float(v, &o->aux_weight) && o->aux_weight >= 0;
    else if (cli_flag_is(f, "bias_rate")) ok = cli_parse_float(v, &o->tc.bias_rate) && o->tc.bias_rate >= 0;
    else if (cli_flag_is(f, "lr")) ok = cli_parse_float(v, &o->tc.lr) && o->tc.lr > 0;
    else if (cli_flag_is(f, "weight_decay"))
      ok = cli_parse_float(v, &o->tc.optim.weight_decay) && o->tc.optim.weight_decay >= 0;
    else if (cli_flag_is(f, "warmup")) ok = cli_parse_int(v, &o->tc.warmup) && o->tc.warmup >= 0;
    else if (cli_flag_is(f, "steps"))
      ok = cli_parse_int(v, &o->tc.steps) && o->tc.steps > 0, o->epochs = 0, o->steps_given = 1;
    else if (cli_flag_is(f, "time_budget")) ok = cli_parse_float(v, &o->tc.time_budget) && o->tc.time_budget > 0;
    else if (cli_flag_is(f, "epochs")) ok = cli_parse_int(v, &o->epochs) && o->epochs > 0;
    else if (cli_flag_is(f, "eval_every")) ok = cli_parse_int(v, &o->tc.eval_every) && o->tc.eval_every > 0;
    else if (cli_flag_is(f, "eval_windows")) ok = cli_parse_int(v, &o->tc.eval_windows) && o->tc.eval_windows > 0;
    else if (cli_flag_is(f, "seed")) {
      char *end;
      errno = 0;
      o->tc.seed = strtoull(v, &end, 10);
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

/* ---- set-up: the tokenizer and the model, new or from --resume ---- */

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

/* The model, new or --resume's (with its options and the layers' from the trainer state). */
static int setup(lm_opts *o, const moe_tokenizer *t, moe_lm_t *m) {
  moe_lm_config *c = &o->model;
  if (o->resume) {
    moe_layer_config run = c->moe; /* the run's choices: dist, --parallel-r, --a2a */
    if (moe_lm_read_config(o->resume, c) != MOE_OK) return cli_fail(CMD);
    if (moe_trainer_state_read(o->resume, &o->tc, &c->moe, NULL) != MOE_OK) /* the layers' options first */
      return cli_fail(CMD);
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
    c->max_seq = o->tc.context;
    moe_lm_config_set_family(c, c->family); /* what the family's modeling code fixes */
    if (o->aux_weight >= 0) c->aux_coef = o->aux_weight;
    c->vocab = moe_tokenizer_vocab_size(t); /* fewer than --vocab when the text runs out of pairs */
    c->moe.threads = o->threads;
    if (moe_lm_init(m, c) != MOE_OK) return cli_fail(CMD);
    moe_lm_init_params(m, o->tc.seed);
  }
  if (m->cfg.vocab != moe_tokenizer_vocab_size(t))
    return cli_usage_error(CMD, "the model has %d token ids, its tokenizer %d", m->cfg.vocab,
                           moe_tokenizer_vocab_size(t));
  if (o->tc.context > m->cfg.max_seq)
    return cli_usage_error(CMD, "context %d exceeds the model's max_position_embeddings %d", o->tc.context,
                           m->cfg.max_seq);
  return 0;
}

/* ---- the run: the trainer's callbacks print and drive the adjustments ---- */

typedef struct {
  const int32_t *train, *valid;
  size_t ntrain, nvalid;
} lm_streams;

/* What the steps since the last report did and took. */
typedef struct {
  double ce, secs, flops, dropped, assigned, attention, experts, router;
  int steps;
} lm_acc;

typedef struct {
  lm_opts *o;
  moe_lm_t *m;
  lm_acc acc;
  int per_epoch; /* steps an epoch of the training windows */
  double valid;  /* the last evaluation's loss */
  int64_t skipped, skipped_all; /* --on-nan skip-step: steps skipped since the last report, and in all */
  int rc;        /* a callback's failure, printed */
} lm_run;

static void accumulate(lm_acc *a, const moe_train_step *s) {
  const moe_train_batch_stats *b = &s->batch;
  a->ce += b->ce;
  a->secs += s->seconds;
  a->flops += b->expert_flops;
  a->dropped += b->dropped;
  a->assigned += b->assigned;
  a->attention += b->attention_s;
  a->experts += b->experts_s;
  a->router += b->router_s;
  a->steps++;
}

static void report(const lm_opts *o, const moe_train_step *s, const lm_acc *a) {
  double secs = a->secs > 0 ? a->secs : 1e-9, tok_s = (double)o->tc.batch * o->tc.context * a->steps / secs;
  double att = a->attention / secs, exp_ = a->experts / secs, rt = a->router / secs;
  double rest = 1 - att - exp_ - rt, gf = a->experts > 0 ? a->flops / a->experts / 1e9 : 0;
  double loss = a->steps ? a->ce / a->steps : 0, drop = a->assigned > 0 ? a->dropped / a->assigned : 0, valid = s->valid_loss;
  if (o->json)
    printf("{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"valid_loss\": %.6f, \"valid_perplexity\": %.4f, "
           "\"tokens_per_s\": %.1f, \"train_seconds\": %.3f, \"attention_share\": %.4f, \"experts_share\": %.4f, "
           "\"router_share\": %.4f, \"rest_share\": %.4f, \"experts_gflops\": %.2f, \"dropped_fraction\": %.6f}\n",
           (long long)s->step, loss, (double)s->lr, valid, exp(valid), tok_s, s->train_seconds, att, exp_, rt, rest,
           gf, drop);
  else
    printf("step %lld: loss %.4f lr %.3g valid_loss %.4f valid_perplexity %.2f %.0f tokens/s %.1f s; time: "
           "attention %.0f%% experts %.0f%% router %.0f%% rest %.0f%%; experts %.1f GFLOP/s; dropped %.4f\n",
           (long long)s->step, loss, (double)s->lr, valid, exp(valid), tok_s, s->train_seconds, 100 * att,
           100 * exp_, 100 * rt, 100 * rest, gf, drop);
  fflush(stdout);
}

/* The adjustments need every layer to be MoE; a resumed run's start afresh. */
static int adjust_check(const lm_opts *o, const moe_lm_t *m) {
  int dense = 0; /* Qwen's dense layers (mlp_only_layers, decoder_sparse_step) have no MoE layer to adjust */
  for (int i = 0; i < m->cfg.n_layers; i++) dense |= moe_lm_layer_dense(&m->cfg, i);
  if (dense && (o->adj->dynamic_capacity || o->adj->cache_assignments || o->n_parallel_r > 1))
    return cli_usage_error(CMD, "--capacity dynamic, --cache-assignments and several --parallel-r need every layer "
                                "to be MoE; %s has dense layers", o->resume ? o->resume : "the model");
  return 0;
}

/* A callback's failure, printed: the trainer returns this status, and the run its exit status. */
static moe_status failed(lm_run *r, int rc) {
  r->rc = rc;
  return MOE_ERR_STATE;
}

/* Before step's forward: --parallel-r's r of the step, and the adjustments due. */
static moe_status on_batch(void *ctx, int64_t step, const int32_t *ids, int n) {
  lm_run *r = ctx;
  moe_lm_t *m = r->m;
  (void)ids, (void)n;
  for (int i = 0; m->cfg.moe.dist && r->o->n_parallel_r > 1 && i < m->cfg.n_layers; i++) /* switching moves no weights */
    if (moe_layer_set_parallel_r(&m->layers[i], r->o->parallel_r[step % r->o->n_parallel_r]) != MOE_OK)
      return failed(r, cli_fail(CMD));
  return MOE_OK;
}

/* After the update: at an epoch's end the caching switch's line, the step's line and the progress. */
static moe_status on_step(void *ctx, const moe_train_step *s) {
  lm_run *r = ctx;
  r->skipped += s->skipped;
  if (s->skipped && !r->skipped_all++) {
    cli_progress_break(&r->o->progress);
    fprintf(stderr, "moe train: step %lld: update skipped: %s (further skips are counted)\n", (long long)s->step,
            moe_last_error());
  }
  if (!s->skipped) accumulate(&r->acc, s); /* a skipped step's loss is not finite */
  long long epoch = s->step / r->per_epoch;
  if (s->epoch_end && r->o->json)
    printf("{\"epoch\": %lld, \"frac_same\": %.4f, \"caching\": %d, \"caching_from_step\": %lld}\n", epoch,
           s->frac_same, s->caching, (long long)s->caching_from);
  else if (s->epoch_end)
    printf("  epoch %lld: samples not reassigned since the last epoch: %.4f; caching %s (on from step %lld)\n", epoch,
           s->frac_same, s->caching ? "on" : "off", (long long)s->caching_from);
  if (r->o->log_steps && !s->skipped) printf("{\"step\": %lld, \"loss\": %.9g}\n", (long long)s->step, s->batch.ce);
  char extra[64];
  snprintf(extra, sizeof extra, "loss %.4f", r->acc.steps ? r->acc.ce / r->acc.steps : 0);
  cli_progress_update(&r->o->progress, s->step, NULL, extra);
  return MOE_OK;
}

/* After an evaluation (the checkpoint follows): the report of the steps since the last. */
static moe_status on_eval(void *ctx, const moe_train_step *s) {
  lm_run *r = ctx;
  cli_progress_break(&r->o->progress);
  report(r->o, s, &r->acc);
  if (r->o->tc.on_nan == MOE_ON_NAN_SKIP && r->o->json)
    printf("{\"step\": %lld, \"skipped_steps\": %lld}\n", (long long)s->step, (long long)r->skipped);
  else if (r->o->tc.on_nan == MOE_ON_NAN_SKIP)
    printf("  steps skipped (non-finite, --on-nan skip-step): %lld\n", (long long)r->skipped);
  r->skipped = 0;
  r->valid = s->valid_loss;
  r->acc = (lm_acc){0};
  return MOE_OK;
}

/* The steps of this run over the trainer (which owns the model interface from its start). */
static int run(lm_opts *o, moe_lm_t *m, const moe_tokenizer *t, const lm_streams *d) {
  const moe_dist *dist = m->cfg.moe.dist;
  lm_run r = {.o = o, .m = m, .valid = NAN};
  moe_trainer_config tc = o->tc;
  tc.on_batch = on_batch;
  tc.on_step = on_step;
  tc.on_eval = on_eval;
  tc.ctx = &r;
  moe_train_model model;
  moe_trainer *tr = NULL;
  if (moe_train_lm(&model, m, t, d->train, d->ntrain, d->valid, d->nvalid, &tc) != MOE_OK) return cli_fail(CMD);
  r.per_epoch = model.steps_per_epoch;
  int rc = adjust_check(o, m);
  if (rc) model.free(model.self);
  else if (moe_trainer_new(&tr, &tc, &model) != MOE_OK || (o->resume && moe_trainer_resume(tr, o->resume) != MOE_OK))
    rc = cli_fail(CMD);
  if (!rc && o->resume && (o->adj->dynamic_capacity || o->adj->cache_assignments))
    fprintf(stderr, "moe train: resuming with %s: its state starts afresh\n",
            o->adj->dynamic_capacity ? "--capacity dynamic" : "--cache-assignments");
  moe_trainer_info info = {0};
  if (tr) moe_trainer_get_info(tr, &info);
  cli_progress_start(&o->progress, 1, "steps", info.last);
  while (!rc && !moe_trainer_done(tr) && !interrupted) {
    moe_train_step s;
    moe_trainer_get_info(tr, &info);
    moe_status st = moe_trainer_step(tr, &s);
    const char *e = moe_last_error(), *at = strncmp(e, "step ", 5) ? "step " : ""; /* the model's: no step */
    char step[32] = "";
    if (*at) snprintf(step, sizeof step, "%lld: ", (long long)info.step + 1);
    if (st == MOE_OK || r.rc) rc = r.rc;
    else if (s.evaluated && isnan(s.valid_loss)) /* a non-finite validation loss: the model is spent */
      rc = cli_usage_error(CMD, "%s%sthe validation loss: %s", at, step, e);
    else if (st == MOE_ERR_VALUE)
      rc = cli_usage_error(CMD, "%s%s%s; lower --lr, or --on-nan skip-step drops such steps", at, step, e);
    else rc = cli_fail(CMD);
    if (s.evaluated) rc = cli_settle(dist, CMD, rc); /* the checkpoint's and keep-best's writes (rank 0's) */
  }
  cli_progress_break(&o->progress);
  if (tr && !rc) train_capacity_report(tr, o->json ? stderr : stdout);
  if (tr) moe_trainer_get_info(tr, &info);
  if (!rc && interrupted) {
    fprintf(stderr, "\nmoe train: interrupted at step %lld; %s\n", (long long)info.step,
            o->tc.checkpoint ? "the last complete checkpoint is intact" : "no checkpoint was requested");
    rc = 130;
  }
  if (!rc && isnan(r.valid) && moe_trainer_evaluate(tr, &r.valid) != MOE_OK) rc = cli_fail(CMD);
  moe_trainer_free(tr);
  if (rc) return rc;
  if (o->json) printf("{\"valid_loss\": %.6f, \"valid_perplexity\": %.4f}\n", r.valid, exp(r.valid));
  else printf("valid_loss=%.6f valid_perplexity=%.4f\n", r.valid, exp(r.valid));
  return 0;
}

/* Under mpirun: what expert parallelism does not run yet, and every rank's options and data against
 * rank 0's (moe_dist_agree), before the first collective of the model. */
static int ep_check(const moe_dist *d, const lm_opts *o, const lm_streams *s) {
  if (o->adj->dynamic_capacity || o->adj->cache_assignments)
    return cli_usage_error(CMD, "under mpirun --task lm takes no --capacity dynamic or --cache-assignments yet");
  if (o->tc.batch < moe_dist_size(d))
    return cli_usage_error(CMD, "--batch %d is fewer than the %d ranks: each takes a slice of it", o->tc.batch,
                           moe_dist_size(d));
  const moe_lm_config *c = &o->model;
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->tc.seed);
  const moe_dist_setting v[] = {
      {"--experts", c->moe.E, NULL}, {"--top-k", c->moe.top_k, NULL}, {"--hidden", c->moe.H, NULL},
      {"--model", c->moe.D, NULL}, {"--layers", c->n_layers, NULL}, {"--heads", c->n_heads, NULL},
      {"--kv-heads", c->n_kv_heads, NULL}, {"--dense", o->dense, NULL}, {"--capacity", c->moe.capacity_setting, NULL},
      {"--dispatch", c->moe.dispatch, NULL}, {"--dtype", c->moe.dtype, NULL}, {"--aux-weight", o->aux_weight, NULL},
      {"--bias-rate", o->tc.bias_rate, NULL},
      {"--context", o->tc.context, NULL}, {"--batch", o->tc.batch, NULL}, {"--steps", o->tc.steps, NULL},
      {"--stop-after", o->tc.stop_after, NULL}, {"--time-budget", o->tc.time_budget, NULL}, {"--lr", o->tc.lr, NULL},
      {"--warmup", o->tc.warmup, NULL}, {"--weight-decay", o->tc.optim.weight_decay, NULL},
      {"--eval-every", o->tc.eval_every, NULL}, {"--eval-windows", o->tc.eval_windows, NULL},
      {"--seed", cli_hash(&o->tc.seed, sizeof o->tc.seed), seed},
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
  lm_streams d = {0};
  if (!rc) rc = get_tokenizer(&o, &t);
  if (!rc) rc = lm_stream_load(CMD, t, o.data, "train", o.tc.context, (int32_t **)&d.train, &d.ntrain);
  if (!rc) rc = lm_stream_load(CMD, t, o.data, "valid", o.tc.context, (int32_t **)&d.valid, &d.nvalid);
  if (dist && !(rc = cli_settle(dist, CMD, rc))) rc = cli_settle(dist, CMD, ep_check(dist, &o, &d));
  if (!rc && dist && moe_dist_set_a2a(dist, o.a2a, o.ranks_per_node) != MOE_OK)
    rc = cli_fail(CMD); /* other ranks may be inside the split: stopped by cli_dist_end */
  if (!rc && !o.resume && o.tc.time_budget && o.tc.warmup >= 0)
    rc = cli_usage_error(CMD, "--warmup counts steps; with --time-budget the warm-up is the budget's first 5%%");
  if (!rc && !o.resume && o.tc.time_budget && !o.steps_given && !o.epochs) o.tc.steps = INT32_MAX; /* time decides */
  if (!rc) rc = cli_settle(dist, CMD, setup(&o, t, &m));
  if (!rc && (d.ntrain < (size_t)o.tc.context + 1 || d.nvalid < (size_t)o.tc.context + 1)) /* --resume's context */
    rc = cli_usage_error(CMD, "%s: %zu training and %zu validation tokens, fewer than one window of context %d + 1",
                         o.data, d.ntrain, d.nvalid, o.tc.context);
  if (!rc && o.tc.keep_best && o.tc.checkpoint && !strcmp(o.tc.keep_best, o.tc.checkpoint))
    rc = cli_usage_error(CMD, "--keep-best %s is the --checkpoint directory: the best model would overwrite the "
                         "latest one its trainer state belongs to", o.tc.keep_best);
  if (!rc && o.resume && !o.tc.checkpoint) { /* a resumed run goes on saving where it came from */
    o.tc.checkpoint = o.resume;
    if (!cli_quiet_rank()) fprintf(stderr, "moe train: --resume without --checkpoint: saving to %s\n", o.resume);
  }
  if (!rc && o.epochs) { /* N passes' worth of windows, a schedule fixed from here on */
    size_t per = (size_t)o.tc.batch * o.tc.context;
    o.tc.steps = (int)((d.ntrain * (size_t)o.epochs + per - 1) / per);
  }
  if (o.tc.warmup < 0) o.tc.warmup = o.tc.steps / 20;
  if (!rc) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    rc = run(&o, &m, t, &d);
  }
  free((void *)d.train);
  free((void *)d.valid);
  if (m.st) moe_lm_free(&m);
  moe_tokenizer_free(t);
  return cli_dist_end(dist, CMD, rc); /* a failure not settled stops every rank: some may be in a collective */
}
