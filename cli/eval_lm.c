/* moe eval --task lm: a language model checkpoint's loss and perplexity on a split of a text
 * directory (every non-overlapping window of the model's context), through the checkpoint's tokenizer,
 * or on a file of token ids (another implementation's tokenization, to compare losses).
 * Under mpirun the experts are spread over the ranks (each reads its own from the checkpoint), every
 * rank runs the same windows and rank 0 prints. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lm_budget.h"
#include "lm_data.h"
#include "rank_errors.h"
#include "train_lm.h"

static const char *CMD = "eval";

static void usage(FILE *f) {
  fprintf(f, "usage: moe eval --task lm --checkpoint DIR [--data DIR] [--split test|valid|train] [--context T]\n"
             "                [--batch B] [--threads N] [--json] [--tokens FILE]\n"
             "                [--memory-budget SIZE [--policy P] [--prefetch auto|on|off] [--page-cache keep|drop]\n"
             "                 [--placement equal|miss-cost --placement-trace T.csv] [--pin-from T.csv [--pin N]]]\n"
             "Prints test_loss=... test_perplexity=... (valid_... for --split valid; a JSON line with --json):\n"
             "the mean cross-entropy of the checkpoint (a Hugging Face directory of Mixtral, Qwen2/3-MoE or OLMoE\n"
             "with tokenizer.json) over every non-overlapping window of T tokens (default the model's context)\n"
             "of DIR/<split>.txt (default data/brown, test), and its exponential. --tokens FILE: the token ids of\n"
             "FILE instead (decimal, separated by spaces, commas or newlines; no tokenizer needed), split \"tokens\".\n"
             LM_BUDGET_USAGE "With --json, \"experts\": the caches' stats over the windows (as moe generate's).\n");
}

/* The token ids of a text file (decimal, separated by spaces, commas or newlines), each in [0, vocab). */
static int read_ids(const char *path, int vocab, int32_t **ids, size_t *n) {
  FILE *f = fopen(path, "r");
  if (!f) return cli_usage_error(CMD, "--tokens: cannot read '%s'", path);
  size_t cap = 4096;
  *ids = malloc(cap * sizeof **ids);
  *n = 0;
  int rc = *ids ? 0 : cli_usage_error(CMD, "--tokens: out of memory");
  for (long v; !rc;) {
    int c;
    while ((c = fgetc(f)) == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t') {}
    if (c == EOF) break;
    ungetc(c, f);
    if (fscanf(f, "%ld", &v) != 1 || v < 0 || v >= vocab) {
      rc = cli_usage_error(CMD, "%s: token %zu is not a token id in [0, %d)", path, *n, vocab);
      break;
    }
    if (*n == cap) {
      int32_t *p = realloc(*ids, 2 * cap * sizeof *p);
      if (!p) rc = cli_usage_error(CMD, "--tokens: out of memory");
      else *ids = p, cap *= 2;
    }
    if (!rc) (*ids)[(*n)++] = (int32_t)v;
  }
  fclose(f);
  return rc;
}

static int eval(int argc, char **argv, moe_dist *dist) {
  const char *ck = NULL, *data = "data/brown", *split = "test", *tokens = NULL;
  int threads = 0, batch = 8, json = 0, context = 0;
  lm_budget_opts bo;
  lm_budget_defaults(&bo);
  for (int i = 1; i < argc; i++) {
    if (cli_flag_is(argv[i], "json")) {
      json = 1;
      continue;
    }
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", argv[i]);
    const char *f = argv[i], *v = argv[++i];
    int ok = 1;
    if (cli_flag_is(f, "task")) continue;
    else if (lm_budget_flag(f, v, &bo, &ok)) {
    }
    else if (cli_flag_is(f, "checkpoint")) ck = v;
    else if (cli_flag_is(f, "data")) data = v;
    else if (cli_flag_is(f, "split"))
      ok = !strcmp(v, "test") || !strcmp(v, "valid") || !strcmp(v, "train"), split = v;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &threads) && threads >= 0;
    else if (cli_flag_is(f, "batch")) ok = cli_parse_int(v, &batch) && batch > 0;
    else if (cli_flag_is(f, "context")) ok = cli_parse_int(v, &context) && context > 0;
    else if (cli_flag_is(f, "tokens")) tokens = v, split = "tokens";
    else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  if (!ck) return cli_usage_error(CMD, "--checkpoint is required");
  if (lm_budget_misuse(&bo)) return cli_usage_error(CMD, "%s", lm_budget_misuse(&bo));
  char path[4096];
  lm_tokenizer_path(ck, path, sizeof path);
  moe_tokenizer *t = NULL;
  moe_lm_config c;
  moe_lm_t m = {0};
  if ((!tokens && moe_tokenizer_load(&t, path) != MOE_OK) || moe_lm_read_config(ck, &c) != MOE_OK) {
    moe_tokenizer_free(t);
    return cli_fail(CMD);
  }
  c.moe.threads = threads;
  c.moe.dist = dist;
  moe_lm_experts x;
  int rc = cli_settle(dist, CMD, lm_budget_load(&m, ck, &c, &bo, &x) != MOE_OK ? cli_fail(CMD) : 0);
  if (!context) context = c.max_seq;
  if (!rc && context > c.max_seq)
    rc = cli_usage_error(CMD, "--context %d exceeds the model's max_position_embeddings %d", context, c.max_seq);
  if (!rc && t && moe_tokenizer_vocab_size(t) != c.vocab)
    rc = cli_usage_error(CMD, "%s has %d token ids, the model %d", path, moe_tokenizer_vocab_size(t), c.vocab);
  int32_t *ids = NULL;
  size_t n = 0;
  double loss = 0;
  if (!rc) rc = tokens ? read_ids(tokens, c.vocab, &ids, &n) : lm_stream_load(CMD, t, data, split, context, &ids, &n);
  if (!rc && tokens && n < (size_t)context + 1)
    rc = cli_usage_error(CMD, "%s: %zu tokens, fewer than one window of --context %d + 1", tokens, n, context);
  if (!rc && moe_lm_eval_windows(&m, ids, n, context, batch, 0, &loss) != MOE_OK) /* the same windows, every rank */
    rc = cli_fail(CMD);
  cJSON *experts = !rc && json ? lm_budget_json(&x, &bo, (int64_t)(n - 1) / context * context) : NULL;
  char *ej = experts ? cJSON_PrintUnformatted(experts) : NULL;
  if (!rc && json)
    printf("{\"%s_loss\": %.6f, \"%s_perplexity\": %.4f, \"tokens\": %zu%s%s}\n", split, loss, split, exp(loss), n,
           ej ? ", \"experts\": " : "", ej ? ej : "");
  else if (!rc) printf("%s_loss=%.6f %s_perplexity=%.4f\n", split, loss, split, exp(loss));
  free(ids);
  cJSON_Delete(experts);
  free(ej);
  if (m.st) moe_lm_free(&m);
  moe_lm_experts_free(&x);
  moe_tokenizer_free(t);
  return rc;
}

int cmd_eval_lm(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  moe_dist *dist;
  int rc = lm_dist_start(CMD, &dist, &argc, &argv);
  if (!rc) rc = eval(argc, argv, dist);
  return cli_dist_end(dist, CMD, rc); /* a failure not settled stops every rank: some may be in a collective */
}
