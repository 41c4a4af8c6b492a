/* moe train --task lm: the Mixtral-architecture language model (moe_lm_*) on a text directory's token
 * stream. Each step takes B random windows of context + 1 tokens (their starts a function of seed,
 * step and row, so a resumed run sees the batches the uninterrupted one would have), AdamW with warm-up
 * and cosine decay; every --eval-every steps the validation loss over a fixed set of windows, and a
 * checkpoint: a Hugging Face Mixtral directory (config.json, model.safetensors), its tokenizer.json,
 * and trainer_state.safetensors (Adam's moments, the step and the training options). */
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
#include "text_io.h"
#include "train_lm.h"

static const char *CMD = "train";
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

typedef struct {
  const char *data, *tokenizer, *checkpoint, *resume;
  int json, log_steps, dense, vocab, context, batch, steps, epochs, stop_after, warmup, eval_every, eval_windows;
  int threads;
  float lr;
  uint64_t seed;
  moe_lm_config model;
  moe_optim_config optim;
  cli_progress progress;
} lm_opts;

static void usage(FILE *f) {
  fprintf(f,
    "usage: moe train --task lm [--data DIR] [--tokenizer F] [--vocab N] [--context T] [--batch B]\n"
    "       [--layers N] [--model D] [--heads NH] [--kv-heads NKV] [--experts E] [--top-k K] [--hidden H]\n"
    "       [--dense] [--aux-weight W] [--lr LR] [--weight-decay W] [--warmup S] [--steps S | --epochs N]\n"
    "       [--stop-after S] [--eval-every S] [--eval-windows N] [--seed S] [--threads N]\n"
    "       [--checkpoint DIR] [--resume DIR] [--json] [--log-steps] [--progress|--quiet]\n"
    "Trains a Mixtral-architecture decoder on DIR/train.txt (default data/brown: scripts/get-brown.sh),\n"
    "documents joined with <|endoftext|>. The tokenizer is --tokenizer's, or one of --vocab ids (default\n"
    "4096) learned from the training text. Defaults: context 64, batch 8, 2 layers, D 128, 4 heads,\n"
    "2 kv heads, 8 experts top-2 of H 256, lr 1e-3 (AdamW, weight decay 0.1, warm-up 5%% of the steps,\n"
    "cosine decay), 1000 steps. --epochs N: N passes' worth of tokens. --dense: the dense model of the\n"
    "same active size, one expert of H x K (the MoE's top-k experts' width). Every --eval-every steps\n"
    "(default 100) and at the end: the validation loss and perplexity over --eval-windows (default 64)\n"
    "fixed windows of DIR/valid.txt, and a checkpoint in DIR (a Hugging Face Mixtral directory with\n"
    "tokenizer.json and trainer_state.safetensors). --resume DIR continues from one (its model, its\n"
    "options: only --stop-after, --threads, --checkpoint, --data and the output flags may be given).\n"
    "--stop-after S ends this run after step S of the planned --steps. The last line is\n"
    "valid_loss=... valid_perplexity=... (a JSON line with --json, whose stdout is JSON lines only).\n");
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
}

/* Flags into o; *fixed gets the first flag that --resume takes from the checkpoint instead. */
static int parse(int argc, char **argv, lm_opts *o, const char **fixed) {
  moe_lm_config *c = &o->model;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "json")) { o->json = 1; continue; }
    if (cli_flag_is(f, "log_steps")) { o->log_steps = 1; continue; }
    if (cli_flag_is(f, "dense")) { o->dense = 1; *fixed = *fixed ? *fixed : f; continue; }
    if (cli_progress_flag(f, &o->progress)) continue;
    if (i + 1 >= argc) {
      usage(stderr);
      return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    }
    const char *v = argv[++i];
    int ok = 1, kept = 0;
    if (cli_flag_is(f, "task")) kept = 1; /* "lm": cmd_train dispatched on it */
    else if (cli_flag_is(f, "data")) o->data = v, kept = 1;
    else if (cli_flag_is(f, "checkpoint")) o->checkpoint = v, kept = 1;
    else if (cli_flag_is(f, "resume")) o->resume = v, kept = 1;
    else if (cli_flag_is(f, "stop_after")) ok = cli_parse_int(v, &o->stop_after) && o->stop_after > 0, kept = 1;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0, kept = 1;
    else if (cli_flag_is(f, "tokenizer")) o->tokenizer = v;
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
    else if (cli_flag_is(f, "steps")) ok = cli_parse_int(v, &o->steps) && o->steps > 0, o->epochs = 0;
    else if (cli_flag_is(f, "epochs")) ok = cli_parse_int(v, &o->epochs) && o->epochs > 0;
    else if (cli_flag_is(f, "eval_every")) ok = cli_parse_int(v, &o->eval_every) && o->eval_every > 0;
    else if (cli_flag_is(f, "eval_windows")) ok = cli_parse_int(v, &o->eval_windows) && o->eval_windows > 0;
    else if (cli_flag_is(f, "seed")) {
      char *end;
      errno = 0;
      o->seed = strtoull(v, &end, 10);
      ok = *v && *v != '-' && !*end && !errno;
    } else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
    if (!kept && !*fixed) *fixed = f;
  }
  return 0;
}

