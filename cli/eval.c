/* moe eval: the accuracy of a checkpoint on the test split; prints test_accuracy=0.xxxx. */
#include <stdio.h>

#include "cli.h"
#include "train_data.h"
#include "train_lm.h"

static const char *CMD = "eval";

static void usage(FILE *f) {
  fprintf(f, "usage: moe eval [--task classifier] --checkpoint F [--data DIR] [--threads N] [--batch B] [--json]\n"
             "Prints test_accuracy=0.xxxx ({\"test_accuracy\": 0.xxxx} with --json): the checkpoint's\n"
             "accuracy on the t10k IDX files of DIR (default data/mnist). moe eval --task lm --help: the\n"
             "language model's test perplexity.\n");
}

int cmd_eval(int argc, char **argv) {
  int lm = cli_task_is_lm(CMD, argc, argv);
  if (lm) return lm < 0 ? 1 : cmd_eval_lm(argc, argv);
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  const char *ck = NULL, *data = DEFAULT_DATA;
  int threads = 0, batch = 500, json = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_flag_is(argv[i], "json")) {
      json = 1;
      continue;
    }
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", argv[i]);
    const char *f = argv[i], *v = argv[++i];
    if (cli_flag_is(f, "task")) continue; /* classifier ("lm": cmd_eval_lm) */
    if (cli_flag_is(f, "checkpoint")) ck = v;
    else if (cli_flag_is(f, "data")) data = v;
    else if (cli_flag_is(f, "threads")) {
      if (!cli_parse_int(v, &threads) || threads < 0) return cli_usage_error(CMD, "--threads: bad value '%s'", v);
    } else if (cli_flag_is(f, "batch")) {
      if (!cli_parse_int(v, &batch) || batch <= 0) return cli_usage_error(CMD, "--batch: bad value '%s'", v);
    } else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
  }
  if (!ck) return cli_usage_error(CMD, "--checkpoint is required");
  moe_model_t m;
  moe_dataset test = {0};
  if (moe_checkpoint_load(ck, &m, NULL, NULL) != MOE_OK) return cli_fail(CMD);
  moe_model_set_threads(&m, threads);
  int rc = 0;
  double acc;
  if (load_split(data, "t10k", &test) != MOE_OK) rc = cli_fail(CMD);
  else if (test.rows * test.cols != m.cfg.in_dim)
    rc = cli_usage_error(CMD, "%s: the model takes %d features, the data has %d", ck, m.cfg.in_dim, test.rows * test.cols);
  else if (moe_model_accuracy(&m, &test, batch, &acc) != MOE_OK) rc = cli_fail(CMD);
  else printf(json ? "{\"test_accuracy\": %.4f}\n" : "test_accuracy=%.4f\n", acc);
  moe_dataset_free(&test);
  moe_model_free(&m);
  return rc;
}