/* ---- trainer state: DIR/trainer_state.safetensors ---- */

static void state_path(char *buf, size_t n, const char *dir) { snprintf(buf, n, "%s/trainer_state.safetensors", dir); }

/* The options a resumed run keeps, "key=value;..." in the file's __metadata__["train"]. */
static void options_string(const lm_opts *o, char *buf, size_t n) {
  snprintf(buf, n, "context=%d;batch=%d;steps=%d;warmup=%d;lr=%.9g;weight_decay=%.9g;eval_every=%d;eval_windows=%d",
           o->context, o->batch, o->steps, o->warmup, (double)o->lr, (double)o->optim.weight_decay, o->eval_every,
           o->eval_windows);
}

static int options_parse(const char *s, lm_opts *o) {
  return s &&
         sscanf(s, "context=%d;batch=%d;steps=%d;warmup=%d;lr=%f;weight_decay=%f;eval_every=%d;eval_windows=%d",
                &o->context, &o->batch, &o->steps, &o->warmup, &o->lr, &o->optim.weight_decay, &o->eval_every,
                &o->eval_windows) == 8 &&
         o->context > 0 && o->batch > 0 && o->steps > 0 && o->warmup >= 0 && o->lr > 0 && o->eval_every > 0 &&
         o->eval_windows > 0 && o->optim.weight_decay >= 0;
}

/* The whole checkpoint: the model (HF directory), the tokenizer, then the trainer state, each file
 * written atomically; the state last, so a state on disk never runs ahead of the weights. */
static int save(const lm_opts *o, const moe_lm_t *m, const moe_tokenizer *t, const moe_optim_t *opt) {
  char path[4096], buf[32], opts[512];
  if (moe_lm_save(m, o->checkpoint) != MOE_OK) return cli_fail(CMD);
  snprintf(path, sizeof path, "%s/tokenizer.json", o->checkpoint);
  if (moe_tokenizer_save(t, path) != MOE_OK) return cli_fail(CMD);
  moe_st_writer *w;
  if (moe_st_writer_new(&w) != MOE_OK) return cli_fail(CMD);
  int64_t shape[1] = {(int64_t)opt->n};
  options_string(o, opts, sizeof opts);
  moe_status st = moe_st_writer_add_f32(w, "optim.m", MOE_DT_F32, 1, shape, opt->m);
  if (st == MOE_OK) st = moe_st_writer_add_f32(w, "optim.v", MOE_DT_F32, 1, shape, opt->v);
  snprintf(buf, sizeof buf, "%lld", (long long)opt->step);
  if (st == MOE_OK) st = moe_st_writer_meta(w, "step", buf);
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->seed);
  if (st == MOE_OK) st = moe_st_writer_meta(w, "seed", buf);
  if (st == MOE_OK) st = moe_st_writer_meta(w, "train", opts);
  state_path(path, sizeof path, o->checkpoint);
  if (st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  return st == MOE_OK ? 0 : cli_fail(CMD);
}

/* Adam's state, the step, the seed and the options from DIR's trainer state (opt sized already). */
static int load_state(const char *dir, lm_opts *o, moe_optim_t *opt) {
  char path[4096];
  state_path(path, sizeof path, dir);
  moe_st *f;
  if (moe_st_open(&f, path) != MOE_OK) return cli_fail(CMD);
  const char *step = moe_st_meta(f, "step"), *seed = moe_st_meta(f, "seed");
  long long s = -1;
  unsigned long long sd = 0;
  int rc = 0;
  if (!step || sscanf(step, "%lld", &s) != 1 || s < 0 || !seed || sscanf(seed, "%llu", &sd) != 1 ||
      !options_parse(moe_st_meta(f, "train"), o))
    rc = cli_usage_error(CMD, "%s: __metadata__ step, seed or train is missing or not valid", path);
  else if (moe_st_get_f32(f, "optim.m", opt->m, opt->n) != MOE_OK ||
           moe_st_get_f32(f, "optim.v", opt->v, opt->n) != MOE_OK)
    rc = cli_fail(CMD);
  moe_st_close(f);
  opt->step = s;
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

static int setup(lm_opts *o, const moe_tokenizer *t, moe_lm_t *m, moe_optim_t *opt) {
  moe_lm_config *c = &o->model;
  if (o->resume) {
    if (moe_lm_read_config(o->resume, c) != MOE_OK) return cli_fail(CMD);
    c->moe.threads = o->threads;
    if (moe_lm_load(m, o->resume, c) != MOE_OK) return cli_fail(CMD);
  } else {
    if (o->dense) c->moe.H *= c->moe.top_k, c->moe.E = c->moe.top_k = 1;
    if (c->moe.D % c->n_heads)
      return cli_usage_error(CMD, "--model %d is not a multiple of --heads %d", c->moe.D, c->n_heads);
    c->head_dim = c->moe.D / c->n_heads;
    c->max_seq = o->context;
    c->vocab = moe_tokenizer_vocab_size(t); /* fewer than --vocab when the text runs out of pairs */
    c->moe.threads = o->threads;
    if (moe_lm_init(m, c) != MOE_OK) return cli_fail(CMD);
    moe_lm_init_params(m, o->seed);
  }
  if (m->cfg.vocab != moe_tokenizer_vocab_size(t))
    return cli_usage_error(CMD, "the model has %d token ids, its tokenizer %d", m->cfg.vocab,
                           moe_tokenizer_vocab_size(t));
  if (moe_optim_init_n(opt, &o->optim, m->numel) != MOE_OK) return cli_fail(CMD);
  if (o->resume && load_state(o->resume, o, opt)) return 1; /* the schedule, the context: before they count */
  if (o->context > m->cfg.max_seq)
    return cli_usage_error(CMD, "context %d exceeds the model's max_position_embeddings %d", o->context,
                           m->cfg.max_seq);
  return 0;
}

/* ---- the loop ---- */

static uint64_t mix(uint64_t z) { /* splitmix64's finalizer */
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Step s's batch: row b is the window at a start drawn from (seed, s, b). */
static void fill(const lm_opts *o, const int32_t *ids, size_t n, int64_t s, int32_t *x, int32_t *y) {
  int T = o->context;
  for (int b = 0; b < o->batch; b++) {
    uint64_t r = mix(o->seed * 0x9e3779b97f4a7c15ULL + mix((uint64_t)s * (uint64_t)o->batch + (uint64_t)b));
    const int32_t *w = ids + r % (n - (size_t)T);
    memcpy(x + (size_t)b * T, w, (size_t)T * sizeof *x);
    memcpy(y + (size_t)b * T, w + 1, (size_t)T * sizeof *y);
  }
}

typedef struct {
  const int32_t *train, *valid;
  size_t ntrain, nvalid;
} lm_streams;

static int report(const lm_opts *o, moe_lm_t *m, const lm_streams *d, int64_t step, double loss, float lr,
                  double tok_s, double *valid) {
  if (lm_eval_loss(CMD, m, d->valid, d->nvalid, o->context, o->batch, o->eval_windows, valid)) return 1;
  if (o->json)
    printf("{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"valid_loss\": %.6f, \"valid_perplexity\": %.4f, "
           "\"tokens_per_s\": %.1f}\n", (long long)step, loss, (double)lr, *valid, exp(*valid), tok_s);
  else
    printf("step %lld/%d: loss %.4f lr %.3g valid_loss %.4f valid_perplexity %.2f %.0f tokens/s\n", (long long)step,
           o->steps, loss, (double)lr, *valid, exp(*valid), tok_s);
  fflush(stdout);
  return 0;
}

static int run(lm_opts *o, moe_lm_t *m, const moe_tokenizer *t, moe_optim_t *opt, const lm_streams *d) {
  int B = o->batch, T = o->context;
  int64_t last = o->stop_after && o->stop_after < o->steps ? o->stop_after : o->steps, step = opt->step;
  int32_t *x = malloc((size_t)B * T * sizeof *x), *y = malloc((size_t)B * T * sizeof *y);
  int rc = x && y ? 0 : cli_usage_error(CMD, "out of memory for a batch of %d x %d", B, T);
  double sum = 0, secs = 0, valid = NAN;
  int counted = 0;
  float lr = 0;
  cli_progress_start(&o->progress, 1, "steps", last);
  for (; !rc && step < last && !interrupted; step++) {
    double t0 = cli_now();
    fill(o, d->train, d->ntrain, step, x, y);
    moe_lm_stats st;
    moe_lm_zero_grad(m);
    lr = moe_lr_schedule(o->lr, step, o->warmup, o->steps);
    if (moe_lm_forward(m, x, y, B, T, &st) != MOE_OK || moe_lm_backward(m) != MOE_OK) {
      rc = cli_fail(CMD);
      break;
    }
    if (!isfinite(st.loss)) {
      rc = cli_usage_error(CMD, "step %lld: training diverged (loss %g); lower --lr", (long long)step + 1, st.loss);
      break;
    }
    moe_optim_step_refs(opt, m->refs, m->nrefs, lr);
    moe_lm_params_changed(m);
    secs += cli_now() - t0;
    sum += st.ce;
    counted++;
    if (o->log_steps) printf("{\"step\": %lld, \"loss\": %.9g}\n", (long long)step + 1, st.ce);
    char extra[64];
    snprintf(extra, sizeof extra, "loss %.4f", sum / counted);
    cli_progress_update(&o->progress, step + 1, NULL, extra);
    if ((step + 1) % o->eval_every && step + 1 != last) continue;
    cli_progress_break(&o->progress);
    rc = report(o, m, d, step + 1, sum / counted, lr, (double)B * T * counted / secs, &valid);
    if (!rc && o->checkpoint) rc = save(o, m, t, opt);
    sum = secs = 0;
    counted = 0;
  }
  cli_progress_break(&o->progress);
  free(x);
  free(y);
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

int cmd_train_lm(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  moe_dist *dist = NULL; /* expert parallelism for the language model is not there yet */
  if (moe_dist_init(&dist, &argc, &argv) != MOE_OK) return cli_fail(CMD);
  int ranks = moe_dist_size(dist);
  moe_dist_finalize(dist);
  if (ranks > 1) return cli_usage_error(CMD, "--task lm runs as one process, not under mpirun (%d ranks)", ranks);
  lm_opts o;
  defaults(&o);
  const char *fixed = NULL;
  int rc = parse(argc, argv, &o, &fixed);
  if (!rc && o.resume && fixed)
    rc = cli_usage_error(CMD, "--resume takes the model, tokenizer and schedule from %s; drop %s", o.resume, fixed);
  moe_tokenizer *t = NULL;
  moe_lm_t m = {0};
  moe_optim_t opt = {0};
  lm_streams d = {0};
  if (!rc) rc = get_tokenizer(&o, &t);
  if (!rc) rc = setup(&o, t, &m, &opt);
  if (!rc && o.resume && !o.checkpoint) { /* a resumed run goes on saving where it came from */
    o.checkpoint = o.resume;
    fprintf(stderr, "moe train: --resume without --checkpoint: saving to %s\n", o.resume);
  }
  if (!rc) rc = lm_stream_load(CMD, t, o.data, "train", o.context, (int32_t **)&d.train, &d.ntrain);
  if (!rc) rc = lm_stream_load(CMD, t, o.data, "valid", o.context, (int32_t **)&d.valid, &d.nvalid);
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
    rc = run(&o, &m, t, &opt, &d);
  }
  free((void *)d.train);
  free((void *)d.valid);
  moe_optim_free(&opt);
  if (m.st) moe_lm_free(&m);
  moe_tokenizer_free(t);
  return rc;
}
